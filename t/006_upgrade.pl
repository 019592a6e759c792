# ALTER EXTENSION pgqueue UPDATE on a live 1.0 database.
#
# The sequence a packaged upgrade goes through: the 1.0 SQL objects are
# installed and hold jobs pending, scheduled and in flight; the server
# already runs the new library (packages replace it before anyone runs
# ALTER EXTENSION), which must keep serving the 1.0 objects: claims, acks
# and the scheduler's passes go on.  Then the update runs while the
# scheduler is busy and a claim waits for it; afterwards the jobs keep their
# state, payload, lease, holder and tries, a worker that claimed before the
# update extends, acks and nacks its jobs, and everything works after it,
# including the operator API (retry, cancel and purge of jobs failed, held
# and pending since before the update, the archive); the updated database
# has the same tables, indexes, constraints, functions, privileges and
# pg_dump marks as a fresh install.
#
# The update is the bare ALTER EXTENSION pgqueue UPDATE that users run: to
# the default version, 1.2 since 1.2 began, so 1.0 -> 1.1 -> 1.2 in one
# statement.  What is checked is what 1.1 brought to a live 1.0 database
# (work_queue keeps an in-flight job's tries and version, no foreign key,
# the operator API); it holds on 1.2 as well.  t/035_upgrade_12.pl checks
# the update of a live 1.1 database to 1.2.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pgq_node('upgrade', "pgqueue.naptime = '50ms'\n");
$node->start;
wait_for_scheduler($node, 'postgres');

$node->safe_psql('postgres', "CREATE EXTENSION pgqueue VERSION '1.0'");
is($node->safe_psql('postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"),
	'1.0', 'installed at 1.0');

# wait until the scheduler has moved every due job of queue $queue (default
# 'q'; 'caps' has a max_in_flight that keeps its third job pending)
sub wait_scheduled
{
	my ($msg, $queue) = @_;
	$queue //= 'q';
	ok( $node->poll_query_until(
			'postgres', qq{
SELECT count(*) = 0 FROM pgqueue.queue
 WHERE queue = '$queue' AND state IN ('pending', 'retry') AND run_after <= now()}),
		$msg);
}

# --- the new library serves the 1.0 objects ---------------------------------
$node->safe_psql('postgres', q{
SELECT pgq_configure('caps', max_in_flight => 2);
SELECT pgq_push('q', jsonb_build_object('n', g)) FROM generate_series(1, 2) g;
SELECT pgq_push('caps', jsonb_build_object('n', g)) FROM generate_series(1, 3) g;
SELECT pgq_push('q', '{"n": "later"}', run_after => now() + interval '1 hour');
});
wait_scheduled('1.0: the scheduler schedules with the new library');

# w1 holds two jobs, one of them nacked and claimed again (try 2); w2 holds
# one under a lease that runs out at once (to be stolen after the update)
my $held = $node->safe_psql('postgres', q{
SELECT string_agg(id::text, ',' ORDER BY id) FROM pgq_claim('w1', 2, '1 hour', ARRAY['q']);
});
my ($j1, $j2) = split /,/, $held;
is($node->safe_psql('postgres', "SELECT pgq_nack('$j1', 'w1', 'first try failed', '0')"),
	'retry', '1.0: nack');
wait_scheduled('1.0: the nacked job is scheduled again');
is( $node->safe_psql('postgres',
		"SELECT id = '$j1', tries FROM pgq_claim('w1', 1, '1 hour', ARRAY['q'])"),
	't|2', '1.0: the nacked job comes back as try 2');
$node->safe_psql('postgres', q{SELECT pgq_push('q', '{"n": 3}')});
wait_scheduled('1.0: one more');
my $j3 = $node->safe_psql('postgres', q{
SELECT id FROM pgq_claim('w2', 1, '1 millisecond', ARRAY['q'])});
ok($j3 ne '', '1.0: w2 claims a job under a 1 ms lease');
is($node->safe_psql('postgres', "SELECT pgq_ack('$j2', 'w1')"), 't', '1.0: ack');

# for the operator API of 1.1: a job failed under 1.0 ('dead'), one held
# under 1.0 by w6 ('held'), one pending in a paused queue ('stopped')
$node->safe_psql('postgres', q{
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_configure('stopped', paused => true);
SELECT pgq_push('dead', '{"n": "dead"}');
SELECT pgq_push('held', '{"n": "held"}');
SELECT pgq_push('stopped', '{"n": "stopped"}');
});
wait_scheduled('1.0: dead is scheduled', 'dead');
wait_scheduled('1.0: held is scheduled', 'held');
my $dead = $node->safe_psql('postgres', q{SELECT id FROM pgq_claim('w6', 1, '1 hour', ARRAY['dead'])});
is($node->safe_psql('postgres', "SELECT pgq_nack('$dead', 'w6', 'failed under 1.0')"),
	'failed', '1.0: a job fails');
my $held_job = $node->safe_psql('postgres', q{SELECT id FROM pgq_claim('w6', 1, '1 hour', ARRAY['held'])});
ok($held_job ne '', '1.0: w6 holds a job');

# the state of every job before the update, to compare after it
my $before_sql = q{
SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s', q.id, q.state, q.payload,
                         coalesce(w.tries, q.tries), w.lock_key, w.lock_timeout,
                         q.last_error), E'\n' ORDER BY q.id)
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)};
my $before_10 = $node->safe_psql('postgres', q{
SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s', q.id, q.state, q.payload,
                         q.tries, w.lock_key, w.lock_timeout,
                         q.last_error), E'\n' ORDER BY q.id)
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)});
my $version_j1 = $node->safe_psql('postgres', "SELECT version FROM pgqueue.queue WHERE id = '$j1'");

