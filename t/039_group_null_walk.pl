# Groups (1.2): the turn of a grouped queue's jobs without a group walks
# queue_ready_idx from the queue's head and passes the rows of its groups.
# A full walk of the SCHED bound (every second or so) used to lower the
# head back to the start, and the next turn passed every row of the
# queue's groups again: at 100,000 groups a tenth of a pass's time.  The
# head is now kept through a full walk while the pass's notes were read and
# the rows passed outnumber the jobs the groups' turns took, for at most
# 10 s (src/schedule.c, pgq_refresh_all; PGQ_GNULL_MAX_USECS).
#
# The scheduler is off: one session runs the passes (pgq_schedule), so that
# its view of the queues lasts from pass to pass; the index entries each
# pass reads from every slot's queue_ready_idx are counted (statistics of
# its own transaction).  500 groups of 24 jobs under group_max_in_flight =
# 1; between passes, every released job is claimed and acked, so that
# every pass rounds all the groups (and takes the turn without a group).
#
#   (a) the first pass releases one job of each group and walks the rows;
#   (b) passes 1.1 s apart for 8.5 s: the SCHED bound is walked in full
#       meanwhile (counted in the log), yet no pass walks the rows again;
#   (c) a job without a group pushed below the head (a higher priority)
#       by another session is released by the next pass (the notes);
#   (d) once 10 s have passed since the head was lowered, a pass after a
#       full walk walks the rows again (the bound on a kept head);
#   (e) a pass rolled back with its subtransaction (ROLLBACK TO SAVEPOINT)
#       took a job without a group below the head, and no note says it is
#       pending again: the next pass releases it (the rollback makes the
#       session's view walk everything again);
#   (f) every group full, the queue waiting for a place: a job without a
#       group pushed below the head by a PREPAREd transaction (COMMIT
#       PREPARED leaves no note) is released by the queue's recheck, about
#       10 s after its last round, even when that recheck is not a full
#       walk of the bound (it once waited for the next recheck, 20 s).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $node = pgq_node(
	'group_null_walk', q{
pgqueue.enabled = off
autovacuum = off
log_min_messages = debug1
max_prepared_transactions = 2
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

my $ngroups = 500;
my $per_group = 24;
$node->safe_psql('postgres', qq{
SELECT pgq_configure('g', group_max_in_flight => 1);
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'grp-' || g))
  FROM generate_series(1, $per_group) n, generate_series(1, $ngroups) g;
});

my $passer = $node->background_psql('postgres');

# One pass in $passer: the jobs it released, and the entries of every
# slot's queue_ready_idx its transaction read.
sub sched_pass
{
	my $out = $passer->query_safe(q{
BEGIN;
CREATE TEMP TABLE before AS
  SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) AS n
    FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
   WHERE s.nspname = 'pgqueue' AND c.relname ~ '^queue_[0-9]+_ready_idx$';
SELECT pgq_schedule(10000) AS released,
       (SELECT sum(pg_stat_get_xact_tuples_returned(c.oid))
          FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
         WHERE s.nspname = 'pgqueue' AND c.relname ~ '^queue_[0-9]+_ready_idx$') - n
  FROM before;
DROP TABLE before;
COMMIT;});
	my @lines = grep { /^\d+\|-?\d+$/ } split /\n/, $out;
	die "no pass result in: $out" unless @lines;
	return split /\|/, $lines[-1];
}

# Claim and ack every released job of g (so that each group has a place).
sub ack_released
{
	return $node->safe_psql('postgres', q{
SELECT coalesce(pgq_ack_batch(array_agg(id), 'w'), 0)
  FROM pgq_claim('w', 10000, '1 hour', ARRAY['g'])});
}

# Is the job whose payload has key $k released (in work_queue)?
sub released
{
	my ($k) = @_;
	return $node->safe_psql('postgres', qq{
SELECT count(*) FROM pgqueue.work_queue w JOIN pgqueue.jobs j USING (id)
 WHERE j.payload ? '$k'});
}

my $walk_re = qr/full walk of the SCHED bound took/;

