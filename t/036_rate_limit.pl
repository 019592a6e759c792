# Rate limits (1.2) under the background scheduler, not pgq_schedule calls:
# pgq_configure(queue, rate_limit => N, rate_period => P) lets at most N
# jobs of the queue into work_queue in any window of P (src/rate.c).  The
# scheduler's naptime is 1 h here, so every window after the first is
# released only because the scheduler woke for it (the later heap, src/
# schedule.c), and a queue waiting for its window sees a settings change
# because pgq_configure wakes the scheduler and refreshes its view.
#
#   (a) a backlog of 400 under 20 per 500 ms, read after about 6 s: no
#       window (t - 500 ms, t] of the release times (work_queue.created)
#       holds more than 20, and one holds exactly 20 (the limit was hit);
#   (b) the scheduler released in enough windows: at least 60 % of 20 per
#       500 ms over the time elapsed (loose: CI machines are loaded);
#   (c) an unlimited queue pushed in the same transaction is released at
#       once meanwhile;
#   (d) a queue waiting for a window of 1 minute: raising its limit
#       releases the difference within a couple of seconds, rate_limit => 0
#       releases the rest (and the same for the queue of (a));
#   (e) the window survives a restart of the scheduler (pg_terminate_backend),
#       of the server (fast) and a crash (immediate stop), each right after
#       a burst: the new scheduler passes inside the window and releases
#       nothing more until it frees, and no window holds more than the limit;
#   (f) a released job nacked with retry_in 0 used its share: it is not
#       released again until the window frees.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = pgq_node(
	'rate', q{
pgqueue.naptime = '1h'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
wait_for_scheduler($node, 'postgres');
my $log_offset = -s $node->logfile;

# --- helpers ------------------------------------------------------------------

# The server's clock, in microseconds since the epoch.
sub now_us
{
	return $node->safe_psql('postgres',
		'SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint');
}

# The release times (work_queue.created, microseconds since the epoch) of
# queue $q, in order.
sub releases
{
	my ($q) = @_;
	my $out = $node->safe_psql('postgres', qq{
SELECT (extract(epoch FROM created) * 1000000)::bigint
  FROM pgqueue.work_queue WHERE queue = '$q' ORDER BY created});
	return map { $_ + 0 } grep { $_ ne '' } split /\n/, $out;
}

# How many of queue $q's jobs are in work_queue.
sub released_count
{
	my ($q) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pgqueue.work_queue WHERE queue = '$q'");
}

# The largest number of release times @$t (sorted) in a window
# (t - $period, t], t being each release time.
sub max_window
{
	my ($t, $period) = @_;
	my ($max, $lo) = (0, 0);
	for my $hi (0 .. $#$t)
	{
		$lo++ while $t->[$lo] <= $t->[$hi] - $period;
		$max = $hi - $lo + 1 if $hi - $lo + 1 > $max;
	}
	return $max;
}

# The bursts of @$t (sorted): runs of releases less than $gap apart.
# Returns the times of their first releases.
sub bursts
{
	my ($t, $gap) = @_;
	my @b;
	for my $i (0 .. $#$t)
	{
		push @b, $t->[$i] if $i == 0 || $t->[$i] - $t->[ $i - 1 ] >= $gap;
	}
	return @b;
}

# Push $n jobs to each queue of @queues in one transaction (one wake-up).
sub push_jobs
{
	my ($n, @queues) = @_;
	$node->safe_psql('postgres',
		join('', map { "SELECT count(pgq_push('$_', jsonb_build_object('n', n))) FROM generate_series(1, $n) n;\n" } @queues)
		  =~ s/^/BEGIN;\n/r . "COMMIT;");
}

# Wait until queue $q has at least $n jobs in work_queue.
sub wait_released
{
	my ($q, $n) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) >= $n FROM pgqueue.work_queue WHERE queue = '$q'");
}

# --- (a), (b), (c): 20 per 500 ms with a backlog, an unlimited queue beside --
my ($limit, $period) = (20, 500_000);
$node->safe_psql('postgres',
	"SELECT pgq_configure('rl', rate_limit => $limit, rate_period => '500 milliseconds')");
my $pushed_at = now_us();
push_jobs(400, 'rl', 'free');
ok(wait_released('free', 400), 'the unlimited queue is released');
my $free_done = now_us();
my @free = releases('free');
my @rl_early = releases('rl');
my $free_took = ($free[-1] - $pushed_at) / 1e6;
note sprintf('unlimited queue: 400 released %.3f s after the push', $free_took);
cmp_ok($free_took, '<', 3,
	'(c) the unlimited queue is released at once beside the rate-limited backlog');
cmp_ok(scalar(@rl_early), '<', 400,
	'(c) while the rate-limited queue pushed with it still holds a backlog');

# let the scheduler run about 6 s, nothing claiming
usleep(6_000_000);
my $read_at = now_us();
my @t = releases('rl');
my $elapsed = ($read_at - $t[0]) / 1e6;
my $maxw = max_window(\@t, $period);
my @b = bursts(\@t, $period / 2);
note sprintf('rl: %d released in %.3f s, in %d bursts; largest 500 ms window %d',
	scalar(@t), $elapsed, scalar(@b), $maxw);
note 'bursts (ms after the first): '
  . join(' ', map { sprintf('%.1f', ($_ - $t[0]) / 1000) } @b);
cmp_ok($maxw, '<=', $limit, '(a) no window of 500 ms holds more than 20 releases');
is($maxw, $limit, '(a) and one holds 20: the limit was reached');
my $windows = $elapsed / ($period / 1e6);
cmp_ok(scalar(@b), '>=', int(0.6 * $windows),
	sprintf('(b) the scheduler released in %d windows of the %.1f elapsed (naptime 1 h: it woke for each)',
		scalar(@b), $windows));
cmp_ok(scalar(@t), '>=', int(0.6 * $limit * $windows),
	sprintf('(b) %d released, at least 60 %% of %d', scalar(@t), $limit * $windows));
cmp_ok(scalar(@t), '<', 400, 'a backlog is left (the limit held it)');
is( $node->safe_psql('postgres',
		"SELECT period || ' ' || array_length(counts, 1) FROM pgqueue.rate_windows WHERE queue = 'rl'"),
	"$period 257",
	'the window is kept in pgqueue.rate_windows (257 buckets of the period)');

# rate_limit => 0 releases the rest of rl at once
my $unlimited_at = now_us();
$node->safe_psql('postgres', "SELECT pgq_configure('rl', rate_limit => 0)");
ok(wait_released('rl', 400), 'rate_limit => 0: the rest of rl is released');
@t = releases('rl');
my $rest_took = ($t[-1] - $unlimited_at) / 1e6;
note sprintf('rl: the rest released %.3f s after rate_limit => 0', $rest_took);
cmp_ok($rest_took, '<', 2, '(d) rate_limit => 0 takes effect at once');

# --- (d) raising the limit of a queue waiting for a window of 1 minute --------
$node->safe_psql('postgres',
	"SELECT pgq_configure('slow', rate_limit => 5, rate_period => '1 minute')");
push_jobs(50, 'slow');
ok(wait_released('slow', 5), 'slow: the first 5 are released');
usleep(1_000_000);
is(released_count('slow'), 5, 'slow: then nothing for a second (the window is full)');
my $raised_at = now_us();
$node->safe_psql('postgres', "SELECT pgq_configure('slow', rate_limit => 30)");
ok(wait_released('slow', 30), 'slow: raising the limit to 30 releases 25 more');
my @s = releases('slow');
my $raise_took = ($s[-1] - $raised_at) / 1e6;
note sprintf('slow: 30 released %.3f s after the limit was raised', $raise_took);
cmp_ok($raise_took, '<', 2,
	'(d) a higher limit takes effect within a couple of seconds (not the minute the queue waited for)');
usleep(1_000_000);
is(released_count('slow'), 30, 'slow: and no more than 30 in the minute');
cmp_ok(max_window(\@s, 60_000_000), '<=', 30, 'slow: no window of a minute holds more than 30');
$unlimited_at = now_us();
$node->safe_psql('postgres', "SELECT pgq_configure('slow', rate_limit => 0)");
ok(wait_released('slow', 50), 'slow: rate_limit => 0 releases the rest');
@s = releases('slow');
cmp_ok(($s[-1] - $unlimited_at) / 1e6, '<', 2, '(d) at once');

# --- (e) the window survives the scheduler's and the server's restarts --------
# 10 per 5 s: each restart happens right after a burst, well inside its
# window; the new scheduler's first passes find the window full.
my $rs_period = 5_000_000;
$node->safe_psql('postgres',
	"SELECT pgq_configure('rs', rate_limit => 10, rate_period => '5 seconds')");
push_jobs(100, 'rs');

my @restarts = (
	[
		'scheduler killed (pg_terminate_backend)',
		sub {
			my $old = scheduler_pid($node, 'postgres');
			$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
			wait_for_scheduler($node, 'postgres', $old);
		}
	],
	[ 'server restarted (fast)', sub { $node->restart; } ],
	[
		'server crashed (immediate stop)',
		sub { $node->stop('immediate'); poll_start($node); }
	]);
my $n = 10;
for my $r (@restarts)
{
	my ($what, $do) = @$r;
	ok(wait_released('rs', $n), "rs: a burst of 10 (to $n) before: $what");
	my @before = releases('rs');
	my $burst = $before[-1];
	# the new scheduler's first pass: the counters go on across a
	# scheduler's restart, and start again with the server
	my $p0 = $what =~ /^scheduler/ ? counter($node, 'postgres', 'scheduler_passes') : 0;
	$do->();
	wait_for_scheduler($node, 'postgres');
	$node->poll_query_until('postgres',
		"SELECT scheduler_passes > $p0 FROM pgq_counters()")
	  or die 'the new scheduler runs no pass';
	my $up = now_us();
	note sprintf('%s: the new scheduler passed %.3f s after the burst', $what,
		($up - $burst) / 1e6);
	cmp_ok($up - $burst, '<', $rs_period,
		"$what: the new scheduler passed inside the window");
	is(released_count('rs'), $n, "$what: and released nothing more then");
	$n += 10;
	ok(wait_released('rs', $n), "$what: the next burst comes once the window frees");
	my @after = releases('rs');
	cmp_ok(max_window(\@after, $rs_period), '<=', 10,
		"$what: no window of 5 s holds more than 10");
	cmp_ok($after[$n - 10] - $burst, '>=', $rs_period,
		"$what: the next burst is a period after the one before the restart");
}
my @rs = releases('rs');
my @rs_bursts = bursts(\@rs, $rs_period / 2);
note 'rs bursts (s after the first): '
  . join(' ', map { sprintf('%.3f', ($_ - $rs[0]) / 1e6) } @rs_bursts);
cmp_ok(scalar(@rs_bursts), '>=', 4, 'rs: four bursts seen across the three restarts');
cmp_ok(max_window(\@rs, $rs_period), '<=', 10, 'rs: no window of 5 s holds more than 10');
$log_offset = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pgq_configure('rs', rate_limit => 0)");

# --- (f) a nacked job used its share ------------------------------------------
my $nk_period = 3_000_000;
$node->safe_psql('postgres',
	"SELECT pgq_configure('nk', rate_limit => 3, rate_period => '3 seconds')");
push_jobs(3, 'nk');
ok(wait_released('nk', 3), 'nk: 3 released');
my @k = releases('nk');
my $id = $node->safe_psql('postgres', q{
SELECT id FROM pgq_claim('w', 1, '1 minute', ARRAY['nk'])});
ok($id, 'nk: one claimed');
is($node->safe_psql('postgres', "SELECT pgq_nack('$id', 'w', 'again', retry_in => '0')"),
	'retry', 'nk: and nacked with retry_in 0');
is( $node->safe_psql('postgres',
		"SELECT state FROM pgqueue.jobs WHERE id = '$id'") =~ /^(pending|retry)$/ ? 'ready' : 'not ready',
	'ready', 'nk: the nacked job is ready again');
usleep(1_000_000);
my $waited = now_us();
cmp_ok($waited - $k[-1], '<', $nk_period, 'nk: (still inside the window)');
is(released_count('nk'), 2, 'nk: a second after the nack it is not released again (the window is full)');
ok(wait_released('nk', 3), 'nk: it is released again once the window frees');
my $again = $node->safe_psql('postgres',
	"SELECT (extract(epoch FROM created) * 1000000)::bigint FROM pgqueue.work_queue WHERE id = '$id'");
note sprintf('nk: released again %.3f s after the first burst', ($again - $k[0]) / 1e6);
cmp_ok($again - $k[-1], '>=', $nk_period, '(f) a period after the burst that counted it');
cmp_ok(max_window([ sort { $a <=> $b } @k, $again ], $nk_period), '<=', 3,
	'(f) no window of 3 s holds more than 3 releases, the nacked job counted twice');

# --- (g) pgq_schedule calls racing the background scheduler ---------------------
# A session calls pgq_schedule() in a loop, a transaction each, for about 3 s
# while the scheduler releases queue hc (10 per 200 ms): passes of the queue
# go one at a time (the lock a pass takes, rate.c), whichever process runs them.
my $hc_period = 200_000;
$node->safe_psql('postgres',
	"SELECT pgq_configure('hc', rate_limit => 10, rate_period => '200 milliseconds')");
push_jobs(1000, 'hc');
my ($calls_err, $calls) = ('', 0);
$node->psql('postgres', q{
DO $$
DECLARE
	stop timestamptz := clock_timestamp() + interval '3 seconds';
	n int := 0;
BEGIN
	WHILE clock_timestamp() < stop LOOP
		PERFORM pgq_schedule();
		COMMIT;
		n := n + 1;
		PERFORM pg_sleep(0.002);
	END LOOP;
	RAISE NOTICE 'calls %', n;
END $$;},
	stderr => \$calls_err, on_error_die => 1);
$calls = $1 if $calls_err =~ /calls (\d+)/;
cmp_ok($calls, '>', 100, "(g) $calls pgq_schedule calls in 3 s");
my @h = releases('hc');
my @hb = bursts(\@h, $hc_period / 2);
my $hmax = max_window(\@h, $hc_period);
note sprintf('hc: %d released in %.3f s, %d bursts, largest 200 ms window %d',
	scalar(@h), ($h[-1] - $h[0]) / 1e6, scalar(@hb), $hmax);
cmp_ok($hmax, '<=', 10, '(g) pgq_schedule calls beside the scheduler: no window of 200 ms holds more than 10');
cmp_ok(scalar(@h), '>=', 10 * int(0.6 * 3_000_000 / $hc_period),
	'(g) and the queue was released in most windows');
$node->safe_psql('postgres', "SELECT pgq_configure('hc', rate_limit => 0)");

# --- (h) a pass that found the window taken by another pass ------------------
# An open pgq_schedule() call holds the queue's window (rate.c: the lock a
# pass takes, which no SQL can take otherwise) past the moment its window
# frees: the scheduler's passes release nothing of the queue meanwhile, and
# must come back for it once that transaction ends, not at the next
# naptime (1 h here).
$node->safe_psql('postgres',
	"SELECT pgq_configure('lk', rate_limit => 5, rate_period => '1 second')");
push_jobs(20, 'lk');
$node->poll_query_until('postgres',
	"SELECT count(*) >= 5 FROM pgqueue.work_queue WHERE queue = 'lk'")
  or die 'lk: the first window was not released';
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
$holder->query_safe('SELECT pgq_schedule()');
my $held = released_count('lk');
note "lk: $held released when the open pass began";
# the window frees within a second; the scheduler wakes for it and finds
# the window taken
usleep(1_800_000);
is(released_count('lk'), $held, '(h) lk: nothing released while an open pass holds its window');
my $freed_at = now_us();
$holder->query_safe('COMMIT');
$holder->quit;
# (10 s at most: the naptime is 1 h)
my @l;
for (1 .. 100)
{
	last if (@l = grep { $_ > $freed_at } releases('lk'));
	usleep(100_000);
}
ok(scalar(@l), '(h) lk: released once the other pass is gone');
note sprintf('lk: %d released after the open pass ended, the first %.3f s after',
	scalar(@l), @l ? ($l[0] - $freed_at) / 1e6 : -1);
cmp_ok(@l ? ($l[0] - $freed_at) / 1e6 : 1e9, '<', 2,
	'(h) lk: within 2 s (not at the next naptime)');
$node->safe_psql('postgres', "SELECT pgq_configure('lk', rate_limit => 0)");

# --- no errors ---------------------------------------------------------------
is(log_count($node, qr/\] pgqueue (?:launcher|scheduler) (?:ERROR|PANIC|WARNING):/, 0),
	0, 'the scheduler logged no error');
is(log_count($node, pgq_exit_re(), $log_offset), 0,
	'no pgqueue process exited after the restarts');

$node->stop;
done_testing();
