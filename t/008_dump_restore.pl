# pg_dump -Fc of a database that uses pgqueue, restored into a new database:
# every job comes back in its state (pending, delayed, retry, scheduled,
# running under a held lease, running under a lease that ran out, failed),
# with its payload, tries, dedup_key and lease; the queue settings, the
# archive (its partitions made at run time, attached again, with their
# rows) and the marks of periodic jobs too.  The restored queue works:
# claims, the holder's ack, a steal of the lapsed lease, dedup, the
# archive and its upkeep.  Then the same for a database updated from 1.0,
# whose tables the update marks for pg_dump.  Then a database whose
# work_queue the scheduler spread over slots made at run time.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# no scheduler: the test decides when passes run
my $node = pgq_node('dump', "pgqueue.enabled = off\n");
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', 'CREATE EXTENSION pgqueue');

# jobs in every state, held leases, settings, archive rows, a periodic mark
$node->safe_psql('src', q{
SELECT pgq_configure('q', weight => 3, max_in_flight => 10, max_tries => 2, retention => '7 days');
SELECT pgq_configure('later', paused => true, retention => '2 days');
SELECT pgq_configure('plain', max_tries => 9);
-- archived: acked, cancelled, purged
SELECT pgq_push('q', '{"n": "acked"}');
SELECT pgq_schedule();
SELECT pgq_ack(id, 'w0') FROM pgq_claim('w0', 1, '1 hour');
SELECT pgq_cancel(pgq_push('q', '{"n": "cancelled"}'));
SELECT pgq_push('later', '{"n": "purged"}');
SELECT pgq_purge('later', 'pending');
-- failed (out of its 2 tries), retry
SELECT pgq_push('q', '{"n": "failed"}');
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w0', 'first', '0') FROM pgq_claim('w0', 1, '1 hour');
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w0', 'second') FROM pgq_claim('w0', 1, '1 hour');
SELECT pgq_push('q', '{"n": "retry"}');
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w0', 'later please', '1 hour') FROM pgq_claim('w0', 1, '1 hour');
-- running under a held lease (w1), under a lease that ran out (w2)
SELECT pgq_push('q', '{"n": "running"}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 1, '1 hour');
SELECT pgq_push('q', '{"n": "lapsed"}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w2', 1, '1 millisecond');
-- scheduled, pending with a dedup_key, delayed, pending in a paused queue
SELECT pgq_push('q', '{"n": "scheduled"}', priority => 5);
SELECT pgq_schedule();
SELECT pgq_push('q', '{"n": "pending"}', dedup_key => 'once');
SELECT pgq_push('q', '{"n": "delayed"}', run_after => now() + interval '1 day');
SELECT pgq_push('later', '{"n": "paused"}');
SELECT pgq_push_periodic('plain', 'nightly', '1 day', '{"n": "periodic"}');
});

# everything, as text, in a stable order
my $everything = q{
SELECT concat_ws(E'\n',
  (SELECT string_agg(q::text, E'\n' ORDER BY q.id) FROM pgqueue.queue q),
  (SELECT string_agg(w::text, E'\n' ORDER BY w.id) FROM pgqueue.work_queue w),
  (SELECT string_agg(s::text, E'\n' ORDER BY s.queue) FROM pgqueue.queues s),
  (SELECT string_agg(a::text || ' in ' || a.tableoid::regclass::text, E'\n' ORDER BY a.id)
     FROM pgqueue.archive a),
  (SELECT string_agg(p::text, E'\n' ORDER BY p.queue, p.name) FROM pgqueue.periodic p),
  (SELECT string_agg(c.oid::regclass::text || ' ' || pg_get_expr(c.relpartbound, c.oid), E'\n'
                     ORDER BY c.relname)
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'pgqueue.archive'::regclass),
  (SELECT string_agg(j.state || ' ' || (j.payload->>'n'), E'\n' ORDER BY j.id) FROM pgqueue.jobs j))};
my $before = $node->safe_psql('src', $everything);
is( $node->safe_psql('src', q{
SELECT string_agg(state, ',' ORDER BY state) FROM (SELECT DISTINCT state FROM pgqueue.jobs) s}),
	'failed,pending,retry,running,scheduled', 'the source has jobs in every state');
is($node->safe_psql('src', 'SELECT count(*) FROM pgqueue.archive'), '3',
	'and archive rows');

# --- dump and restore --------------------------------------------------------
my $dump = $PostgreSQL::Test::Utils::tmp_check . '/src.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'src' ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
my ($stdout, $stderr);
IPC::Run::run([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'>', \$stdout, '2>', \$stderr);
is($?, 0, 'pg_restore succeeds');
is($stderr, '', 'and says nothing');

is($node->safe_psql('restored', $everything), $before,
	'every job, lease, setting, archive row and partition, and periodic mark came back');
is( $node->safe_psql('restored', q{
SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'pgqueue.archive'::regclass AND c.relispartition}),
	$node->safe_psql('src', q{
SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass}),
	'the archive partitions are attached again');
is( $node->safe_psql('restored', q{
SELECT count(*) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE e.extname = 'pgqueue' AND d.classid = 'pg_class'::regclass
   AND d.objid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass)}),
	'0', 'and are not members of the extension, as in the source');

# --- the restored queue works --------------------------------------------------
# the lease that ran out is stolen (try 2), the scheduled job is claimed;
# the held job is not (its lease is a wall-clock deadline an hour away)
is( $node->safe_psql('restored', q{
SELECT string_agg((payload->>'n') || ':' || tries, ',' ORDER BY payload->>'n')
  FROM pgq_claim('w3', 10, '1 hour')}),
	'lapsed:2,scheduled:1', 'claims: the lapsed lease is stolen, the scheduled job taken');
is( $node->safe_psql('restored', q{
SELECT pgq_ack(id, 'w1') FROM pgqueue.jobs WHERE payload->>'n' = 'running'}),
	't', 'the holder of a lease from before the dump acks its job');
is( $node->safe_psql('restored', q{
SELECT pgq_ack(id, 'w2') FROM pgqueue.jobs WHERE payload->>'n' = 'lapsed'}),
	'f', 'the holder of the stolen lease is fenced off');
is( $node->safe_psql('restored', q{
SELECT pgq_push('q', '{"n": "again"}', dedup_key => 'once') = id
  FROM pgqueue.jobs WHERE payload->>'n' = 'pending'}),
	't', 'a push with a live dedup_key finds the restored job');
is($node->safe_psql('restored', 'SELECT pgq_schedule()'), '2',
	'the pending jobs are scheduled (the delayed and paused ones are not)');
is( $node->safe_psql('restored', q{
SELECT string_agg(payload->>'n', ',' ORDER BY payload->>'n') FILTER (WHERE pgq_ack(id, 'w3'))
  FROM pgq_claim('w3', 10, '1 hour')}),
	'pending,periodic', 'and claimed and acked');
is( $node->safe_psql('restored', q{
SELECT pgq_retry(id) FROM pgqueue.jobs WHERE payload->>'n' = 'failed'}),
	't', 'the failed job is retried');
is( $node->safe_psql('restored', q{
SELECT string_agg((payload->>'n') || ':' || outcome || ':' || tries, ',' ORDER BY payload->>'n')
  FROM pgqueue.archive}),
	'acked:acked:1,cancelled:cancelled:0,pending:acked:1,purged:purged:0,running:acked:1',
	'acks in the restored database are archived');
is( $node->safe_psql('restored', q{
SELECT pgq_push_periodic('plain', 'nightly', '1 day') = job FROM pgqueue.periodic}),
	't', 'the periodic job of the day is not pushed again');
$node->safe_psql('restored', q{SELECT pgq_configure('new', retention => '20 days')});
ok( $node->safe_psql('restored', q{
SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass}) >
	  $node->safe_psql('src', q{
SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass}),
	'new partitions are made next to the restored ones');

# --- a database updated from 1.0 -----------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE old');
$node->safe_psql('old', q{
CREATE EXTENSION pgqueue VERSION '1.0';
SELECT pgq_configure('q', weight => 2);
SELECT pgq_push('q', '{"n": "from 1.0"}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 1, '1 hour');
ALTER EXTENSION pgqueue UPDATE;
SELECT pgq_configure('q', retention => '1 day');
SELECT pgq_push('q', '{"n": "acked on 1.1"}');
SELECT pgq_schedule();
SELECT pgq_ack(id, 'w2') FROM pgq_claim('w2', 1, '1 hour');
});
my $old_before = $node->safe_psql('old', $everything);
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dump.old", '-d', 'old' ], 'pg_dump of the updated database');
$node->safe_psql('postgres', 'CREATE DATABASE old_restored');
IPC::Run::run([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('old_restored'), "$dump.old" ],
	'>', \$stdout, '2>', \$stderr);
is($?, 0, 'pg_restore of the updated database succeeds');
is($node->safe_psql('old_restored', $everything), $old_before,
	'its jobs, lease, settings and archive came back');
is( $node->safe_psql('old_restored', q{
SELECT pgq_ack(id, 'w1') FROM pgqueue.jobs WHERE payload->>'n' = 'from 1.0'}),
	't', 'the job claimed under 1.0 is acked in the restored database');

$node->stop;

# --- slots of work_queue made at run time by the scheduler -------------------
my $rnode = pgq_node('dumpring', "pgqueue.slot_size = 64\npgqueue.naptime = 50\n");
$rnode->start;
$rnode->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
my $all_scheduled = q{SELECT count(*) = 0 FROM pgqueue.queue WHERE state = 'pending'};
$rnode->safe_psql('postgres', q{
SELECT pgq_push_batch('r', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 1500) g))});
ok($rnode->poll_query_until('postgres', $all_scheduled), '1,500 jobs scheduled');
ok( $rnode->poll_query_until(
		'postgres', q{
SELECT slot > 0 FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'}),
	'the scheduler made a new slot current');
$rnode->safe_psql('postgres', q{
SELECT pgq_push_batch('r', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1501, 3000) g))});
ok($rnode->poll_query_until('postgres', $all_scheduled), '1,500 more scheduled');
is($rnode->safe_psql('postgres', 'SELECT count(*) FROM pgq_claim(\'w1\', 10, \'1 hour\')'),
	'10', 'ten of them claimed');
