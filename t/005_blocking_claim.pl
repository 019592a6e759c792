# Blocking claims: pgq_claim(..., wait => interval) sleeps until a
# committing push has been scheduled (the scheduler's pass broadcasts a
# condition variable), until a lease runs out, or until wait ends; it can
# be cancelled.  naptime is 1 h, so every wake-up here is event driven.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = pgq_node('claim', "pgqueue.naptime = '1h'\n");
$node->start;
wait_for_scheduler($node, 'postgres');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

my $timeout = $PostgreSQL::Test::Utils::timeout_default;

# Start $sql (a blocking pgq_claim) in a background session and wait until
# it sleeps inside pgq_claim.  Returns the session and its backend's pid.
sub start_blocked_claim
{
	my ($sql) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	my $bpid = $s->query_safe('SELECT pg_backend_pid()');
	$s->query_until(qr/claiming/, "\\echo claiming\n$sql\n");
	$node->poll_query_until(
		'postgres', qq{
SELECT wait_event_type = 'Extension' AND state = 'active'
  FROM pg_stat_activity WHERE pid = $bpid})
	  or die 'claim did not block';
	return ($s, $bpid);
}

# Pump session $s until its stdout (or stderr) matches $re; return it.
sub wait_output
{
	my ($s, $re, $stream) = @_;
	$stream //= 'stdout';
	my $t = IPC::Run::timer($timeout);
	$t->start;
	$s->{run}->pump until $s->{$stream} =~ $re || $t->is_expired;
	die "timed out waiting for $re in $stream: $s->{$stream}" if $t->is_expired;
	return $s->{$stream};
}

# Columns printed by the background claims below: the claimed id, then the
# claim time (the lease start: lock_timeout - lease) as epoch.
my $claim_cols =
  q{id, extract(epoch FROM lock_timeout - interval '30 seconds') AS claimed_at};

# --- a blocked claim returns soon after a push commits ----------------------
my ($s, $bpid) = start_blocked_claim(
	"SELECT 'got', $claim_cols FROM pgq_claim('a', 1, '30 seconds', NULL, '10 seconds');");
my $blocked_since = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM query_start) FROM pg_stat_activity WHERE pid = $bpid");
usleep(300_000);    # it really waits
my ($id, $pushed_at) = split /\|/, $node->safe_psql(
	'postgres', q{
BEGIN;
SELECT pgq_push('q', '{"n": 1}'), extract(epoch FROM clock_timestamp());
COMMIT;
});
my $out = wait_output($s, qr/^got\|/m);
my (undef, $got, $claimed_at) = split /\|/, (split /\n/, $out)[0];
is($got, $id, 'the blocked claim returns the job pushed by another session');
my $latency = $claimed_at - $pushed_at;
cmp_ok($latency, '>=', 0, 'claimed after the push');
cmp_ok($latency, '<', 2,
	sprintf('claimed %.3fs after the push (naptime 1 h, wait 10 s)', $latency));
cmp_ok($claimed_at - $blocked_since, '>', 0.3, 'after blocking for a while');
$s->quit;
$node->safe_psql('postgres', "SELECT pgq_ack('$id', 'a')");
note sprintf('blocked claim: returned %.3fs after the push', $latency);

# --- nothing to do: returns empty once the wait is over ---------------------
my ($n, $elapsed) = split /\|/, $node->safe_psql(
	'postgres', q{
SELECT clock_timestamp() AS t0 \gset
SELECT count(*), extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)
  FROM pgq_claim('b', 1, '30 seconds', NULL, '1 second');
});
is($n, 0, 'with nothing to do a claim waiting 1 s returns nothing');
cmp_ok($elapsed, '>=', 1.0, sprintf('after %.3fs (at least 1 s)', $elapsed));
cmp_ok($elapsed, '<',  2.0, 'and not much more');

# --- statement_timeout cancels a blocked claim cleanly ----------------------
my ($ret, $stdout, $stderr) = $node->psql(
	'postgres', q{
SET statement_timeout = '500ms';
SELECT clock_timestamp() AS t0 \gset
SELECT * FROM pgq_claim('c', 1, '30 seconds', NULL, '10 seconds');
SELECT 'cancelled after', extract(epoch FROM clock_timestamp() - :'t0'::timestamptz);
RESET statement_timeout;
-- the same session: a new push gets scheduled and wakes a new blocking claim
SELECT pgq_push('q', '{"n": 2}') AS id2 \gset
SELECT 'claimed', id = :'id2' FROM pgq_claim('c', 1, '30 seconds', NULL, '5 seconds');
SELECT 'acked', pgq_ack(:'id2', 'c');
},
	on_error_stop => 0);
like($stderr, qr/canceling statement due to statement timeout/,
	'statement_timeout cancels a blocked claim');
