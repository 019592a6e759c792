# The scheduler background worker: jobs flow from push to claim with no
# manual pgq_schedule, woken by the push's commit (naptime is 1 h here);
# a rolled-back push does not wake it; a job not yet due wakes it when it
# becomes due; one scheduler per database, started by the launcher; the
# extension created, dropped and created again while the server runs; a
# database named in pgqueue.database that does not exist yet, or does not
# allow connections, or is dropped (DROP DATABASE ... WITH (FORCE)): one log
# line from the launcher, no crash loop, and its scheduler starts once the
# database is there.
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
my $exit_re = pgq_exit_re();

my $node = pgq_node(
	'sched', q{
pgqueue.database = 'postgres, db2, latedb, noconn'
pgqueue.naptime = '1h'
});
$node->start;

# db2 and noconn exist when the server starts, latedb is created later.
$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->safe_psql('postgres', 'CREATE DATABASE noconn ALLOW_CONNECTIONS false');
# The log is measured while the server is stopped: the launcher of the first
# run looks for noconn once a second and says that it does not allow
# connections up to a second after CREATE DATABASE, so an offset taken while
# it runs could come before that line ("logged exactly once" then saw two).
$node->stop;
my $log_offset = -s $node->logfile;
$node->start;
my $run_offset = $log_offset;

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

# latedb and noconn have no scheduler: the launcher says why
$node->wait_for_log($missing_re, $log_offset);
$node->wait_for_log($noconn_re, $log_offset);
my $waiting_since = time;
my $launcher = wait_for_launcher($node);
like(
	slurp_file($node->logfile, $log_offset),
	qr/\[$launcher\] pgqueue launcher LOG:  pgqueue launcher: database "latedb" named in pgqueue.database does not exist/,
	'the launcher says that latedb does not exist');
# from here on no scheduler should start or exit until latedb is created
my $watch_offset = -s $node->logfile;
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || ':' || coalesce(datname, '-') || ':' || count(*)
		   FROM pg_stat_activity WHERE backend_type LIKE 'pgqueue%'
		  GROUP BY backend_type, datname ORDER BY 1"
	),
	"pgqueue launcher:-:1\npgqueue scheduler:db2:1\npgqueue scheduler:postgres:1",
	'one launcher, connected to no database, and one scheduler per existing database');

# --- without the extension the scheduler waits quietly ----------------------
# A reload wakes it for a pass, which finds no extension.
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
usleep(300_000);
is(scheduler_pid($node, 'postgres'),
	$pid, 'scheduler without the extension keeps running');
is(log_count($node, qr/ERROR|FATAL|PANIC/, $run_offset),
	0, 'and logs no error');
is(log_count($node, $exit_re, $log_offset), 0,
	'no pgqueue process exited since the start');

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

# --- a job not yet due: the scheduler wakes when it becomes due -------------
# (naptime is 1 h; the push's commit wakes it for a pass that finds the job
# not yet due, and the next pass is timed by its run_after)
$id = $node->safe_psql('postgres',
	"SELECT pgq_push('q1', '{\"n\": \"later\"}', clock_timestamp() + interval '1500 ms')");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'a job pushed 1.5 s ahead is scheduled (naptime 1 h)');
my $late_by = $node->safe_psql(
	'postgres',
	"SELECT extract(epoch FROM w.created - q.run_after)
	   FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
	  WHERE id = '$id'");
cmp_ok($late_by, '>=', 0, 'not before its run_after');
cmp_ok($late_by, '<', 3, "but ${late_by}s after it, not a naptime (1 h) later");
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
is(launcher_pid($node), $launcher, 'by the launcher, which is not restarted');
is(log_count($node, qr/pgqueue scheduler started|$exit_re/, $watch_offset),
	0, 'no scheduler started or exited meanwhile');

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
is(scheduler_count($node, undef), 0, 'no scheduler without a database');
is(log_count($node, $missing_re, $log_offset),
	1, 'still a single "does not exist" line');

# --- a database dropped under its scheduler ---------------------------------
# (a plain DROP DATABASE fails while the scheduler is connected to it)
$off = -s $node->logfile;
$node->safe_psql('postgres', 'DROP DATABASE latedb WITH (FORCE)');
$node->wait_for_log($missing_re, $off);
pass('latedb dropped: its scheduler stops, the launcher waits for the database');
is(scheduler_count($node, 'latedb') + scheduler_count($node, undef),
	0, 'no scheduler for latedb');
my $watch2 = -s $node->logfile;
usleep(2_500_000);
is(log_count($node, $missing_re, $off), 1, 'saying so once');
is(launcher_pid($node), $launcher, 'the launcher is not restarted');
is(log_count($node, qr/pgqueue scheduler started|$exit_re/, $watch2),
	0, 'no scheduler started or exited meanwhile');
is(scheduler_pid($node, 'postgres'), $pid, 'postgres scheduler unaffected');
is(log_count($node, qr/ERROR|FATAL|PANIC|WARNING/, $run_offset),
	0, 'no ERROR, FATAL, PANIC or WARNING in the server log since the start');
is(log_count($node, $exit_re, $log_offset), 0,
	'no pgqueue process exited with a non-zero code');

$node->stop;
done_testing();