# --- the update, while the scheduler runs and a claim waits for it ----------
my $upd = $node->background_psql('postgres');
$upd->query_safe('BEGIN');
$upd->query_safe('ALTER EXTENSION pgqueue UPDATE');

# a claim issued now waits for the update's locks, then runs on the updated objects
my $waiter = $node->background_psql('postgres');
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/claiming/,
	"\\echo claiming\nSELECT 'got', tries FROM pgq_claim('w3', 1, '1 hour', ARRAY['caps']);\n");
ok( $node->poll_query_until(
		'postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $waiter_pid"),
	'a claim waits for the update');
$upd->query_safe('COMMIT');
$upd->quit;
$waiter->query_until(qr/got\|1/, '');
$waiter->quit;
pass('the waiting claim ran after the update and got a first try');

is($node->safe_psql('postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"),
	'1.2', 'updated to 1.2 (1.0 -> 1.1 -> 1.2 in one ALTER EXTENSION pgqueue UPDATE)');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pg_constraint WHERE conrelid = 'pgqueue.work_queue'::regclass AND contype = 'f'}),
	'0', 'the foreign key is gone');

# jobs kept state, payload, tries, lease and holder; the 'caps' job that
# the waiting claim took during the update is left out of the comparison
my $w3_id = $node->safe_psql('postgres', "SELECT id FROM pgqueue.work_queue WHERE lock_key = 'w3'");
my $after = $node->safe_psql('postgres', $before_sql . " WHERE q.id <> '$w3_id'");
my $expected = join "\n", grep { !/^\Q$w3_id\E\|/ } split /\n/, $before_10;
is($after, $expected, 'every job kept its state, payload, tries, lease and holder');
is($node->safe_psql('postgres', "SELECT tries, version FROM pgqueue.work_queue WHERE id = '$j1'"),
	"2|$version_j1", 'an in-flight job\'s tries and version moved into work_queue');

# the worker that claimed before the update carries on
ok($node->safe_psql('postgres', "SELECT pgq_extend('$j1', 'w1', '1 hour') IS NOT NULL") eq 't',
	'the holder extends after the update');
