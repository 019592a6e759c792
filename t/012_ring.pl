# The ring of pgqueue.work_queue's slots (src/ring.c), turned by the
# scheduler:
#
# - a new current slot when the current one reaches pgqueue.slot_size,
#   claims in scheduling order across slots, acks that find their rows in
#   any slot, and slots truncated once their rows are gone;
# - while a REPEATABLE READ transaction holds its snapshot (and VACUUM
#   back), the slots made and emptied meanwhile are truncated all the same:
#   the dead row versions stay bounded (pgstattuple), and the holder still
#   sees what it saw;
# - a slot whose rows a snapshot taken after it became current could see
#   is not truncated until that transaction ends, and that snapshot still
#   reads its rows;
# - the few rows left in an old slot (a queue no one claims, a long lease)
#   are moved to the current slot, and the ring does not grow with them;
# - an emptied slot's statistics count no live or dead rows, even those a
#   backend flushed after its TRUNCATE.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('ring');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Push $n jobs to queue $q numbered from $from, and wait until the
# scheduler has moved them all to work_queue.
sub push_scheduled
{
	my ($q, $from, $n) = @_;
	q1(qq{SELECT pgq_push_batch('$q', ARRAY(SELECT jsonb_build_object('n', g)
	      FROM generate_series($from, $from + $n - 1) g))});
	ok( $node->poll_query_until(
			'postgres',
			"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = '$q' AND state = 'pending'"),
		"$n jobs of $q scheduled");
}

sub drain { return drain_queue($node, $_[0]); }

sub slot_states
{
	return q1(q{SELECT string_agg(slot || ':' || state, ' ' ORDER BY slot)
	             FROM pgqueue.slots WHERE tbl = 'work_queue'});
}

sub wait_state
{
	my ($slot, $state) = @_;
	return $node->poll_query_until('postgres',
		"SELECT state = '$state' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = $slot");
}

# --- turning ------------------------------------------------------------------
push_scheduled('a', 1, 1500);
ok( $node->poll_query_until(
		'postgres', q{
SELECT slot > 0 FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'}),
	'a new slot became current');
push_scheduled('a', 1501, 1500);
my $parts = q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.work_queue') WHERE isleaf});
cmp_ok($parts, '>=', 2, "3,000 jobs scheduled over $parts slots");
is( q1(q{SELECT count(DISTINCT tableoid) > 1 FROM pgqueue.work_queue}),
	't', 'the jobs are in more than one slot');
my @order = drain('a');
is(scalar(@order), 3000, 'every job claimed and acked');
is_deeply(\@order, [ 1 .. 3000 ], 'claims took them in scheduling order across slots');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 0 FROM pgqueue.slots
 WHERE tbl = 'work_queue' AND state IN ('live', 'drained') AND slot > 0}),
	'every slot but the current one (and slot 0, never truncated) truncated: ' . slot_states());
ok($node->poll_query_until('postgres', q{SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = 0}),
	'slot 0, emptied, is drained (claims no longer walk it): ' . slot_states());
is(q1(q{SELECT count(*) FROM pgqueue.work_queue_0}), '0', 'slot 0 is empty');
is( q1(q{
SELECT sum(pg_relation_size(relid)) FROM pg_partition_tree('pgqueue.work_queue') p
  JOIN pgqueue.slots s ON s.tbl = 'work_queue' AND format('pgqueue.work_queue_%s', s.slot)::regclass = p.relid
 WHERE s.state = 'free'}),
	'0', 'the free slots are empty');

# --- a snapshot held across turns ----------------------------------------------
push_scheduled('h', 1, 200);
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $seen = $holder->query_safe('SELECT count(*) FROM pgqueue.work_queue');
my $held_slots = q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.work_queue') WHERE isleaf});
my $jobs = 0;
for my $round (1 .. 6)
{
	push_scheduled('b', 1, 2000);
	$jobs += scalar(drain('b'));
}
is($jobs, 12000, '12,000 jobs went through while the snapshot was held');
# without the ring every one of their 24,000 row versions would be dead; the
# slots the holder read stay (they existed when it read the parent), the
# others are truncated once empty (slot 0, out of the ring since the first
# turn, keeps the dead rows of the jobs before it for VACUUM, which is off)
my $dead_sql = q{
SELECT sum(t.dead_tuple_count) FROM pg_partition_tree('pgqueue.work_queue') p,
  LATERAL pgstattuple(p.relid) t
 WHERE p.isleaf AND p.relid <> 'pgqueue.work_queue_0'::regclass};