my $ring_everything = q{
SELECT concat_ws(E'\n',
  (SELECT string_agg(w.tableoid::regclass::text || ' ' || w::text, E'\n' ORDER BY w.id)
     FROM pgqueue.work_queue w),
  (SELECT string_agg(s.tbl || ' ' || s.slot || ' ' || s.state, E'\n' ORDER BY s.tbl, s.slot)
     FROM pgqueue.slots s),
  (SELECT string_agg(q::text, E'\n' ORDER BY q.id) FROM pgqueue.queue q))};
my $ring_before = $rnode->safe_psql('postgres', $ring_everything);
cmp_ok(
	$rnode->safe_psql('postgres', 'SELECT count(DISTINCT tableoid) FROM pgqueue.work_queue'),
	'>=', 2, 'work_queue rows in several slots');
$rnode->command_ok([ 'pg_dump', '-Fc', '-f', "$dump.ring", '-d', 'postgres' ],
	'pg_dump of a database with slots made at run time');
$rnode->safe_psql('postgres', 'CREATE DATABASE ring_restored');
IPC::Run::run(
	[ 'pg_restore', '--exit-on-error', '-d', $rnode->connstr('ring_restored'), "$dump.ring" ],
	'>', \$stdout, '2>', \$stderr);
is($?, 0, 'pg_restore of it succeeds');
is($stderr, '', 'and says nothing');
is($rnode->safe_psql('ring_restored', $ring_everything), $ring_before,
	'every slot came back with its rows, and the slots\' states');
is( $rnode->safe_psql('ring_restored', q{
SELECT count(*) FILTER (WHERE pgq_ack(id, 'w1')) FROM pgqueue.work_queue WHERE lock_key = 'w1'}),
	'10', 'the restored leases are acked by their holder');
is( $rnode->safe_psql('ring_restored', q{
SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'w2')) FROM pgq_claim('w2', 10000, '1 hour') c}),
	'2990', 'the other jobs are claimed and acked, from every slot');
$rnode->stop;
done_testing();
