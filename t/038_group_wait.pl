# Groups (1.2) under the background scheduler: a grouped queue whose every
# group with a due job is full is not walked again at every pass.  It waits
# until a commit frees a place (an ack, a nack that fails the job, a cancel,
# a purge of jobs in retry, a pgq_configure), a job is pushed into it, or its
# recheck time (10 s here) comes (src/schedule.c, pgq_take_grouped).  The
# scheduler's naptime is 1 h, so every pass here is one a commit woke.
#
#   (a) five groups of three jobs under group_max_in_flight = 1: one job of
#       each released, then the queue waits (its DEBUG1 line, counted);
#   (b) ten passes woken by pushes into another queue (counted with
#       pgq_counters().scheduler_passes) do not walk it again: no new wait
#       line, nothing more released;
#   (c) each way of freeing a place releases the group's next job well
#       before the recheck (6 s): an ack, a nack on the last try, a cancel,
#       a purge of a job waiting to retry, pgq_configure raising the limit;
#       and each time the scheduler says it rounds again (counted).
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
	'group_wait', q{
pgqueue.naptime = '1h'
log_min_messages = debug1
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
wait_for_scheduler($node, 'postgres');

my $wait_re = qr/queue "g": every group with a due job is full, waiting for a place to be freed/;
my $again_re = qr/queue "g": places were freed, its groups take turns again/;

# Released (in work_queue) jobs of group $g: their payloads' n, sorted.
sub released
{
	my ($g) = @_;
	return $node->safe_psql('postgres', qq{
SELECT string_agg(j.payload->>'n', ',' ORDER BY (j.payload->>'n')::int)
  FROM pgqueue.work_queue w JOIN pgqueue.jobs j USING (id)
 WHERE w.queue = 'g' AND j.group_key = '$g'});
}

# Wait until $cond (SQL, true/false) holds; returns the seconds it took, or
# undef after $max s.
sub seconds_until
{
	my ($cond, $max) = @_;
	my $t0 = time;
	while (time - $t0 < $max)
	{
		return time - $t0 if $node->safe_psql('postgres', "SELECT $cond") eq 't';
		usleep(50_000);
	}
	return undef;
}

# --- (a) ------------------------------------------------------------------------
my $offset = -s $node->logfile;
$node->safe_psql('postgres', q{
SELECT pgq_configure('g', group_max_in_flight => 1);
SELECT pgq_push('g', jsonb_build_object('n', n), group_key => 'grp-' || g,
                max_tries => CASE WHEN g = 2 THEN 1 END)
  FROM generate_series(1, 5) g, generate_series(1, 3) n ORDER BY n, g;
});
ok(defined seconds_until(q{(SELECT count(*) FROM pgqueue.work_queue WHERE queue = 'g') = 5}, 30),
	'(a) one job of each of the five groups released');
my $waits;
for (1 .. 100)
{
	$waits = log_count($node, $wait_re, $offset);
	last if $waits > 0;
	# a pass after the releases rounds the full groups
	$node->safe_psql('postgres', q{SELECT pgq_push('other', '{}')});
	usleep(100_000);
}
cmp_ok($waits, '>=', 1, '(a) the queue waits for a place (its DEBUG1 line)');

# --- (b) ------------------------------------------------------------------------
my $passes = wait_passes_stable($node, 'postgres');
$waits = log_count($node, $wait_re, $offset);
for (1 .. 10)
{
	$node->safe_psql('postgres', q{SELECT pgq_push('other', '{}')});
	usleep(150_000);
}
my $passes2 = wait_passes_stable($node, 'postgres');
cmp_ok($passes2 - $passes, '>=', 5, '(b) the pushes into another queue woke passes');
is(log_count($node, $wait_re, $offset), $waits,
	'(b) those passes did not walk the waiting queue again');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.work_queue WHERE queue = 'g'}),
	'5', '(b) nothing more released');

# --- (c) ------------------------------------------------------------------------
# Each way of freeing a place: the group's next job released within 6 s
# (the recheck is 10 s), and the scheduler's line that it rounds again.
sub frees
{
	my ($what, $g, $sql, $expect) = @_;
	my $again = log_count($node, $again_re, $offset);
	$node->safe_psql('postgres', $sql);
	my $took = seconds_until(qq{(SELECT string_agg(j.payload->>'n', ',' ORDER BY (j.payload->>'n')::int)
  FROM pgqueue.work_queue w JOIN pgqueue.jobs j USING (id)
 WHERE w.queue = 'g' AND j.group_key = '$g') = '$expect'}, 6);
	ok(defined $took, "(c) $what: the group's next job released")
	  or diag("released of $g: " . released($g));
	cmp_ok(log_count($node, $again_re, $offset), '>', $again,
		"(c) $what: the scheduler rounded the groups again");
}

# claim everything released, so that the jobs can be acked, nacked...
$node->safe_psql('postgres', q{SELECT count(*) FROM pgq_claim('w', 100, '1 hour', ARRAY['g'])});

sub job_of
{
	my ($g, $n) = @_;
	return $node->safe_psql('postgres',
		"SELECT id FROM pgqueue.jobs WHERE group_key = '$g' AND payload->>'n' = '$n'");
}

frees('an ack', 'grp-1', "SELECT pgq_ack('" . job_of('grp-1', 1) . "', 'w')", '2');
frees('a nack on the last try', 'grp-2',
	"SELECT pgq_nack('" . job_of('grp-2', 1) . "', 'w', 'boom')", '2');
frees('a cancel', 'grp-3', "SELECT pgq_cancel('" . job_of('grp-3', 1) . "')", '2');

# a job waiting to retry holds its group's place: the purge of it frees it
$node->safe_psql('postgres',
	"SELECT pgq_nack('" . job_of('grp-4', 1) . "', 'w', 'later', retry_in => '1 hour')");
# its commit woke a pass that found the group full again (the retry holds it)
usleep(500_000);
is(released('grp-4'), '', 'the job in retry holds grp-4 (nothing released)');
frees('a purge of the job in retry', 'grp-4', q{SELECT pgq_purge('g', 'retry')}, '2');

frees('raising the limit', 'grp-5', q{SELECT pgq_configure('g', group_max_in_flight => 2)},
	'1,2');

$node->stop;
done_testing();
