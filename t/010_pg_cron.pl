# Periodic jobs from pg_cron (Debian's postgresql-15-cron) on a real server
# that preloads pg_cron and pgqueue: the recipe of docs/user-guide.md ("Periodic jobs with pg_cron"), scheduled twice
# (the same period fires twice), pushes one job for the minute; pgqueue's
# scheduler and a worker run it; the period firing again after the job was
# acked pushes nothing either.  (Periods in general, one job per period
# and the next period's job: sql/periodic.sql.)
#
# pg_cron fires at minute boundaries: this test waits up to a minute or two.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pgq_node(
	'cron', q{
shared_preload_libraries = 'pg_cron,pgqueue'
cron.database_name = 'postgres'
cron.use_background_workers = on
max_worker_processes = 16
pgqueue.naptime = '50ms'
});
my $libdir = $node->config_data('--pkglibdir');
BAIL_OUT("pg_cron is not installed in $libdir (apt-get install postgresql-15-cron; scripts/test.sh does)")
  unless -f "$libdir/pg_cron.so";
$node->start;
wait_for_scheduler($node, 'postgres');

$node->safe_psql('postgres', q{
CREATE EXTENSION pg_cron;
CREATE EXTENSION pgqueue;
SELECT pgq_configure('reports', retention => '1 day');
});

# the recipe, twice: two schedules firing in the same minute
my $command = q{SELECT pgq_push_periodic('reports', 'minutely', '1 minute', '{"kind": "minutely"}')};
$node->safe_psql('postgres', qq{
SELECT cron.schedule('minutely', '* * * * *', \$cmd\$$command\$cmd\$);
SELECT cron.schedule('minutely-again', '* * * * *', \$cmd\$$command\$cmd\$);
});

ok( $node->poll_query_until('postgres', q{
SELECT count(*) = 2 FROM cron.job_run_details d JOIN cron.job j USING (jobid)
 WHERE j.jobname LIKE 'minutely%' AND d.status = 'succeeded'}),
	'both schedules fired and succeeded');
# no more firings while we look
$node->safe_psql('postgres', q{
SELECT cron.unschedule('minutely'); SELECT cron.unschedule('minutely-again')});
# the firings of one minute; a third one would be of the next minute's period
my $minute = $node->safe_psql('postgres', q{
SELECT date_bin('1 minute', min(start_time), '2000-01-01 00:00+00') FROM cron.job_run_details});
is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM cron.job_run_details
 WHERE date_bin('1 minute', start_time, '2000-01-01 00:00+00') = '$minute'}),
	'2', 'two firings in one minute');

is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.jobs WHERE queue = 'reports'}),
	'1', 'one job for the minute');
is( $node->safe_psql('postgres', qq{
SELECT dedup_key = 'minutely\@' || to_char('$minute'::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
  FROM pgqueue.queue WHERE queue = 'reports'}),
	't', 'its dedup_key names the minute');
my $job = $node->safe_psql('postgres', q{SELECT job FROM pgqueue.periodic WHERE name = 'minutely'});

# pgqueue's scheduler schedules it, a worker runs it
ok( $node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pgqueue.jobs WHERE queue = 'reports' AND state = 'scheduled'}),
	'the scheduler schedules it');
is( $node->safe_psql('postgres', q{
SELECT id || ':' || (payload->>'kind') || ':' || pgq_ack(id, 'worker') FROM pgq_claim('worker')}),
	"$job:minutely:true", 'a worker claims and acks it');

# the period fires again after its job was acked: nothing new (in the next
# minute, if we got there meanwhile, the next period's one job)
my ($same, $again) = split /\|/, $node->safe_psql('postgres', qq{
SELECT date_bin('1 minute', now(), '2000-01-01 00:00+00') = '$minute', ($command) = '$job'});
if ($same eq 't')
{
	is($again, 't', 'a firing after the ack returns the same job');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.jobs WHERE queue = 'reports'}),
		'0', 'and pushes nothing');
}
else
{
	is($again, 'f', 'a firing in the next minute pushes its job');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.jobs WHERE queue = 'reports'}),
		'1', 'one');
}
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.archive WHERE queue = 'reports' AND outcome = 'acked'}),
	'1', 'the acked job is in the archive');
is($node->safe_psql('postgres', q{SELECT count(*) FROM cron.job_run_details WHERE status <> 'succeeded'}),
	'0', 'no firing failed');

$node->stop;
done_testing();
