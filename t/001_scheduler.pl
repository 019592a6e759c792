# The scheduler background worker: jobs flow from push to claim with no
# manual pgq_schedule, woken by the push's commit (naptime is 1 h here);
# a rolled-back push does not wake it; one scheduler per database; the
# extension created, dropped and created again while the server runs; a
# database named in pgqueue.database that does not exist yet, or does not
# allow connections, or is dropped (DROP DATABASE ... WITH (FORCE)): one log
# line, no crash loop, and its scheduler starts once the database is there.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $missing_re =
  qr/database "latedb" named in pgqueue.database does not exist/;
my $noconn_re =
  qr/database "noconn" named in pgqueue.database does not allow connections/;
my $exit_re = qr/background worker "pgqueue scheduler" \(PID \d+\) exited/;

my $node = pgq_node(
	'sched', q{
pgqueue.database = 'postgres, db2, latedb, noconn'
pgqueue.naptime = '1h'
});
$node->start;

# db2 and noconn exist when the server starts, latedb is created later.
$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->safe_psql('postgres', 'CREATE DATABASE noconn ALLOW_CONNECTIONS false');
my $log_offset = -s $node->logfile;
$node->restart;
# errors are counted from here: the restart's shutdown logs FATALs of its own
my $run_offset = -s $node->logfile;

# --- one scheduler per database, shown in pg_stat_activity ------------------
my $pid = wait_for_scheduler($node, 'postgres');
ok($pid, "scheduler of database postgres is running (pid $pid)");
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || '/' || datname FROM pg_stat_activity WHERE pid = $pid"
	),
	'pgqueue scheduler/postgres',
	'it shows in pg_stat_activity with backend_type "pgqueue scheduler"');
my $pid2 = wait_for_scheduler($node, 'db2');
ok($pid2, "scheduler of database db2 is running (pid $pid2)");

# the schedulers of latedb and noconn wait, connected to no database, and
# say why
$node->wait_for_log($missing_re, $log_offset);
$node->wait_for_log($noconn_re, $log_offset);
my $waiting_since = time;
$node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM pg_stat_activity
	  WHERE backend_type = 'pgqueue scheduler' AND datname IS NULL")
  or die 'no waiting schedulers';
my $waiting_sql = "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity
	WHERE backend_type = 'pgqueue scheduler' AND datname IS NULL";
my $waiting_pids = $node->safe_psql('postgres', $waiting_sql);
# from here on no scheduler should exit until latedb is created
my $watch_offset = -s $node->logfile;
is( $node->safe_psql(
		'postgres',
		"SELECT coalesce(datname, '-') || ':' || count(*) FROM pg_stat_activity
		  WHERE backend_type = 'pgqueue scheduler' GROUP BY datname ORDER BY 1"
	),
	"-:2\ndb2:1\npostgres:1",
	'one scheduler per database (those of latedb and noconn not connected)');

# --- without the extension the scheduler waits quietly ----------------------
# A reload wakes it for a pass, which finds no extension.
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
usleep(300_000);
is(scheduler_pid($node, 'postgres'),
	$pid, 'scheduler without the extension keeps running');
is(log_count($node, qr/ERROR|FATAL|PANIC/, $run_offset),
	0, 'and logs no error');

# --- created after server start: a push is scheduled at once ----------------
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
my $id = $node->safe_psql('postgres', "SELECT pgq_push('q1', '{\"n\": 1}')");
my $t0 = time;
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'pushed job gets scheduled without pgq_schedule (naptime 1 h)');
my $waited = time - $t0;
my $latency = $node->safe_psql(
	'postgres',
	"SELECT extract(epoch FROM w.created - q.created)
	   FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
	  WHERE id = '$id'");
cmp_ok($latency, '<', 1.0,
	"scheduled ${latency}s after the push (the commit woke the scheduler)");
is( $node->safe_psql(
		'postgres', "SELECT id || ' ' || (payload->>'n') FROM pgq_claim('c1')"),
	"$id 1",
	'the job is claimable');
is($node->safe_psql('postgres', "SELECT pgq_ack('$id', 'c1')"),
	't', 'and acked');
note sprintf('push to scheduled: %.3fs in SQL, %.3fs polled', $latency,
	$waited);

# --- a rolled-back push does not wake the scheduler -------------------------
my $passes = wait_passes_stable($node, 'postgres');
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT pgq_push('q1', '{"rolled": "back"}');
ROLLBACK;
});
usleep(1_000_000);
is(counter($node, 'postgres', 'scheduler_passes'),
	$passes, 'no scheduling pass after a rolled-back push');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pgqueue.queue'),
	0, 'and no job');

