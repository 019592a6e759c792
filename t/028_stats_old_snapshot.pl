# A read of the slots under the
# statement's snapshot, taken before the read locks them, in a backend
# whose PGPROC xmin is older than the slot (ring.c, "Why no snapshot sees
# rows vanish").
#
# pgq_stats() reads queue and work_queue through read-only SPI, which runs
# with the statement's active snapshot: that snapshot is taken when the
# statement starts, and pgq_stats locks the slots (planning its query) only
# when it runs.  It makes no call mark (only pgq_write_begin does).  The
# rule at the top of ring.c says "a statement of its own that reads the
# slot took its locks on it before its snapshot": not so for a query run
# with a snapshot taken earlier (read-only SPI: pgq_stats, and every
# STABLE function of a user that reads pgqueue.jobs).
#
# The victim is a READ COMMITTED transaction with a cursor open (its xmin
# precedes slot Q's made_xmin), as in t/023.  Its statement takes its
# snapshot S while job J is pending in slot Q; J's row is then moved to
# slot 0 (straggler move), Q drains and is truncated without waiting for
# the victim (older xmin, no call mark), and pgq_stats, running with S,
# finds J neither in Q (truncated) nor in slot 0 (the moved version is
# newer than S): J, pending all along, is counted 0 times.  Without the
# cursor the truncation waits for the statement (the control part).
#
# pgq_stats now takes a snapshot of its own after its plan locked the
# slots (non-read-only SPI): J is counted in both parts.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = ring_node('stats_old_xmin');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('fill', paused => true)});

sub attack
{
	my ($mode, $vq) = @_;
	q1(qq{SELECT pgq_configure('$vq', paused => true)});
	my $v = $node->background_psql('postgres');
	if ($mode eq 'cursor')
	{
		$v->query_safe('BEGIN');
		$v->query_safe('DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 10) g');
		$v->query_safe('FETCH 1 FROM c');
	}

	# slot Q current; J pushed into it (its queue paused: J stays pending)
	my (undef, $qslot) = turn_queue_ring($node, 'fill');
	my $j = q1(qq{SELECT pgq_push('$vq', '{"job": "J"}')});
	is(row_slot($node, 'queue', $j), $qslot, "$mode: J pushed into slot $qslot of queue");
	# Q replaced; its other rows purged: J is its only row
	turn_queue_ring($node, 'fill');
	q1(q{SELECT pgq_purge('fill', 'pending')});

	# the victim's statement: its snapshot now, pgq_stats 25 s later
	start_blocked_sql($v, qq{SELECT 'pending', t.pending FROM (SELECT 1 AS z FROM pg_sleep(25) OFFSET 0) s,
  LATERAL (SELECT x.pending FROM pgq_stats() x WHERE s.z = 1 AND x.queue = '$vq' OFFSET 0) t;});
	usleep(500_000);

	my $freed = poll_bounded($node,
		"SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $qslot", 22);
	note("$mode: slot $qslot truncated before pgq_stats ran: " . ($freed ? 'yes' : 'no')
		  . "; J now in slot " . row_slot($node, 'queue', $j));
	my $out = wait_output($v, qr/^done$/m, 30) // $v->{stdout};
	note("$mode: $out / $v->{stderr}");
	like($out, qr/^pending\|1$/m,
		"$mode: pgq_stats, whose snapshot sees J pending, counts it (J was pending throughout)");
	$v->query_safe('ROLLBACK') if $mode eq 'cursor';
	$v->quit;
}

attack('control', 'v0');
attack('cursor', 'v1');

$node->stop;
done_testing();
