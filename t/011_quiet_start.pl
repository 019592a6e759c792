# A healthy server logs nothing of pgqueue that looks like a failure: not at
# start, not while a database of pgqueue.database waits for CREATE EXTENSION
# or does not exist yet, not on CREATE EXTENSION, DROP EXTENSION, CREATE
# DATABASE, nor at a restart (no "exited with exit code", no ERROR, FATAL,
# PANIC or WARNING from the launcher or a scheduler).  One launcher (shown in
# pg_stat_activity as 'pgqueue launcher', connected to no database) starts a
# scheduler per database; jobs flow through them; kill -9 of a scheduler
# still ends in a crash restart after which everything comes back.  And a
# server that does not preload the library warns of nothing when a backend
# loads it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $failure_re = pgq_failure_re();
my $missing_re =
  qr/pgqueue launcher: database "latedb" named in pgqueue.database does not exist/;

# postgres has the extension, db2 gets it later, latedb does not exist yet
my $node = pgq_node(
	'quiet', q{
pgqueue.database = 'postgres, db2, latedb'
pgqueue.naptime = '200ms'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
$node->safe_psql('postgres', 'CREATE DATABASE db2');
$node->stop;

# everything from here on is this test's (the log is measured while stopped)
my $offset = -s $node->logfile;
my $t0 = time;
$node->start;

# Return the log lines from $from on that a pgqueue process wrote, and the
# postmaster's lines about processes that ended, for the notes.
sub pgq_lines
{
	my ($from) = @_;
	return join "\n",
	  grep { /\] pgqueue (?:launcher|scheduler) |exited|terminated by|reinitializing/ }
	  split /\n/, slurp_file($node->logfile, $from);
}

# --- a healthy start -----------------------------------------------------------
my $launcher = wait_for_launcher($node);
my $pg = wait_for_scheduler($node, 'postgres');
my $db2 = wait_for_scheduler($node, 'db2');
$node->wait_for_log($missing_re, $offset);
my $dt = time - $t0;
ok($pg && $db2, sprintf('schedulers of postgres and db2 run %.1fs after the start', $dt));
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || ':' || coalesce(datname, '-') FROM pg_stat_activity
		  WHERE backend_type LIKE 'pgqueue%' ORDER BY 1"),
	"pgqueue launcher:-\npgqueue scheduler:db2\npgqueue scheduler:postgres",
	'pg_stat_activity: one pgqueue launcher (no database), one scheduler per existing database'
);
like(
	slurp_file($node->logfile, $offset),
	qr/\[$pg\] pgqueue scheduler LOG:  pgqueue scheduler started for database "postgres"/,
	'the scheduler of postgres says it started');
note "log lines of pgqueue at a healthy start:\n" . pgq_lines($offset);

# --- db2 waits for CREATE EXTENSION, quietly ------------------------------------
usleep(1_000_000);    # five naptimes of passes that find no extension
is(scheduler_pid($node, 'db2'), $db2, 'the scheduler of db2 waits without restarting');
is(log_count($node, $failure_re, $offset), 0,
	'start and waiting for CREATE EXTENSION: nothing that looks like a failure');