# while a committed one does: exactly one more pass
$id = $node->safe_psql('postgres', "SELECT pgq_push('q1', '{\"n\": 2}')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'a committed push is scheduled');
is(wait_passes_stable($node, 'postgres'),
	$passes + 1, 'by exactly one more pass');
$node->safe_psql('postgres',
	"SELECT pgq_ack(id, 'c1') FROM pgq_claim('c1', 10)");

# --- a second database has its own scheduler and its jobs flow too ----------
$node->safe_psql('db2', 'CREATE EXTENSION pgqueue');
my $id_db2 = $node->safe_psql('db2', "SELECT pgq_push('q2', '{\"db\": 2}')");
my $id_pg = $node->safe_psql('postgres', "SELECT pgq_push('q1', '{\"db\": 1}')");
ok( $node->poll_query_until(
		'db2', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id_db2'"),
	'job pushed in db2 gets scheduled there');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id_pg'"),
	'job pushed in postgres gets scheduled there');
cmp_ok(
	$node->safe_psql(
		'db2',
		"SELECT extract(epoch FROM w.created - q.created)
		   FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)"),
	'<', 1.0,
	'db2: scheduled within a second of the push');
is( $node->safe_psql(
		'db2', "SELECT id || ' ' || (payload->>'db') FROM pgq_claim('c2')"),
	"$id_db2 2",
	'db2: claim returns the db2 job');
is($node->safe_psql('db2', "SELECT pgq_ack('$id_db2', 'c2')"), 't', 'db2: ack');
is($node->safe_psql('postgres', "SELECT id FROM pgq_claim('c1')"),
	$id_pg, 'postgres: claim returns only the postgres job');
is( $node->safe_psql('postgres',
		"SELECT pgq_ack('$id_pg', 'c1')"),
	't',
	'postgres: ack');
is(scheduler_pid($node, 'postgres'), $pid, 'postgres scheduler never restarted');
is(scheduler_pid($node, 'db2'), $pid2, 'db2 scheduler never restarted');

# --- DROP EXTENSION, then CREATE EXTENSION again ----------------------------
$node->safe_psql('postgres', 'DROP EXTENSION pgqueue');
my $off = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');    # wake it: a pass
$node->wait_for_log(
	qr/extension pgqueue is not installed in database "postgres" any more/,
	$off);
pass('scheduler noticed the dropped extension');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
$id = $node->safe_psql('postgres', "SELECT pgq_push('q1', '{\"n\": 3}')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'after DROP and CREATE EXTENSION a push is scheduled again');
is($node->safe_psql('postgres', "SELECT id FROM pgq_claim('c1')"),
	$id, 'and claimable');
is(scheduler_pid($node, 'postgres'), $pid,
	'by the same scheduler process');
is(log_count($node, qr/ERROR|FATAL|PANIC/, $run_offset),
	0, 'no error in the server log');

# --- a database that does not exist or does not allow connections ----------
# Wait until the waiting schedulers have checked again a few times (every
# second): still one log line each, and no process restarts.
my $left = $waiting_since + 3.5 - time;
usleep($left * 1_000_000) if $left > 0;
is(log_count($node, $missing_re, $log_offset),
	1, 'missing database: logged exactly once');
is(log_count($node, $noconn_re, $log_offset),
	1, 'database without connections: logged exactly once');
is($node->safe_psql('postgres', $waiting_sql),
	$waiting_pids, 'by two waiting processes that are not restarted');
is(log_count($node, $exit_re, $watch_offset), 0, 'no scheduler exited meanwhile');

# once created (or allowing connections), their schedulers start
$t0 = time;
$node->safe_psql('postgres', 'CREATE DATABASE latedb');
$node->safe_psql('postgres', 'ALTER DATABASE noconn ALLOW_CONNECTIONS true');
$node->safe_psql('latedb', 'CREATE EXTENSION pgqueue');
$node->safe_psql('noconn', 'CREATE EXTENSION pgqueue');
$id = $node->safe_psql('latedb', "SELECT pgq_push('q3')");
my $id4 = $node->safe_psql('noconn', "SELECT pgq_push('q4')");
my $pid3 = wait_for_scheduler($node, 'latedb');
ok($pid3, 'latedb created: its scheduler starts');
ok(wait_for_scheduler($node, 'noconn'),
	'noconn allows connections: its scheduler starts');
ok( $node->poll_query_until(
		'latedb', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'latedb: the job pushed before its scheduler started gets scheduled');
ok( $node->poll_query_until(
		'noconn', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id4'"),
	'noconn: likewise');
my $late = time - $t0;
cmp_ok($late, '<', 10, sprintf('%.1fs from CREATE DATABASE to scheduled', $late));
is(scheduler_count($node, undef), 0, 'no scheduler waits for a database any more');
is(log_count($node, $missing_re, $log_offset),
	1, 'still a single "does not exist" line');

# --- a database dropped under its scheduler ---------------------------------
# (a plain DROP DATABASE fails while the scheduler is connected to it)
$off = -s $node->logfile;
$node->safe_psql('postgres', 'DROP DATABASE latedb WITH (FORCE)');
$node->wait_for_log($missing_re, $off);
pass('latedb dropped: its scheduler goes back to waiting for it');
my $waiting = wait_for_scheduler($node, undef);
my $watch2 = -s $node->logfile;
usleep(2_500_000);
is(log_count($node, $missing_re, $off), 1, 'saying so once');
is(scheduler_pid($node, undef), $waiting, 'in one process that is not restarted');
is(log_count($node, $exit_re, $watch2), 0, 'no scheduler exited meanwhile');
is(scheduler_pid($node, 'postgres'), $pid, 'postgres scheduler unaffected');

$node->stop;
done_testing();
