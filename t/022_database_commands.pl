# A database named in pgqueue.database stays usable
# as a template, and can be renamed, moved to another tablespace and
# dropped, while its scheduler runs.  Such a command fails when another
# session is connected to the database it acts on, and the scheduler is
# connected from start to end (even before CREATE EXTENSION); pgqueue's
# utility hook (src/hook.c) holds the scheduler off while the command runs
# and lets it start again afterwards, whether the command succeeded or
# failed, or its session died.
#
# On fd91433 every command below failed with "being accessed by other
# users", and the schedulers never stopped.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my @dbs = qw(postgres template1 plain ren gone moved);
my $node = pgq_node(
	'dbcommands', q{
pgqueue.naptime = '200ms'
max_worker_processes = 16
});
# the databases made first, then named in pgqueue.database
$node->start;
$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(plain ren gone moved);
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
$node->append_conf('postgresql.conf',
	"pgqueue.database = 'postgres, template1, plain, ren, gone, moved'\n");
$node->restart;
my %pid;
$pid{$_} = wait_for_scheduler($node, $_) for @dbs;
my $launcher = wait_for_launcher($node);
pass('a scheduler runs in each of ' . join(', ', @dbs));
my $offset = -s $node->logfile;

# Wait (at most 10 s) until the server log from $offset on matches $re.
sub logged
{
	my ($re) = @_;
	for (1 .. 100)
	{
		return 1 if log_count($node, $re, $offset) > 0;
		usleep(100_000);
	}
	return 0;
}

# Wait (at most $secs) until the scheduler of $db is another process than
# $old; returns its pid, or '' when none came.
sub scheduler_back
{
	my ($db, $old, $secs) = @_;
	my $deadline = time + ($secs // 15);
	while (time < $deadline)
	{
		my $now = $node->safe_psql('postgres', qq{
SELECT pid FROM pg_stat_activity
 WHERE backend_type = 'pgqueue scheduler' AND datname = '$db' AND pid <> $old});
		return $now if $now ne '';
		usleep(100_000);
	}
	return '';
}

# --- CREATE DATABASE from a template that has pgqueue and jobs ---------------
my $id = $node->safe_psql('postgres', q{SELECT pgq_push('q', '{"n": "copied"}')});
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'postgres: a job is scheduled');
my ($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x1 TEMPLATE postgres');
is($ret, 0, 'CREATE DATABASE x1 TEMPLATE postgres succeeds while its scheduler runs');
is($err, '', 'and says nothing') or diag($err);
($ret, $out, $err) = $node->psql('x1', "SELECT payload->>'n' FROM pgqueue.jobs WHERE id = '$id'");
is($out, 'copied', 'x1 is a copy of postgres, pgqueue and its jobs included');
my $new = scheduler_back('postgres', $pid{postgres});
ok($new, 'the scheduler of postgres is back afterwards (a new process)');
$pid{postgres} = $new || $pid{postgres};
$id = $node->safe_psql('postgres', q{SELECT pgq_push('q', '{"n": "after"}')});
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'and schedules jobs');

# --- from a template without pgqueue ---------------------------------------------
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x2 TEMPLATE plain');
is($ret, 0, 'CREATE DATABASE x2 TEMPLATE plain (no extension in it) succeeds') or diag($err);
$new = scheduler_back('plain', $pid{plain});
ok($new, 'the scheduler of plain is back afterwards');
$pid{plain} = $new || $pid{plain};

# --- template1 in pgqueue.database: a plain CREATE DATABASE ----------------------
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x3');
is($ret, 0, 'CREATE DATABASE x3 (from template1, which has a scheduler) succeeds') or diag($err);
$new = scheduler_back('template1', $pid{template1});
ok($new, 'the scheduler of template1 is back afterwards');
$pid{template1} = $new || $pid{template1};

# --- a CREATE DATABASE that fails releases the hold ------------------------------
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x1 TEMPLATE postgres');
like($err, qr/database "x1" already exists/, 'CREATE DATABASE of an existing name fails');
$new = scheduler_back('postgres', $pid{postgres});
ok($new, 'the scheduler of postgres was stopped for it, and is back');
$pid{postgres} = $new || $pid{postgres};