is($node->safe_psql('postgres', "SELECT pgq_extend('$j1', 'w9', '1 hour') IS NULL"), 't',
	'another key still cannot');
is($node->safe_psql('postgres', "SELECT pgq_nack('$j1', 'w1', 'second try failed', '0')"),
	'retry', 'the holder nacks after the update');
is($node->safe_psql('postgres', "SELECT tries, version > $version_j1 FROM pgqueue.queue WHERE id = '$j1'"),
	'2|t', 'the nack wrote tries and version back to the job row');
# the lease of w2 ran out before the update: stolen after it (before the
# nacked job: a claim takes expired leases first), as try 2
is( $node->safe_psql('postgres', "
SELECT id = '$j3', tries FROM pgq_claim('w4', 1, '1 hour', ARRAY['q'])"),
	't|2', 'a lease that ran out before the update is stolen after it');
is($node->safe_psql('postgres', "SELECT pgq_ack('$j3', 'w2')"), 'f',
	'its old holder is fenced off');

wait_scheduled('after the update: the scheduler schedules the nacked job again');
my $again = $node->safe_psql('postgres', "
SELECT tries, version > $version_j1 FROM pgq_claim('w1', 1, '1 hour', ARRAY['q']) WHERE id = '$j1'");
is($again, '3|t', 'claimed again: try 3, a larger version');
is($node->safe_psql('postgres', "SELECT pgq_ack('$j1', 'w1')"), 't', 'and acked');

# new work flows after the update; max_in_flight still holds
$node->safe_psql('postgres',
	"SELECT pgq_push('q', jsonb_build_object('n', 'after', 'k', g)) FROM generate_series(1, 5) g");
wait_scheduled('after the update: new pushes are scheduled');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id) WHERE q.queue = 'caps'}),
	'2', 'max_in_flight still caps the queue');
is( $node->safe_psql('postgres', q{
SELECT count(*), bool_and(pgq_ack(id, 'w5')) FROM pgq_claim('w5', 100, '1 hour')}),
	'6|t', 'everything scheduled can be claimed and acked');
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.work_queue w
 WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.id = w.id AND q.state = 'scheduled')}),
	'0', 'no work_queue row without its scheduled job');
# an ack of a capped queue's job freed a place: the last 'caps' job follows
wait_scheduled('after the update: a freed place under max_in_flight is filled', 'caps');
is( $node->safe_psql('postgres', q{
SELECT string_agg(state || ':' || n, ',' ORDER BY state) FROM
  (SELECT state, count(*) n FROM pgqueue.jobs WHERE queue IN ('q', 'caps') GROUP BY state) s}),
	'pending:1,running:2,scheduled:1', 'pgqueue.jobs after the update');

# --- the operating objects of 1.1 on the updated database (1.2) -------------
$node->safe_psql('postgres', q{
SELECT pgq_configure('dead', retention => '1 day');
SELECT pgq_configure('held', retention => '1 day');
SELECT pgq_configure('stopped', retention => '1 day');
});
is($node->safe_psql('postgres', "SELECT pgq_retry('$dead')"), 't',
	'a job failed under 1.0 is retried');
wait_scheduled('after the update: the retried job is scheduled', 'dead');
is( $node->safe_psql('postgres', q{
SELECT tries, pgq_ack(id, 'w7') FROM pgq_claim('w7', 1, '1 hour', ARRAY['dead'])}),
	'1|t', 'claimed as a first try again, and acked');
is($node->safe_psql('postgres', "SELECT pgq_cancel('$held_job')"), 't',
	'a job held since before the update is cancelled');
is($node->safe_psql('postgres', "SELECT pgq_ack('$held_job', 'w6')"), 'f',
	'and its holder is fenced off');
is($node->safe_psql('postgres', "SELECT pgq_purge('stopped', 'pending')"), '1',
	'a job pending since before the update is purged');
