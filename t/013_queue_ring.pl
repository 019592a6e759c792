# The ring of pgqueue.queue's slots (src/ring.c), turned by the scheduler as
# work_queue's is, with slot 0 as its cold slot:
#
# - pushes go to the current slot, a new one at pgqueue.slot_size; the
#   scheduling pass takes jobs across slots in the order of DESIGN.md
#   (priority, due time, id), and slots are truncated once their jobs are
#   finished;
# - while a REPEATABLE READ transaction holds its snapshot (and VACUUM
#   back), the job rows' dead versions stay bounded (pgstattuple), and the
#   holder still sees what it saw;
# - jobs that stay (due later, a dead letter, a lease of an hour) are moved
#   to slot 0 and keep working there: scheduled when due, retried, acked;
# - jobs with a dedup_key live in slot 0, and dedup holds across turns.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('queue_ring');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub drain { return drain_queue($node, $_[0]); }

sub push_jobs
{
	my ($q, $from, $n, $prio) = @_;
	$prio //= 0;
	q1(qq{SELECT count(*) FROM pgq_push_batch('$q', ARRAY(SELECT jsonb_build_object('n', g)
	      FROM generate_series($from, $from + $n - 1) g), priority => $prio)});
}

sub wait_scheduled
{
	my ($q) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = '$q' AND state IN ('pending', 'retry')");
}

sub slot_states
{
	return q1(q{SELECT string_agg(slot || ':' || state, ' ' ORDER BY slot)
	             FROM pgqueue.slots WHERE tbl = 'queue'});
}

# --- turning, and the order across slots ----------------------------------------
# Queue 'a' is paused: its jobs stay pending while the ring turns under them.
q1(q{SELECT pgq_configure('a', paused => true)});
for my $b (0 .. 9)
{
	push_jobs('a', 1 + $b * 100, 100, 0);
	push_jobs('a', 5001 + $b * 100, 100, 5);
	# time for the scheduler to make a new slot current when this one is full
	q1('SELECT pg_sleep(0.2)');
}
my $jobs = q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'a'});
is($jobs, '2000', '2,000 jobs of a paused queue pending');
cmp_ok(q1(q{SELECT count(DISTINCT tableoid) FROM pgqueue.queue WHERE queue = 'a'}),
	'>', 1, 'they are in more than one slot of queue: ' . slot_states());
q1(q{SELECT pgq_configure('a', paused => false)});
ok(wait_scheduled('a'), 'all scheduled once the queue is resumed');
my @order = drain('a');
is(scalar(@order), 2000, 'every job claimed and acked');
is_deeply(\@order, [ (5001 .. 6000), (1 .. 1000) ],
	'priority 5 first, then priority 0, each in push order, across slots');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 0 FROM pgqueue.slots
 WHERE tbl = 'queue' AND slot > 0 AND state IN ('live', 'drained')}),
	'every slot of queue but the current one and slot 0 truncated: ' . slot_states());

# the ring keeps two free slots and drops the others, so that a reader of
# the parent, which locks every slot that exists, pins few
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) <= 2 FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'}),
	'free slots beyond two dropped: ' . slot_states());
is( q1(q{
SELECT (SELECT count(*) FROM pg_partition_tree('pgqueue.queue') WHERE isleaf)
     = (SELECT count(*) FROM pgqueue.slots WHERE tbl = 'queue')}),
	't', 'each slot left has its table and its row');

# --- a snapshot held across turns -------------------------------------------------
push_jobs('h', 1, 200);
ok(wait_scheduled('h'), '200 jobs of h scheduled');
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $seen = $holder->query_safe('SELECT count(*) FROM pgqueue.queue');
cmp_ok(q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.queue') WHERE isleaf}),
	'<=', 6, 'the holder read (and pinned) few slots: ' . slot_states());
my $done = 0;
for my $round (1 .. 6)
{
	# in batches of 200: a push's transaction writes one slot, however many
	push_jobs('b', 1 + $_ * 200, 200) for 0 .. 9;
	wait_scheduled('b');
	$done += scalar(drain('b'));
}
is($done, 12000, '12,000 jobs went through while the snapshot was held');
# without the ring their 24,000 dead job row versions would all stay; the
# slots the holder read stay (it locked them), the others are truncated
my $dead_sql = q{
SELECT sum(t.dead_tuple_count) FROM pg_partition_tree('pgqueue.queue') p,
  LATERAL pgstattuple(p.relid) t WHERE p.isleaf};
ok($node->poll_query_until('postgres', "SELECT ($dead_sql) < 6000"),
	'dead row versions in queue bounded: ' . q1($dead_sql) . ' (' . slot_states() . ')');
is($holder->query_safe('SELECT count(*) FROM pgqueue.queue'),
	$seen, 'the holder still sees what it saw');
$holder->query_safe('COMMIT');
$holder->quit;
drain('h');

# --- jobs that stay: moved to slot 0 ----------------------------------------------
q1(q{SELECT pgq_configure('dl', max_tries => 1)});
q1(q{SELECT pgq_push('later', jsonb_build_object('n', g), run_after => now() + interval '25 seconds')
       FROM generate_series(1, 20) g});