# another session connected to the template: the command fails after
# CREATE DATABASE's own wait of 5 s, naming that session only
my $user = $node->background_psql('plain');
$user->query_safe('SELECT 1');
my $t0 = time;
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x4 TEMPLATE plain');
like($err, qr/source database "plain" is being accessed by other users\nDETAIL:  There is 1 other session using the database/,
	'with a user connected to the template, CREATE DATABASE fails, counting that session alone');
$new = scheduler_back('plain', $pid{plain});
ok($new, 'the scheduler of plain is back after the failure');
$pid{plain} = $new || $pid{plain};

# the holding session dies while its command waits
my $creator = $node->background_psql('postgres', on_error_stop => 0);
my $creator_pid = $creator->query_safe('SELECT pg_backend_pid()');
$creator->query_until(qr/creating/, "\\echo creating\nCREATE DATABASE x5 TEMPLATE plain;\n");
my $gone = 0;
for (1 .. 100)
{
	$gone = scheduler_count($node, 'plain') == 0;
	last if $gone;
	usleep(100_000);
}
ok($gone, 'a CREATE DATABASE that waits for a session holds the scheduler of plain off');
$node->safe_psql('postgres', "SELECT pg_terminate_backend($creator_pid)");
$new = scheduler_back('plain', $pid{plain});
ok($new, 'its session terminated: the scheduler of plain is back');
$pid{plain} = $new || $pid{plain};
$creator->{run}->kill_kill;    # its psql lost its connection
$user->quit;

# --- a role that may not run the command does not stop a scheduler -------------
$node->safe_psql('postgres', 'CREATE ROLE nobody LOGIN');
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE x6 TEMPLATE postgres',
	extra_params => [ '-U', 'nobody' ]);
like($err, qr/permission denied to create database/, 'a role without CREATEDB cannot copy postgres');
usleep(500_000);
is(scheduler_pid($node, 'postgres'), $pid{postgres}, 'and the scheduler of postgres did not stop');

# --- ALTER DATABASE ... SET TABLESPACE -------------------------------------------
my $dir = PostgreSQL::Test::Utils::tempdir_short();
$node->safe_psql('postgres', "CREATE TABLESPACE ts LOCATION '$dir'");
($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE moved SET TABLESPACE ts');
is($ret, 0, 'ALTER DATABASE moved SET TABLESPACE succeeds while its scheduler runs') or diag($err);
is($node->safe_psql('postgres', q{
SELECT t.spcname FROM pg_database d JOIN pg_tablespace t ON t.oid = d.dattablespace WHERE d.datname = 'moved'}),
	'ts', 'the database is in the new tablespace');
$new = scheduler_back('moved', $pid{moved});
ok($new, 'the scheduler of moved is back afterwards');

# --- ALTER DATABASE ... RENAME ------------------------------------------------------
my $missing_ren = qr/pgqueue launcher: database "ren" named in pgqueue.database does not exist/;
($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE ren RENAME TO ren2');
is($ret, 0, 'ALTER DATABASE ren RENAME TO ren2 succeeds while its scheduler runs') or diag($err);
ok(logged($missing_ren), 'the launcher says "ren" does not exist any more');

# --- DROP DATABASE -------------------------------------------------------------------
my $missing_gone = qr/pgqueue launcher: database "gone" named in pgqueue.database does not exist/;
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE gone');
is($ret, 0, 'DROP DATABASE gone (without FORCE) succeeds while its scheduler runs') or diag($err);
ok(logged($missing_gone), 'the launcher says "gone" does not exist');

# --- no crash loop, nothing that looks like a failure ----------------------------
sleep 3;
is(log_count($node, $missing_ren, $offset), 1, '"ren" is said missing once, not in a loop');
is(log_count($node, $missing_gone, $offset), 1, '"gone" is said missing once');
is(scheduler_count($node, 'ren2'), 0, 'ren2 gets no scheduler (pgqueue.database names ren)');
is(launcher_pid($node), $launcher, 'the launcher never restarted');
is(log_count($node, pgq_failure_re(), $offset), 0,
	'no pgqueue process logged anything that looks like a failure');
like(slurp_file($node->logfile, $offset),
	qr/LOG:  pgqueue: stopping the scheduler of database "postgres" for CREATE DATABASE/,
	'the command said it stopped the scheduler');
for my $db (qw(postgres template1 plain moved))
{
	is(scheduler_count($node, $db), 1, "$db: one scheduler at the end");
}

$node->stop;
done_testing();
