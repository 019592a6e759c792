# Failures of the scheduler and of the server: pg_terminate_backend of the
# scheduler (it exits quietly and the launcher starts it again, nothing
# lost), pg_terminate_backend of the launcher (a new one takes over, the
# schedulers go on), SIGKILL of the scheduler (a crash restart of the whole
# server, all jobs and leases still there, exactly one launcher after it),
# SIGKILL of the postmaster in the middle of a load of pushes, claims and
# acks (every pushed job is afterwards either still queued or was acked:
# none lost, none duplicated).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = pgq_node(
	'crash', q{
pgqueue.naptime = '1h'
restart_after_crash = on
});
$node->start;
my $pid = wait_for_scheduler($node, 'postgres');

# 20 jobs due now (5 of them claimed under a long lease), 5 due tomorrow
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION pgqueue;
SELECT count(pgq_push('now', jsonb_build_object('i', i))) FROM generate_series(1, 20) i;
SELECT count(pgq_push('later', jsonb_build_object('i', i), now() + interval '1 day'))
  FROM generate_series(1, 5) i;
});
$node->poll_query_until('postgres',
	"SELECT count(*) = 20 FROM pgqueue.work_queue")
  or die 'jobs not scheduled';
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pgq_claim('holder', 5, '1 day')"),
	5, 'setup: 25 jobs, 20 scheduled, 5 of them claimed');

# Everything about the jobs of queues now and later, in one string.
my $fingerprint_sql = q{
SELECT string_agg(concat_ws(' ', q.id, q.state, q.tries, q.version, q.run_after,
                            w.created, w.batch_order, w.lock_key, w.lock_timeout),
                  E'\n' ORDER BY q.id)
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 WHERE q.queue IN ('now', 'later')};
my $fp = $node->safe_psql('postgres', $fingerprint_sql);
my $reset = counter($node, 'postgres', 'stats_reset');

# Push a job in queue extra and return how long it took to be scheduled.
sub push_and_time
{
	my $id = $node->safe_psql('postgres', "SELECT pgq_push('extra')");
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'")
	  or return 999;
	return $node->safe_psql(
		'postgres',
		"SELECT extract(epoch FROM w.created - q.created)
		   FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
		  WHERE id = '$id'");
}

# --- pg_terminate_backend: restarted by the launcher ------------------------
my $launcher = wait_for_launcher($node);
my $off = -s $node->logfile;
my $t0 = time;
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"),
	't', 'pg_terminate_backend(scheduler)');
# pushed while there may be no scheduler: the next one schedules it
my $id = $node->safe_psql('postgres', "SELECT pgq_push('extra')");
my $pid2 = wait_for_scheduler($node, 'postgres', $pid);
my $dt = time - $t0;
cmp_ok($dt, '<', 5, sprintf('a new scheduler runs %.1fs later', $dt));
$node->wait_for_log(
	qr/\[$launcher\] pgqueue launcher LOG:  pgqueue launcher: the scheduler of database "postgres" stopped; starting it again/,
	$off);
pass('the launcher says it started the scheduler again');
is(log_count($node, qr/ERROR|FATAL|PANIC|WARNING|exited with exit code/, $off),
	0, 'the old one exited with code 0, logging no FATAL (not a crash)');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'the job pushed meanwhile gets scheduled');
is($node->safe_psql('postgres', $fingerprint_sql),
	$fp, 'all jobs, schedules and leases unchanged');
is(counter($node, 'postgres', 'stats_reset'),
	$reset, 'no crash restart (shared memory kept)');
cmp_ok(push_and_time(), '<', 1,
	'a push wakes the new scheduler (naptime 1 h)');
is(log_count($node, qr/terminating any other active server processes/, $off),
	0, 'no crash in the log');
note sprintf('pg_terminate_backend: new scheduler after %.2fs', $dt);

# --- pg_terminate_backend of the launcher: a new one takes over ----------------
$off = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)");
my $launcher2 = wait_for_launcher($node, $launcher);
ok($launcher2, 'a new launcher replaces a terminated one');
is(scheduler_pid($node, 'postgres'), $pid2, 'the scheduler goes on meanwhile');
is(log_count($node, qr/ERROR|FATAL|PANIC|WARNING|exited with exit code/, $off),
	0, 'quietly');