ok($node->poll_query_until('postgres', "SELECT ($dead_sql) < 4000"),
	'dead row versions in work_queue bounded: ' . q1($dead_sql) . ' (' . slot_states() . ')')
  or diag(q1(q{SELECT string_agg(format('%s %s %s %s %s', a.pid, a.backend_type, a.wait_event_type, a.wait_event, left(a.query, 60)), E'\n') FROM pg_stat_activity a})
	. "\n" . q1(q{SELECT string_agg(format('%s %s %s %s', l.pid, l.relation::regclass, l.mode, l.granted), E'\n') FROM pg_locks l WHERE l.relation IS NOT NULL AND l.relation::regclass::text LIKE 'pgqueue.%'})
	. "\n" . q1(q{SELECT string_agg(format('%s %s', p.relid, t.dead_tuple_count), E'\n') FROM pg_partition_tree('pgqueue.work_queue') p, LATERAL pgstattuple(p.relid) t WHERE p.isleaf}));
cmp_ok(q1(q{SELECT count(*) FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'free'}),
	'>=', 1, 'slots made during the hold were truncated during it');
is($holder->query_safe('SELECT count(*) FROM pgqueue.work_queue'),
	$seen, 'the holder still sees what it saw');
$holder->query_safe('COMMIT');
$holder->quit;
drain('h');
ok( $node->poll_query_until(
		'postgres', q{
SELECT count(*) = 0 FROM pgqueue.slots
 WHERE tbl = 'work_queue' AND state IN ('live', 'drained') AND slot > 0}),
	'after the hold, the slots it held truncated too (slot 0 stays drained): ' . slot_states());

