# An ack under a valid lease
# answers false when the straggler move took its work row into the slot
# that the same upkeep transaction made current.
#
# ring.c's rule: "a turn has sent its invalidations before a pass writes
# the slot it made current".  But pgq_ring_maintain runs the turn of
# work_queue's ring and the straggler moves (ring_move) in one short
# transaction: the moves UPDATE the rows left in old slots into the
# current slot as ring_load sees it, which is the one this transaction
# just made current.  Between that transaction's commit becoming visible
# (ProcArrayEndTransaction) and the sending of its invalidations
# (AtEOXact_Inval), a call reads no invalidation and keeps its view, which
# lacks the new slot, while its snapshot sees the move: the row is in
# neither the old slot (deleted) nor any slot of the view; the refresh
# (pgq_write_refresh_views) reads no invalidation either, and pgq_ack
# returns false for a job its caller holds under a lease of an hour (the
# worker takes the lease for lost; the job runs again when it expires).
# The same holds for pgq_extend (NULL) and pgq_nack.
#
# The window is microseconds wide at every turn that comes with a move;
# gdb widens it (as t/025): the scheduler is stopped while the test sets
# the scene, then held 8 s at AtEOXact_Inval of the transaction that
# turned work_queue's ring.  Skipped without gdb.
#
# Now the moves run in a transaction after the turns' (worker.c,
# ring.c's ring_move_plan): the ack answers true.
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

plan skip_all => 'gdb not found' unless `which gdb 2>/dev/null` =~ /gdb/;

my $node = ring_node('move_into_new_slot');
sub q1 { return $node->safe_psql('postgres', $_[0]); }

turn_work_ring($node, 'fw');

# J and 101 other jobs leased to wk (an hour) in work slot S: more than a
# straggler move takes (100)
q1(q{SELECT count(*) FROM pgq_push_batch('lq', ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 102)))});
ok(poll_bounded($node, "SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = 'lq' AND state = 'pending'", 10),
	'102 jobs scheduled');
my @ids = split /\n/, q1(q{SELECT id FROM pgq_claim('wk', 102, '1 hour', ARRAY['lq'])});
is(scalar(@ids), 102, '102 jobs leased to wk for an hour');
my $j = $ids[0];
my $s = row_slot($node, 'work_queue', $j);
turn_work_ring($node, 'fw');
isnt(current_slot($node, 'work_queue'), $s, "slot $s replaced");
sleep 11;    # S out of use for more than 10 s

# gdb stops the scheduler until the go file exists, then holds the commit
# of the transaction that makes a new slot of work_queue current
my $go = $node->basedir . '/go';
my $spid = scheduler_pid($node, 'postgres');
my $cmds = $node->basedir . '/gdbcmds';
open(my $fh, '>', $cmds) or die;
print $fh qq{set pagination off
handle SIGUSR1 SIGUSR2 SIGURG SIGHUP SIGINT SIGALRM SIGPIPE SIGTERM nostop noprint pass
shell while [ ! -f $go ]; do sleep 0.1; done
break set_state if *(char *)\$rdi == 'w' && (char)\$rdx == 'c'
commands 1
  silent
  delete 1
  tbreak AtEOXact_Inval
  commands
    silent
    printf "held\\n"
    shell sleep 8
    detach
    quit
  end
  continue
end
continue
};
close $fh;
my ($gout, $gerr) = ('', '');
my $gdb = IPC::Run::start([ 'gdb', '-q', '-batch', '-p', $spid, '-x', $cmds ],
	'>', \$gout, '2>', \$gerr);
sleep 3;

# while it is stopped: S down to 100 rows (J among them), the current slot
# of work_queue filled by hand
my $k = 1;
while (q1("SELECT count(*) FROM pgqueue.work_queue_$s") > 100)
{
	q1("SELECT pgq_ack('$ids[$k]', 'wk')");
	$k++;
}
my $cur = current_slot($node, 'work_queue');
for my $i (1 .. 80)
{
	last if q1("SELECT pg_relation_size('pgqueue.work_queue_$cur') >= 65536") eq 't';
	q1(q{SELECT count(*) FROM pgq_push_batch('fill', ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 100)))});
	q1(q{SELECT pgq_schedule(1000)});
}
is(q1("SELECT pg_relation_size('pgqueue.work_queue_$cur') >= 65536"), 't', "current slot $cur full");

# the worker's backend, its view of the slots read
my $w = $node->background_psql('postgres');
ok($w->query_safe(qq{SELECT pgq_extend('$j', 'wk', '1 hour') IS NOT NULL}) eq 't', 'J held by wk');

# go: the scheduler turns the ring and moves S's rows into the new slot
open(my $gf, '>', $go) or die;
close $gf;
ok(poll_bounded($node,
		"SELECT coalesce((SELECT slot FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'), 0) <> $cur", 10),
	'the turn is visible (the scheduler held before its invalidation)');
my $ack = $w->query_safe(qq{SELECT pgq_ack('$j', 'wk')});
$gdb->finish;
like($gout, qr/held/, 'the scheduler was held in the window');
note("J's work row: " . q1(qq{SELECT slot || ' ' || lock_key FROM pgqueue.work_queue WHERE id = '$j'}));
is($ack, 't', 'pgq_ack of J, leased to wk for an hour, answers true');

$w->quit;
$node->stop;
done_testing();