# the new launcher was not told of a scheduler it did not start: it looks
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid2)");
$pid2 = wait_for_scheduler($node, 'postgres', $pid2);
ok($pid2, 'it starts again a scheduler its predecessor had started');
cmp_ok(push_and_time(), '<', 1, 'which a push wakes');

# --- SIGKILL of the scheduler: crash restart of the whole server ------------
$off = -s $node->logfile;
$t0 = time;
kill 'KILL', $pid2;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $off);
pass('SIGKILL of the scheduler makes the postmaster reinitialize');
my $pid3 = wait_for_scheduler($node, 'postgres', $pid2);
$dt = time - $t0;
cmp_ok($dt, '<', 10, sprintf('scheduler back %.1fs after the SIGKILL', $dt));
ok(wait_for_launcher($node, $launcher2), 'and a launcher');
usleep(1_500_000);
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgqueue launcher'"),
	1,
	'exactly one launcher after the crash restart');
is(scheduler_count($node, 'postgres'), 1, 'and one scheduler');
like(
	slurp_file($node->logfile, $off),
	qr/background worker "pgqueue scheduler" \(PID $pid2\) was terminated by signal 9/,
	'the log names the killed scheduler');
is($node->safe_psql('postgres', $fingerprint_sql),
	$fp, 'all jobs, schedules and leases survive the crash restart');
isnt(counter($node, 'postgres', 'stats_reset'),
	$reset, 'shared memory was reinitialized (counters reset)');
cmp_ok(push_and_time(), '<', 1, 'a push wakes the new scheduler');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pgq_claim('other', 100) WHERE queue = 'now'"),
	15, 'another worker claims the 15 unclaimed jobs, not the 5 held');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE pgq_ack(id, 'holder'))
		   FROM pgqueue.work_queue WHERE lock_key = 'holder'"),
	5,
	'the holder acks its 5 jobs after the crash');
note sprintf('kill -9 scheduler: new scheduler after %.2fs', $dt);

# --- SIGKILL of the postmaster under load -----------------------------------
# Producers record each pushed id in the same statement as the push;
# consumers claim (committed on its own), then record and ack each job in
# one transaction.  So pushed and acked are exactly what committed.
$node->safe_psql(
	'postgres', q{
SELECT count(pgq_ack(id, lock_key)) FROM pgqueue.work_queue WHERE lock_key = 'other';
CREATE TABLE pushed (id uuid PRIMARY KEY);
CREATE TABLE acked (id uuid PRIMARY KEY);
CREATE PROCEDURE consume(k text) LANGUAGE plpgsql AS $$
DECLARE
	ids uuid[];
	i uuid;
BEGIN
	SELECT array_agg(c.id) INTO ids
	  FROM pgq_claim(k, 3, '1 day', NULL, '200 milliseconds') c;
	COMMIT;
	FOREACH i IN ARRAY coalesce(ids, '{}') LOOP
		PERFORM pg_sleep(0.02);             -- the work
		INSERT INTO acked VALUES (i);
		IF NOT pgq_ack(i, k) THEN
			RAISE EXCEPTION 'job % no longer held by %', i, k;
		END IF;
		COMMIT;
	END LOOP;
END $$;
CREATE FUNCTION drain() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT c.id FROM pgq_claim('drain', 1000, '1 day', NULL, '1 second') c LOOP
		INSERT INTO acked VALUES (r.id);    -- fails on a second delivery
		IF NOT pgq_ack(r.id, 'drain') THEN
			RAISE EXCEPTION 'job % no longer held', r.id;
		END IF;
	END LOOP;
	RETURN NOT EXISTS (SELECT 1 FROM pgqueue.queue WHERE queue = 'load');
END $$;
});

my $dir = $node->basedir;
PostgreSQL::Test::Utils::append_to_file("$dir/push.sql",
	"INSERT INTO pushed SELECT pgq_push('load', jsonb_build_object('c', :client_id));\n"
);
PostgreSQL::Test::Utils::append_to_file("$dir/consume.sql",
	"CALL consume('worker' || :client_id);\n");
my ($bench_out, $bench_err) = ('', '');
my $bench = IPC::Run::start(
	[
		$node->installed_command('pgbench'), '-n',
		'-h', $node->host, '-p', $node->port,
		'-c', '4', '-j', '2', '-T', '120',
		'-f', "$dir/push.sql\@4", '-f', "$dir/consume.sql\@1",
		'postgres'
	],
	'>', \$bench_out, '2>', \$bench_err);