q1(q{SELECT pgq_push('dl', '{"n": 1}')});
q1(q{SELECT pgq_push('long', '{"n": 1}')});
my $dedup = q1(q{SELECT pgq_push('d', '{"n": 1}', dedup_key => 'x')});
is(q1(qq{SELECT tableoid::regclass FROM pgqueue.queue WHERE id = '$dedup'}),
	'pgqueue.queue_0', 'a job with a dedup_key goes to slot 0');
ok(wait_scheduled('dl') && wait_scheduled('long'), 'dl and long scheduled');
is( q1(q{SELECT pgq_nack(id, 'w', 'boom') FROM pgq_claim('w', 1, '1 minute', ARRAY['dl'])}),
	'failed', 'the dl job is a dead letter');
is(q1(q{SELECT count(*) FROM pgq_claim('holder', 1, '1 hour', ARRAY['long'])}),
	'1', 'the long job held for an hour');
my $stay = q1(q{SELECT string_agg(DISTINCT slot::text, ',')
                   FROM pgqueue.queue WHERE queue IN ('later', 'dl', 'long')});
unlike($stay, qr/\b0\b/, "they are in slot(s) $stay, not slot 0");
my $stay_oids = slot_oids($node, 'queue', split(/,/, $stay));
my $stay_files = slot_files($node, $stay_oids);
my $started = time;
while (time - $started < 13)
{
	push_jobs('e', 1, 500);
	wait_scheduled('e');
	drain('e');
}
ok(wait_slots_free($node, 'queue', $stay_oids, $stay_files),
	"slot(s) $stay emptied and truncated (or dropped): " . slot_states());
is( q1(q{SELECT count(*) FROM pgqueue.queue_0 WHERE queue IN ('later', 'dl', 'long')}),
	'22', 'the jobs that stayed are in slot 0');
cmp_ok(q1(q{SELECT count(*) FROM pgqueue.slots WHERE tbl = 'queue' AND state <> 'free'}),
	'<=', 4, 'and the ring did not grow with them');
is( q1(q{SELECT pgq_ack(id, 'holder') FROM pgqueue.work_queue WHERE lock_key = 'holder'}),
	't', 'the held job is acked by its holder, its job row in slot 0');
is(q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'long'}), '0', 'both its rows gone');
is(q1(q{SELECT pgq_retry_failed('dl')}), '1', 'the dead letter retried');
ok(wait_scheduled('dl'), 'and scheduled from slot 0');
is(scalar(drain('dl')), 1, 'and claimed');
is( q1(q{SELECT pgq_push('d', '{"n": 2}', dedup_key => 'x')}),
	$dedup, 'dedup still finds the job of the same key after the turns');
ok(wait_scheduled('later'), 'the jobs due later are scheduled from slot 0 when due');
is(scalar(drain('later')), 20, 'and claimed');

# --- a reader that pins the 32 slots of a backlog --------------------------------
# The ring grows to 32 slots with a backlog; a transaction that reads the parent
# then locks them all.  As the backlog drains they cannot be reused, and the
# ring makes slots past 32 (up to 64) so as to go on turning; once the reader
# ends, the free slots beyond two are dropped.
q1(q{SELECT pgq_configure('big', paused => true)});
my $batches = 0;
while ($batches < 400
	&& q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.queue') WHERE isleaf}) < 32)
{
	push_jobs('big', 1 + $batches * 200, 200);
	$batches++;
	q1('SELECT pg_sleep(0.05)');
}
is(q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.queue') WHERE isleaf}),
	'32', "a backlog of $batches batches of 200 jobs took the ring to 32 slots");
my $pinner = $node->background_psql('postgres');
$pinner->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $big = $pinner->query_safe(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'big'});
is($big, $batches * 200, 'a reader read them all (and locked the 32 slots)');
q1(q{SELECT pgq_configure('big', paused => false)});
ok(wait_scheduled('big'), 'the backlog scheduled');
is(scalar(drain('big')), $big, 'and drained');
for my $round (1 .. 4)
{
	push_jobs('b', 1 + $_ * 200, 200) for 0 .. 9;
	wait_scheduled('b');
	drain('b');
}
cmp_ok(q1(q{SELECT max(slot) FROM pgqueue.slots WHERE tbl = 'queue'}),
	'>=', 32, 'the ring made slots past 32 while the reader pinned them: ' . slot_states());
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) > 0 FROM pgqueue.slots WHERE tbl = 'queue' AND slot >= 32 AND state = 'free'}),
	'and truncated some of them during the hold');
$pinner->query_safe('COMMIT');
$pinner->quit;
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) <= 5 FROM pg_partition_tree('pgqueue.queue') WHERE isleaf}),
	'once it ended, the slots were truncated and all but a few dropped: ' . slot_states());
push_jobs('after', 1, 500);
ok(wait_scheduled('after'), 'jobs pushed after are scheduled');
is(scalar(drain('after')), 500, 'and claimed');

$node->stop;
my $log = slurp_file($node->logfile);
unlike($log, qr/could not (turn the ring|move the rows|drop the free slots)/, 'no upkeep step of the rings failed');
done_testing();