my ($cancelled_after) = $stdout =~ /^cancelled after\|([\d.]+)$/m;
ok( defined $cancelled_after && $cancelled_after >= 0.5 && $cancelled_after < 3,
	sprintf('after %.3fs (timeout 0.5 s, wait 10 s)', $cancelled_after // -1));
like($stdout, qr/^claimed\|t$/m,
	'the same session then blocks and claims again normally');
like($stdout, qr/^acked\|t$/m, 'and acks');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pgqueue.work_queue'),
	0, 'the cancelled claim took nothing');

# --- pg_cancel_backend too --------------------------------------------------
($s, $bpid) = start_blocked_claim(
	"SELECT 'got', $claim_cols FROM pgq_claim('d', 1, '30 seconds', NULL, '30 seconds');");
my $t0 = time;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($bpid)");
wait_output($s, qr/canceling statement due to user request/, 'stderr');
my $dt = time - $t0;
cmp_ok($dt, '<', 2, sprintf('pg_cancel_backend ends a blocked claim in %.2fs', $dt));
$s->{stderr} = '';
is($s->query('SELECT 42'), '42', 'and the session is usable');
$s->quit;

# --- an expired lease wakes a waiting claim without any push ----------------
$id = $node->safe_psql('postgres', "SELECT pgq_push('q', '{\"n\": 3}')");
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'")
  or die 'not scheduled';
my $lease_end = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM lock_timeout) FROM pgq_claim('old', 1, '2 seconds')");
ok($lease_end, 'worker "old" claims the job with a 2 s lease');
my $stolen0 = counter($node, 'postgres', 'leases_stolen');
($s, $bpid) = start_blocked_claim(
	"SELECT 'got', $claim_cols, tries FROM pgq_claim('new', 1, '30 seconds', NULL, '10 seconds');");
$out = wait_output($s, qr/^got\|/m);
my (undef, $got2, $claimed2, $tries) = split /\|/, (split /\n/, $out)[0];
is($got2, $id, 'the waiting claim gets the job once its lease ran out');
is($tries, 2, 'as its second try');
my $late = $claimed2 - $lease_end;
cmp_ok($late, '>=', 0, 'not before the lease ended');
cmp_ok($late, '<', 1, sprintf('but %.3fs after it', $late));
is(counter($node, 'postgres', 'leases_stolen'), $stolen0 + 1, 'counted as a stolen lease');
is($node->safe_psql('postgres', "SELECT pgq_ack('$id', 'old')"),
	'f', 'the old holder can no longer ack');
is($node->safe_psql('postgres', "SELECT pgq_ack('$id', 'new')"),
	't', 'the new one can');
$s->quit;
note sprintf('expired lease: stolen %.3fs after the deadline', $late);

# --- a claim that rolls back (or is rolled back to a savepoint) -------------
# The waiting claim skipped the row the other transaction had locked; the
# rollback makes it claimable again and must wake the waiting claim.
for my $how ('ROLLBACK', 'ROLLBACK TO SAVEPOINT s')
{
	$id = $node->safe_psql('postgres', "SELECT pgq_push('q', '{\"n\": 4}')");
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'")
	  or die 'not scheduled';
	my $x = $node->background_psql('postgres');
	is( $x->query_safe(
			"BEGIN; SAVEPOINT s; SELECT id FROM pgq_claim('x', 1, '30 seconds');"),
		$id,
		"$how: an open transaction claims the job");
	($s, $bpid) = start_blocked_claim(
		"SELECT 'got', $claim_cols FROM pgq_claim('w', 1, '30 seconds', NULL, '10 seconds');");
	my $rolled_at = $x->query_safe(
		"SELECT extract(epoch FROM clock_timestamp()); $how;");
	$out = wait_output($s, qr/^got\|/m);
	my (undef, $got3, $claimed3) = split /\|/, (split /\n/, $out)[0];
	is($got3, $id, "$how: the waiting claim gets the job");
	cmp_ok($claimed3 - $rolled_at, '<', 2,
		sprintf('%s: %.3fs after the rollback (wait 10 s)', $how, $claimed3 - $rolled_at));
	$x->query_safe('COMMIT') if $how =~ /SAVEPOINT/;
	$x->quit;
	$s->quit;
	is($node->safe_psql('postgres', "SELECT pgq_ack('$id', 'w')"), 't', "$how: acked");
}

# --- a fast shutdown does not wait for a blocked claim ----------------------
($s, $bpid) = start_blocked_claim(
	"SELECT 'got', $claim_cols FROM pgq_claim('z', 1, '30 seconds', NULL, '60 seconds');");
$t0 = time;
$node->stop('fast');
$dt = time - $t0;
cmp_ok($dt, '<', 5, sprintf('fast shutdown with a claim blocked for 60 s takes %.2fs', $dt));
wait_output($s, qr/terminating connection due to administrator command/, 'stderr');
pass('the blocked claim ends with the shutdown');
$s->{run}->kill_kill;

done_testing();