is( $node->safe_psql('postgres', q{
SELECT string_agg(queue || ':' || outcome || ':' || tries || ':' || coalesce(last_error, '-'), ','
                  ORDER BY queue) FROM pgqueue.archive}),
	'dead:acked:1:failed under 1.0,held:cancelled:1:-,stopped:purged:0:-',
	'each is in the archive');

# a fresh install (1.2) and the updated one have the same tables and columns
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION pgqueue');
# the archive's partitions, and their indexes, are made at run time; the
# slot 0 partitions of queue and work_queue are the extension's, and
# compared with their indexes and constraints
my $not_archive_part = q{NOT (c.relispartition AND c.relname ~ '^archive_') AND NOT EXISTS (
  SELECT 1 FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid
   WHERE x.indexrelid = c.oid AND t.relispartition AND t.relname ~ '^archive_')};
my $shape = qq{
SELECT string_agg(format('%s.%s %s %s %s', c.relname, a.attname,
                         format_type(a.atttypid, a.atttypmod), a.attnotnull,
                         pg_get_expr(d.adbin, d.adrelid)), E'\n' ORDER BY c.relname, a.attnum)
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'pgqueue'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
   AND $not_archive_part};
is($node->safe_psql('postgres', $shape), $node->safe_psql('fresh', $shape),
	'the updated and the fresh tables have the same columns');
my $indexes = q{
SELECT string_agg(pg_get_indexdef(i.indexrelid), E'\n' ORDER BY pg_get_indexdef(i.indexrelid))
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE c.relnamespace = 'pgqueue'::regnamespace
   AND NOT (c.relispartition AND c.relname ~ '^archive_')};
is($node->safe_psql('postgres', $indexes), $node->safe_psql('fresh', $indexes),
	'and the same indexes');
my $constraints = q{
SELECT string_agg(format('%s %s', conname, pg_get_constraintdef(oid)), E'\n' ORDER BY conname)
  FROM pg_constraint WHERE connamespace = 'pgqueue'::regnamespace
   AND conrelid NOT IN (SELECT oid FROM pg_class WHERE relispartition AND relname ~ '^archive_')};
is($node->safe_psql('postgres', $constraints), $node->safe_psql('fresh', $constraints),
	'and the same constraints');
my $functions = q{
SELECT string_agg(format('%s secdef=%s config=%s acl=%s args=%s %s', p.oid::regprocedure,
                         p.prosecdef, p.proconfig, p.proacl, pg_get_function_arguments(p.oid),
                         p.prosrc), E'\n'
                  ORDER BY p.oid::regprocedure::text)
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgqueue' AND d.deptype = 'e'};
is($node->safe_psql('postgres', $functions), $node->safe_psql('fresh', $functions),
	'the same functions, settings, defaults and privileges');
my $grants = qq{
SELECT string_agg(format('%s %s', relname, relacl), E'\n' ORDER BY relname)
  FROM pg_class c WHERE relnamespace = 'pgqueue'::regnamespace AND $not_archive_part};
is($node->safe_psql('postgres', $grants), $node->safe_psql('fresh', $grants),
	'the same privileges on the tables');
my $config = q{
SELECT string_agg(c::regclass::text, ',' ORDER BY c::regclass::text)
  FROM pg_extension e, unnest(e.extconfig) c WHERE e.extname = 'pgqueue'};
is($node->safe_psql('postgres', $config),
	'pgqueue.archive,pgqueue.job_parents,pgqueue.periodic,pgqueue.queue,pgqueue.queue_0,pgqueue.queues,pgqueue.slots,pgqueue.work_queue,pgqueue.work_queue_0',
	'the update marks the tables with user data for pg_dump');
is($node->safe_psql('fresh', $config), $node->safe_psql('postgres', $config),
	'as a fresh install does');

$node->stop;
done_testing();