# --- (a) ------------------------------------------------------------------------
my $lowered_at = time;
my ($released, $read) = sched_pass();
is($released, $ngroups, '(a) the first pass releases one job of each group');
cmp_ok($read, '>=', ($per_group - 1) * $ngroups,
	'(a) ... walking the rows of the groups (entries read)');

# --- (b) ------------------------------------------------------------------------
my $offset = -s $node->logfile;
my $passes = 0;
my $max_read = 0;
my @reads;
my $sum_released = 0;
my $first_quiet = time;
while (time - $first_quiet < 8.5)
{
	ack_released();
	usleep(1_100_000);
	if ($passes == 2)
	{
		# (c) below the head: a higher priority than every job of g
		$node->safe_psql('postgres', q{SELECT pgq_push('g', '{"alone": true}', priority => 5)});
	}
	($released, $read) = sched_pass();
	$passes++;
	if ($passes == 3)
	{
		is(released('alone'), '1',
			'(c) a job without a group pushed below the head is released by the next pass');
	}
	$sum_released += $released;
	push @reads, $read;
	# the pass after (c)'s push walks from the job's key, below the rows
	$max_read = $read if $read > $max_read && $passes != 3;
}
note("entries read by the passes of (b): @reads");
cmp_ok($passes, '>=', 5, "(b) $passes passes in 8.5 s");
cmp_ok(log_count($node, $walk_re, $offset), '>=', 1,
	'(b) the SCHED bound was walked in full meanwhile');
cmp_ok($sum_released, '>=', $passes * $ngroups,
	'(b) every pass released a job of each group');
cmp_ok($max_read, '<', 100, "(b) no pass walked the rows of the groups again (at most $max_read entries)");

# --- (d) ------------------------------------------------------------------------
my $walked_at;
while (time - $lowered_at < 20)
{
	ack_released();
	usleep(1_100_000);
	($released, $read) = sched_pass();
	if ($read >= 2000)
	{
		$walked_at = time - $lowered_at;
		last;
	}
}
ok(defined $walked_at, '(d) a pass walks the rows again once the bound on a kept head has passed');
cmp_ok($walked_at // 0, '>=', 10, '(d) ... not before 10 s');

# --- (e) ------------------------------------------------------------------------
ack_released();
$node->safe_psql('postgres', q{SELECT pgq_push('g', '{"e": true}', priority => 5)});
my $out = $passer->query_safe(q{
BEGIN;
SAVEPOINT s;
SELECT pgq_schedule(10000) > 0 AS took;
ROLLBACK TO SAVEPOINT s;
COMMIT;});
like($out, qr/^t$/m, '(e) the pass in the savepoint took jobs');
is(released('e'), '0', '(e) ... undone by ROLLBACK TO SAVEPOINT');
# this pass's round ends with every group full (nothing acked from now on)
$offset = -s $node->logfile;
sched_pass();
is(released('e'), '1', '(e) the next pass releases the job without a group');

# --- (f) ------------------------------------------------------------------------
my $wait_re = qr/queue "g": every group with a due job is full, waiting for a place to be freed/;
cmp_ok(log_count($node, $wait_re, $offset), '>=', 1, '(f) every group is full: the queue waits');
my $t0 = time;
$node->safe_psql('postgres', q{
BEGIN;
SELECT pgq_push('g', '{"f": true}', priority => 5);
PREPARE TRANSACTION 'f';
COMMIT PREPARED 'f';});
# passes 0.1 s apart: most are not full walks of the bound (due a second
# after the last one), so the recheck is most often not one either
my $took;
while (time - $t0 < 30)
{
	usleep(100_000);
	sched_pass();
	if ($passer->query_safe(q{
SELECT count(*) FROM pgqueue.work_queue w JOIN pgqueue.jobs j USING (id)
 WHERE j.payload ? 'f'}) eq '1')
	{
		$took = time - $t0;
		last;
	}
}
ok(defined $took, '(f) the job pushed by a prepared transaction is released');
cmp_ok($took // 99, '<=', 12.5,
	sprintf('(f) ... by the recheck about 10 s after the last round (%.1f s)', $took // 99));

$passer->quit;
$node->stop;
done_testing();
