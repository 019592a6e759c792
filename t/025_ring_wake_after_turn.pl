# The window between the scheduler's commit being visible
# (ProcArrayEndTransaction, then the commit callbacks) and the sending of
# its invalidations (AtEOXact_Inval, later in CommitTransaction).
#
# The scheduler turned work_queue's ring (a new current slot) and
# scheduled jobs into the new slot in one transaction.  Its commit callback
# (publish.c) woke the waiting claims before CommitTransaction sent the
# relcache invalidation of pgqueue.work_queue: a woken claim that looked in
# between read no invalidation, used its cached view, which lacked the new
# slot, while its new snapshot already saw the rows there: it found
# nothing and slept again until its wait ran out, the job claimable all
# along.  Now the turns commit in a transaction of their own before the
# pass (worker.c), and a call reads the invalidations again after each new
# snapshot (tables.c): a claim woken by the pass finds the job.
#
# The window is a few microseconds wide; the test widens it with gdb (a
# breakpoint on AtEOXact_Inval of the scheduler's commit that holds it for
# 3 s).  Skipped without gdb.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

plan skip_all => 'gdb not found' unless `which gdb 2>/dev/null` =~ /gdb/;

my $node = ring_node('inval_window');
sub q1 { return $node->safe_psql('postgres', $_[0]); }

turn_work_ring($node, 'fw');

# the scheduler off: the rings stay as they are until it is on again
q1(q{ALTER SYSTEM SET pgqueue.enabled = off});
q1(q{SELECT pg_reload_conf()});
sleep 1;

# fill the current slot of work_queue to pgqueue.slot_size with rows of
# queue 'fill' that no one claims (scheduled by hand)
my $cur = current_slot($node, 'work_queue');
for my $i (1 .. 60)
{
	last if q1("SELECT pg_relation_size('pgqueue.work_queue_$cur') >= 65536") eq 't';
	q1(q{SELECT count(*) FROM pgq_push_batch('fill', ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 100)))});
	q1(q{SELECT pgq_schedule(1000)});
}
is(q1("SELECT pg_relation_size('pgqueue.work_queue_$cur') >= 65536"), 't',
	"current slot $cur of work_queue is full");

# a claim of queue x waits (20 s)
my $w = $node->background_psql('postgres');
my $wpid = $w->query_safe('SELECT pg_backend_pid()');
start_blocked_sql($w, q{SELECT 'got', id FROM pgq_claim('wx', 1, '1 minute', ARRAY['x'], '20 seconds');});
ok( poll_bounded($node,
		"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $wpid", 10),
	'the claim of x waits');
my $x = q1(q{SELECT pgq_push('x', '{}')});

# gdb holds the scheduler's next commit between its callbacks and its
# invalidations for 3 s
my $spid = scheduler_pid($node, 'postgres');
my $cmds = $node->basedir . '/gdbcmds';
open(my $fh, '>', $cmds) or die;
print $fh q{set pagination off
handle SIGUSR1 SIGUSR2 SIGURG SIGHUP SIGINT SIGALRM SIGPIPE SIGTERM nostop noprint pass
break AtEOXact_Inval if $rdi == 1
commands 1
  silent
  printf "held\n"
  shell sleep 3
  delete 1
  detach
  quit
end
continue
};
close $fh;
my ($gout, $gerr) = ('', '');
my $gdb = IPC::Run::start([ 'gdb', '-q', '-batch', '-p', $spid, '-x', $cmds ],
	'>', \$gout, '2>', \$gerr);
sleep 2;

# on again: its first pass turns the ring and schedules x into the new slot
my $t0 = time;
q1(q{ALTER SYSTEM SET pgqueue.enabled = on});
q1(q{SELECT pg_reload_conf()});
ok(poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$x'", 10),
	'x scheduled');
my $t_sched = time;
isnt(current_slot($node, 'work_queue'), $cur, 'the ring of work_queue turned');
$gdb->finish;
like($gout, qr/held/, 'the scheduler was held in the window');

# the waiting claim must get x now, not when its 20 s run out
my $out = wait_output($w, qr/^done$/m, 25) // $w->{stdout};
my $late = time - $t_sched;
like($out, qr/^got\|\Q$x\E$/m, 'the waiting claim got x');
cmp_ok($late, '<', 5, sprintf('it got x %.1f s after x was scheduled (and the scheduler let go)', $late));

$w->quit;
$node->stop;
done_testing();