# --- CREATE EXTENSION; jobs flow through the schedulers -------------------------
$node->safe_psql('db2', 'CREATE EXTENSION pgqueue');
for my $db ('postgres', 'db2')
{
	my $id = $node->safe_psql($db, "SELECT pgq_push('q', '{\"db\": \"$db\"}')");
	ok( $node->poll_query_until(
			$db, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
		"$db: a pushed job is scheduled by the scheduler");
	is( $node->safe_psql(
			$db, "SELECT id || ' ' || (payload->>'db') FROM pgq_claim('w')"),
		"$id $db",
		"$db: and claimed");
	is($node->safe_psql($db, "SELECT pgq_ack('$id', 'w')"), 't', "$db: and acked");
}

# --- DROP EXTENSION: one LOG line ------------------------------------------------
my $off = -s $node->logfile;
$node->safe_psql('db2', 'DROP EXTENSION pgqueue');
$node->wait_for_log(
	qr/\[$db2\] pgqueue scheduler LOG:  pgqueue scheduler: extension pgqueue is not installed in database "db2" any more/,
	$off);
pass('the scheduler of db2 notices DROP EXTENSION');
usleep(600_000);
is(scheduler_pid($node, 'db2'), $db2, 'and goes on waiting, in the same process');

# --- the missing database is created ---------------------------------------------
$t0 = time;
$node->safe_psql('postgres', 'CREATE DATABASE latedb');
my $late = wait_for_scheduler($node, 'latedb');
$dt = time - $t0;
cmp_ok($dt, '<', 5, sprintf('latedb created: its scheduler runs %.1fs later', $dt));
is(log_count($node, $missing_re, $offset), 1, 'latedb was said missing exactly once');
is(launcher_pid($node), $launcher, 'by the one launcher, never restarted');
is(scheduler_pid($node, 'postgres') . ' ' . scheduler_pid($node, 'db2'),
	"$pg $db2", 'the other schedulers never restarted');
is(log_count($node, $failure_re, $offset), 0,
	'CREATE/DROP EXTENSION, CREATE DATABASE: nothing that looks like a failure');

# --- a restart: shutdown and start are quiet --------------------------------------
$off = -s $node->logfile;
$node->restart;
my $new_launcher = wait_for_launcher($node);
isnt($new_launcher, $launcher, 'restarted: a new launcher');
ok( wait_for_scheduler($node, 'postgres')
	  && wait_for_scheduler($node, 'db2')
	  && wait_for_scheduler($node, 'latedb'),
	'and a scheduler for each of the three databases');
usleep(500_000);
is(log_count($node, $failure_re, $offset), 0,
	'the whole log: nothing of pgqueue that looks like a failure');
my @exits = slurp_file($node->logfile, $offset) =~ /^.*exited with exit code.*$/mg;
is(scalar(grep { !/background worker "logical replication launcher"/ } @exits),
	0,
	'every "exited with exit code" line is the core logical replication launcher\'s at shutdown ('
	  . scalar(@exits) . ')');
is(log_count($node, qr/ERROR|FATAL|PANIC|WARNING/, $offset),
	0, 'and no ERROR, FATAL, PANIC or WARNING from any process');
is(log_count($node, qr/pgqueue scheduler started for database/, $off),
	3, 'the restart: three schedulers started, each once');
note "log lines of pgqueue over the restart:\n" . pgq_lines($off);

# --- kill -9 of a scheduler: crash restart, everything comes back --------------
$node->append_conf('postgresql.conf', "restart_after_crash = on\n");
$node->reload;
my $victim = wait_for_scheduler($node, 'postgres');
$off = -s $node->logfile;
$t0 = time;
kill 'KILL', $victim;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $off);
pass('kill -9 of a scheduler: the postmaster reinitializes');
my $after = wait_for_scheduler($node, 'postgres', $victim);
ok($after && wait_for_scheduler($node, 'db2') && wait_for_scheduler($node, 'latedb'),
	'every scheduler back');
$dt = time - $t0;
cmp_ok($dt, '<', 10, sprintf('%.1fs after the SIGKILL', $dt));
ok(wait_for_launcher($node, $new_launcher), 'under a new launcher');
my $id = $node->safe_psql('postgres', "SELECT pgq_push('q', '{\"after\": \"crash\"}')");
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'a push is scheduled again');
usleep(500_000);
is( $node->safe_psql(
		'postgres',
		"SELECT backend_type || ':' || count(*) FROM pg_stat_activity
		  WHERE backend_type LIKE 'pgqueue%' GROUP BY backend_type ORDER BY backend_type"),
	"pgqueue launcher:1\npgqueue scheduler:3",
	'exactly one launcher and three schedulers');
note "log lines of pgqueue around the kill -9:\n" . pgq_lines($off);

$node->stop;

# --- without preloading: no WARNING about pgqueue.database ---------------------
# A backend that loads the library (here LOAD; CREATE EXTENSION or a call
# does too) defines no pgqueue.database, so it must not reserve the prefix:
# that would remove the setting from postgresql.conf with a WARNING.
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->append_conf('postgresql.conf', "pgqueue.database = 'postgres'\n");
$plain->start;
my ($ret, $out, $err) = $plain->psql('postgres', "LOAD 'pgqueue'; SHOW pgqueue.naptime");
is($out, '1s', 'not preloaded: the library loads and defines its settings');
is($err, '', 'without a WARNING about pgqueue.database');
$plain->stop;
done_testing();
