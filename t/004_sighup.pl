# The scheduler reloads pgqueue.naptime, pgqueue.enabled and
# pgqueue.batch_size on SIGHUP (ALTER SYSTEM + pg_reload_conf()), without a
# restart.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = pgq_node('sighup', "pgqueue.naptime = '1h'\n");
$node->start;
my $pid = wait_for_scheduler($node, 'postgres');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

sub set_and_reload
{
	my ($name, $value) = @_;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET pgqueue.$name = '$value'; SELECT pg_reload_conf();");
}

# scheduler_passes and the time it was read, in seconds
sub passes_at
{
	return split /\|/,
	  $node->safe_psql('postgres',
		'SELECT scheduler_passes, extract(epoch FROM clock_timestamp()) FROM pgq_counters()'
	  );
}

# --- naptime ----------------------------------------------------------------
# The first pass after CREATE EXTENSION needs a wake-up (naptime is 1 h).
my $p0 = wait_passes_stable($node, 'postgres');
usleep(1_000_000);
is(counter($node, 'postgres', 'scheduler_passes'),
	$p0, 'naptime 1 h: no pass in a second');

set_and_reload('naptime', '100ms');
ok( $node->poll_query_until(
		'postgres', "SELECT scheduler_passes >= $p0 + 5 FROM pgq_counters()"),
	'after a reload with naptime 100 ms passes come by themselves');
my ($pa, $ta) = passes_at();
usleep(2_000_000);
my ($pb, $tb) = passes_at();
my $rate = ($pb - $pa) / ($tb - $ta);
note sprintf('naptime 100ms: %d passes in %.2fs (%.1f/s)',
	$pb - $pa, $tb - $ta, $rate);
cmp_ok($rate, '>', 3,  'about 10 passes a second (more than 3)');
cmp_ok($rate, '<', 12, 'about 10 passes a second (fewer than 12)');

set_and_reload('naptime', '1h');
$p0 = wait_passes_stable($node, 'postgres');
usleep(1_000_000);
is(counter($node, 'postgres', 'scheduler_passes'),
	$p0, 'naptime back to 1 h: passes stop again');

# --- enabled = off stops scheduling, on resumes it --------------------------
set_and_reload('naptime', '100ms');
$node->poll_query_until('postgres',
	"SELECT scheduler_passes >= $p0 + 3 FROM pgq_counters()")
  or die 'no passes with naptime 100ms';
set_and_reload('enabled', 'off');
$p0 = wait_passes_stable($node, 'postgres', 300);
pass('enabled = off: passes stop although naptime is 100 ms');
$node->safe_psql('postgres',
	"SELECT count(pgq_push('q', jsonb_build_object('i', i))) FROM generate_series(1, 3) i"
);
usleep(1_000_000);
is($node->safe_psql('postgres', 'SELECT count(*) FROM pgqueue.work_queue'),
	0, 'enabled = off: pushed jobs stay pending (10 naptimes later)');
is(counter($node, 'postgres', 'scheduler_passes'),
	$p0, 'enabled = off: the push woke it, but it made no pass');

my $t0 = time;
set_and_reload('enabled', 'on');
ok( $node->poll_query_until(
		'postgres', 'SELECT count(*) = 3 FROM pgqueue.work_queue'),
	'enabled = on: the jobs get scheduled');
my $dt = time - $t0;
cmp_ok($dt, '<', 2, sprintf('%.2fs after the reload', $dt));
$node->safe_psql('postgres',
	"SELECT count(pgq_ack(id, 'c')) FROM pgq_claim('c', 10)");

# --- batch_size; a full pass is followed by another at once ------------------
set_and_reload('naptime', '1h');
set_and_reload('batch_size', '2');
$p0 = wait_passes_stable($node, 'postgres');
$node->safe_psql('postgres',
	"SELECT count(pgq_push('b', jsonb_build_object('i', i))) FROM generate_series(1, 10) i"
);
ok( $node->poll_query_until(
		'postgres', 'SELECT count(*) = 10 FROM pgqueue.work_queue'),
	'batch_size 2, naptime 1 h: 10 jobs pushed in one commit all get scheduled');
is( $node->safe_psql(
		'postgres',
		'SELECT count(DISTINCT created) || \' \' || max(batch_order) FROM pgqueue.work_queue'),
	'5 2',
	'in 5 batches of 2');
is(wait_passes_stable($node, 'postgres'),
	$p0 + 6, 'by 6 passes: 5 full ones back to back, then one that found nothing');

# --- one reload turns scheduling on and lowers batch_size -------------------
# 10 jobs wait while enabled is off and batch_size is 100.  The reload that
# turns scheduling on also sets batch_size 3: the first pass uses the new
# size, so it is full and more passes follow at once (naptime is 1 h).
$node->safe_psql('postgres',
	"SELECT count(pgq_ack(id, 'c')) FROM pgq_claim('c', 100)");
set_and_reload('enabled',    'off');
set_and_reload('batch_size', '100');
wait_passes_stable($node, 'postgres');
usleep(300_000);    # let the scheduler read batch_size 100
$node->safe_psql('postgres',
	"SELECT count(pgq_push('r', jsonb_build_object('i', i))) FROM generate_series(1, 10) i"
);
$node->safe_psql(
	'postgres', q{
ALTER SYSTEM SET pgqueue.batch_size = 3;
ALTER SYSTEM SET pgqueue.enabled = on;
SELECT pg_reload_conf();
});
my $all = 0;
for (1 .. 50)
{
	$all = $node->safe_psql('postgres',
		"SELECT count(*) = 10 FROM pgqueue.work_queue WHERE queue = 'r'");
	last if $all eq 't';
	usleep(100_000);
}
is($all, 't', 'all 10 waiting jobs get scheduled within 5 s');
is( $node->safe_psql(
		'postgres',
		"SELECT string_agg(n::text, ',' ORDER BY c) FROM
		   (SELECT created c, count(*) n FROM pgqueue.work_queue
		     WHERE queue = 'r' GROUP BY created) b"),
	'3,3,3,1',
	'in batches of 3 (the new batch_size)');

is(scheduler_pid($node, 'postgres'), $pid, 'all of this without a restart of the scheduler');
is(log_count($node, qr/ERROR|FATAL|PANIC/), 0, 'no error in the server log');

$node->stop;
done_testing();