# --- a snapshot that can see a drained slot's rows ----------------------------
my $cur = q1(q{SELECT slot FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'});
my $cur_oid = slot_oids($node, 'work_queue', $cur);
push_scheduled('c', 1, 1000);
my $inslot = q1("SELECT count(*) FROM pgqueue.work_queue_$cur");
my $late = $node->background_psql('postgres');
$late->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$late->query_safe('SELECT 1');    # the snapshot, no lock on the slot
drain('c');
push_scheduled('d', 1, 1000);     # the slot is full: a new one becomes current
ok(wait_state($cur, 'drained'), "slot $cur drained");
sleep(1);
is( q1("SELECT state FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = $cur"),
	'drained', "slot $cur not truncated while a snapshot that can see its rows is open");
is($late->query_safe("SELECT count(*) FROM pgqueue.work_queue_$cur"),
	$inslot, "that snapshot reads its $inslot rows");
$late->query_safe('COMMIT');
$late->quit;
ok(wait_slots_free($node, 'work_queue', $cur_oid),
	"slot $cur truncated (or dropped) once that transaction ended");
drain('d');

# --- straggler moves ----------------------------------------------------------
# Jobs of a queue that no one claims, and one held for an hour, in the current
# slot: as the ring turns, they are moved along to the current slot (once their
# slot has been out of use for 10 s) instead of keeping it from draining.
my $stuck = q1(q{SELECT slot FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'});
my $stuck_oid = slot_oids($node, 'work_queue', $stuck);
my $stuck_file = slot_files($node, $stuck_oid);
push_scheduled('stuck', 1, 50);
is(q1(q{SELECT count(*) FROM pgq_claim('holder', 1, '1 hour', ARRAY['stuck'])}),
	'1', 'one of them held for an hour');
my $started = time;
while (time - $started < 13)
{
	q1(q{SELECT pgq_push_batch('e', ARRAY(SELECT jsonb_build_object('n', g)
	      FROM generate_series(1, 500) g))});
	$node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = 'e' AND state = 'pending'");
	drain('e');
}
ok(wait_slots_free($node, 'work_queue', $stuck_oid, $stuck_file),
	"the slot they were in was emptied and truncated (or dropped): " . slot_states());
is(q1(q{SELECT count(*) FROM pgqueue.work_queue WHERE queue = 'stuck'}),
	'50', 'the 50 jobs are all still there');
cmp_ok(q1(q{SELECT count(*) FROM pgqueue.slots WHERE tbl = 'work_queue' AND state <> 'free'}),
	'<=', 4, 'and the ring did not grow with them');
is( q1(q{SELECT pgq_ack(id, 'holder') FROM pgqueue.work_queue WHERE lock_key = 'holder'}),
	't', 'the held job is acked by its holder in its new slot');
is( q1(q{SELECT count(*) FROM pgq_claim('late', 100, '1 minute', ARRAY['stuck'])}),
	'49', 'the others are claimed');

# --- statistics of an emptied slot --------------------------------------------
# A TRUNCATE sets a table's live and dead row counts to zero when it commits,
# but the counts a backend had not flushed by then (a busy one flushes at most
# once a second, an idle one within ten) are added to the emptied slot
# afterwards; the scheduler sets them to zero again once they are in.
push_scheduled('st', 1, 600);
my $st_oids = q1(q{SELECT string_agg(DISTINCT tableoid::text, ',') FROM pgqueue.work_queue
                    WHERE queue = 'st'});
my $w = $node->background_psql('postgres');
# a first flush of this backend's statistics: the next waits a second at least
$w->query_safe('SELECT count(*) FROM pgqueue.slots');
is( $w->query_safe(q{SELECT count(pgq_ack(c.id, 'w'))
                       FROM pgq_claim('w', 1000, '1 minute', ARRAY['st']) c}),
	'600', "600 jobs claimed and acked by one session, in slots $st_oids");
my $acked = time;
# the ring turns past one of their slots at least: the first found free
my $free_sql = qq{
SELECT coalesce(string_agg(c.oid::text, ','), '') FROM pg_class c
  JOIN pgqueue.slots s ON s.tbl = 'work_queue' AND c.relname = 'work_queue_' || s.slot
 WHERE c.oid IN ($st_oids) AND s.state = 'free'};
my $st_free = '';
for (my $i = 0; $i < 40 && ($st_free = q1($free_sql)) eq ''; $i++)
{
	q1(q{SELECT pgq_push_batch('f', ARRAY(SELECT jsonb_build_object('n', g)
	      FROM generate_series(1, 100) g))});
	$node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = 'f' AND state = 'pending'");
	drain('f');
}
isnt($st_free, '', "a slot of theirs was emptied and truncated ($st_free): " . slot_states());
cmp_ok(time - $acked, '<', 9, 'before that session flushed its counts (it is idle)');
$st_oids = $st_free || 0;
my $st_sql = qq{
SELECT count(*) AS slots, coalesce(sum(n_dead_tup), 0) AS dead,
       coalesce(sum(n_live_tup), 0) AS live, coalesce(sum(n_tup_del), 0) AS deleted,
       coalesce(sum(vacuum_count + autovacuum_count), 0) AS vacuums
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.relid IN ($st_oids)};
# the TRUNCATE's zeroes flushed by the scheduler (and any count flushed since,
# set right), before that session's counts come in
ok( $node->poll_query_until('postgres', "SELECT dead = 0 AND live = 0 FROM ($st_sql) x"),
	'the emptied slot counts no live or dead rows: ' . q1($st_sql));
my $deleted = q1("SELECT deleted FROM ($st_sql) x");
$w->quit;    # its counts flushed as it exits, after the TRUNCATE
ok( $node->poll_query_until('postgres', qq{
SELECT slots > 0 AND deleted > $deleted AND dead = 0 AND live = 0 AND vacuums = 0
  FROM ($st_sql) x}),
	'nor after the counts of that session came in (its deletes counted), without a VACUUM: '
	  . q1($st_sql));

$node->stop;
done_testing();
