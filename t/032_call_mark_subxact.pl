# A pgqueue call that fails
# inside a subtransaction (a PL/pgSQL EXCEPTION block, a SAVEPOINT) leaves
# its call mark set until the top-level transaction ends.
#
# shmem.c counts calls in call_depth and clears the mark when it drops to
# 0 (pgq_call_end) or at the end of the top-level transaction
# (pgq_calls_at_xact_end); nothing resets it when a subtransaction aborts.
# A worker loop in PL/pgSQL that catches a call's error (here a
# lock_timeout while a session holds a lock on the current slot) keeps its
# mark for the rest of its statement, and every call it makes after that
# nests under the stale depth.  The scheduler then waits, for every slot
# drained meanwhile, until that statement's transaction ends (the mark is
# the same all along) instead of the end of the calls under way at the
# drain: no slot is truncated while a long worker function runs, the ring
# grows and then stops turning.  The control part runs the same function
# without the error: the slot is truncated while it sleeps.
#
# Now a call ended by an error inside a subtransaction is over when the
# subtransaction rolls back (shmem.c, pgq_calls_at_subxact_abort).
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

my $node = ring_node('call_mark_subxact');
sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('fill', paused => true)});
q1(q{SELECT pgq_configure('vq', paused => true)});

sub attack
{
	my $mode = shift;
	my $x = $node->background_psql('postgres');
	my $wcur = current_slot($node, 'work_queue');
	$x->query_safe('BEGIN');
	$x->query_safe("LOCK TABLE pgqueue.work_queue_$wcur IN ACCESS EXCLUSIVE MODE") if $mode eq 'error';

	# the worker's statement: a call (an ack with a key that holds nothing)
	# that fails on lock_timeout when the current slot is locked, caught;
	# then the worker goes on (a sleep here)
	my $v = $node->background_psql('postgres', on_error_stop => 0);
	start_blocked_sql($v, q{DO $$ BEGIN
  SET LOCAL lock_timeout = '200ms';
  BEGIN PERFORM pgq_ack(gen_random_uuid(), 'nobody');
  EXCEPTION WHEN lock_not_available THEN RAISE NOTICE 'caught: %', SQLERRM; END;
  PERFORM pg_sleep(40);
END $$;});
	usleep(1_500_000);
	$x->query_safe('ROLLBACK');
	$x->quit;

	# slot Q current after the worker's statement began, one job in it,
	# replaced, emptied
	my (undef, $s) = turn_queue_ring($node, 'fill');
	q1(q{SELECT pgq_push('vq', '{}')});
	turn_queue_ring($node, 'fill');
	q1(q{SELECT pgq_purge('fill', 'pending')});
	q1(q{SELECT pgq_purge('vq', 'pending')});
	ok(poll_bounded($node, "SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $s", 15),
		"$mode: slot $s drained while the worker's statement runs");
	ok(poll_bounded($node, "SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $s", 15),
		"$mode: slot $s truncated: no call of the worker is under way");
	wait_output($v, qr/^done$/m, 40);
	note("$mode: worker: $v->{stderr}");
	$v->quit;
}

attack('control');
attack('error');

$node->stop;
done_testing();