ok( $node->poll_query_until(
		'postgres',
		"SELECT (SELECT count(*) >= 300 FROM pushed) AND (SELECT count(*) >= 100 FROM acked)
		    AND (SELECT count(*) >= 20 FROM pgqueue.queue WHERE queue = 'load')"
	),
	'load running: jobs pushed, claimed and acked');
my $before = $node->safe_psql('postgres',
	"SELECT (SELECT count(*) FROM pushed) || ' pushed, ' || (SELECT count(*) FROM acked) || ' acked'"
);
$node->kill9;
$t0 = time;

# pgbench loses its connections and stops
my $timer = IPC::Run::timer(60);
$timer->start;
while ($bench->pumpable && !$timer->is_expired)
{
	$bench->pump_nb;
	usleep(50_000);
}
$bench->kill_kill if $bench->pumpable;
$bench->finish;
note "pgbench stderr (tail): " . substr($bench_err, -600);

poll_start($node);
my $pid4 = wait_for_scheduler($node, 'postgres');
$dt = time - $t0;
ok($pid4, sprintf('server and scheduler back %.1fs after the SIGKILL', $dt));
note "at the kill (last look): $before";

my $q = sub { $node->safe_psql('postgres', shift) };
my ($n_pushed, $n_acked, $n_queued, $n_sched, $n_held) = split /\|/, $q->(
	"SELECT (SELECT count(*) FROM pushed), (SELECT count(*) FROM acked),
	        (SELECT count(*) FROM pgqueue.queue WHERE queue = 'load'),
	        (SELECT count(*) FROM pgqueue.work_queue WHERE queue = 'load'),
	        (SELECT count(*) FROM pgqueue.work_queue WHERE lock_key LIKE 'worker%')");
note "after restart: $n_pushed pushed, $n_acked acked, $n_queued still queued "
  . "($n_sched scheduled, $n_held of them claimed)";
cmp_ok($n_pushed, '>=', 300, 'pushes that committed before the kill are there');
is( $q->(
		"SELECT count(*) FROM pushed p
		  WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.id = p.id)
		    AND NOT EXISTS (SELECT 1 FROM acked a WHERE a.id = p.id)"),
	0,
	'no pushed job lost: each is queued or acked');
is( $q->(
		"SELECT count(*) FROM acked a JOIN pgqueue.queue q USING (id)"),
	0,
	'no acked job still queued');
is( $q->(
		"SELECT count(*) FROM acked a WHERE NOT EXISTS (SELECT 1 FROM pushed p WHERE p.id = a.id)"
	),
	0,
	'no acked job that was never pushed');
is( $q->(
		"SELECT count(*) FROM pgqueue.queue q WHERE queue = 'load'
		    AND NOT EXISTS (SELECT 1 FROM pushed p WHERE p.id = q.id)"),
	0,
	'no queued job whose push did not commit');
is( $q->(
		"SELECT count(*) FROM pgqueue.queue q FULL JOIN pgqueue.work_queue w USING (id)
		  WHERE (q.state = 'scheduled') IS DISTINCT FROM (w.id IS NOT NULL)"),
	0,
	'state scheduled exactly for the jobs in work_queue');
is($q->("SELECT count(*) FROM pgqueue.queue WHERE state = 'failed'"),
	0, 'no job failed');

# The crashed consumers restart: release their claims, drain everything.
is( $q->(
		"SELECT sum(pgq_release('worker' || i)) FROM generate_series(0, 3) i"),
	$n_held,
	'pgq_release gives back every job claimed but not acked at the crash');
ok($node->poll_query_until('postgres', 'SELECT drain()'),
	'every remaining job is scheduled, claimed and acked once');
is( $q->(
		"SELECT count(*) FROM pushed p FULL JOIN acked a USING (id)
		  WHERE p.id IS NULL OR a.id IS NULL"),
	0,
	'in the end: acked = pushed, exactly');
is($q->("SELECT count(*) FROM pgqueue.queue WHERE queue = 'later'"),
	5, 'and the 5 jobs due tomorrow are still waiting');
note sprintf('kill -9 postmaster: server and scheduler back after %.2fs', $dt);

$node->stop;
done_testing();
