# Streaming replication: a hot standby runs no launcher and no scheduler
# (both are registered with BgWorkerStart_RecoveryFinished) and cannot
# schedule; jobs pushed on
# the primary replicate and stay pending there; after promotion the
# standby's scheduler starts by itself and schedules them.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $primary = pgq_node('primary', "pgqueue.naptime = '100ms'\n",
	allows_streaming => 1);
$primary->start;
wait_for_scheduler($primary, 'postgres');
$primary->safe_psql(
	'postgres', q{
CREATE EXTENSION pgqueue;
SELECT pgq_push('q', '{"before": "backup"}');
});
$primary->poll_query_until('postgres',
	'SELECT count(*) = 1 FROM pgqueue.work_queue')
  or die 'primary does not schedule';

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
# the standby keeps pgqueue.enabled on; only its naptime differs
$standby->append_conf('postgresql.conf', "pgqueue.naptime = '1h'\n");
$standby->start;

# Stop scheduling on the primary (ALTER SYSTEM is not replicated), so that
# the jobs pushed from now on stay pending, and wait until its scheduler
# has stopped making passes.
$primary->safe_psql('postgres',
	"ALTER SYSTEM SET pgqueue.enabled = off; SELECT pg_reload_conf();");
wait_passes_stable($primary, 'postgres', 300);
$primary->safe_psql('postgres',
	"SELECT count(pgq_push('q', jsonb_build_object('i', i))) FROM generate_series(1, 5) i"
);
$primary->wait_for_catchup($standby);

# --- the standby ------------------------------------------------------------
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'),
	't', 'standby is in recovery');
is( $standby->safe_psql(
		'postgres',
		"SELECT state || ':' || count(*) FROM pgqueue.queue GROUP BY state ORDER BY 1"),
	"pending:5\nscheduled:1",
	'jobs replicated: 1 scheduled on the primary, 5 pending');

# Give a scheduler every chance to show up (it would within about a second).
usleep(1_500_000);
is(scheduler_count($standby, 'postgres') + scheduler_count($standby, undef),
	0, 'no scheduler process on the standby');
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgqueue launcher'"),
	0,
	'no launcher either');
is($standby->safe_psql('postgres', 'SELECT scheduler_passes FROM pgq_counters()'),
	0, 'no scheduling pass on the standby');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM pgqueue.queue WHERE state = 'pending'"),
	5, 'the pending jobs stay pending there');
my ($ret, $out, $err) = $standby->psql('postgres', 'SELECT pgq_schedule()');
isnt($ret, 0, 'pgq_schedule fails on the standby');
like($err, qr/read-only transaction/, 'with a read-only transaction error');
($ret, $out, $err) = $standby->psql('postgres', "SELECT * FROM pgq_claim('s')");
like($err, qr/read-only transaction/, 'so does pgq_claim');
is(log_count($standby, qr/pgqueue scheduler started/), 0,
	'standby log: no scheduler started');

# --- promotion --------------------------------------------------------------
my $t0 = time;
$standby->promote;
my $pid = wait_for_scheduler($standby, 'postgres');
ok($pid, 'after promotion a scheduler starts on the new primary');
ok(wait_for_launcher($standby), 'started by a launcher');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) = 6 FROM pgqueue.work_queue"),
	'and schedules the pending jobs');
my $dt = time - $t0;
cmp_ok($dt, '<', 10, sprintf('%.1fs from promote to scheduled', $dt));
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM pgq_claim('new-primary', 10)"),
	6,
	'all 6 jobs are claimable on the new primary');
my $id = $standby->safe_psql('postgres', "SELECT pgq_push('q', '{\"after\": \"promotion\"}')");
ok( $standby->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
	'a new push is scheduled there (woken by the commit, naptime 1 h)');
is(scheduler_count($standby, 'postgres'), 1, 'one scheduler on the new primary');
is(log_count($standby, pgq_failure_re()),
	0, 'standby log: nothing of pgqueue that looks like a failure');
note sprintf('promotion to scheduled: %.2fs', $dt);

$standby->stop;
$primary->stop;
done_testing();
