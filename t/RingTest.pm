# Helpers of the tests that turn the rings on demand (t/014 to t/027).
# The rings turn only in the scheduler (src/ring.c,
# pgq_ring_maintain): these push jobs until the scheduler has made a new
# slot current, and poll, with a bound of their own, for what a test waits
# for (a test of a defect must not wait 180 s when the defect is there).
#
# Load with:
#   use FindBin;
#   use lib $FindBin::RealBin;
#   use RingTest;
package RingTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(
  current_slot
  slot_state
  row_slot
  poll_bounded
  turn_queue_ring
  turn_work_ring
  lost_jobs
  wait_output
  start_blocked_sql
);

# The slot of ring $tbl ('queue', 'work_queue') that is current (0 before
# the ring first turned: slot 0 has no row in pgqueue.slots until then).
sub current_slot
{
	my ($node, $tbl) = @_;
	return $node->safe_psql('postgres', qq{
SELECT coalesce((SELECT slot FROM pgqueue.slots WHERE tbl = '$tbl' AND state = 'current'), 0)});
}

# The state of slot $slot of ring $tbl ('live' without a row, 'dropped'
# when its table is gone).
sub slot_state
{
	my ($node, $tbl, $slot) = @_;
	return $node->safe_psql('postgres', qq{
SELECT CASE WHEN to_regclass('pgqueue.${tbl}_$slot') IS NULL THEN 'dropped'
            ELSE coalesce((SELECT state FROM pgqueue.slots WHERE tbl = '$tbl' AND slot = $slot),
                          'live') END});
}

# The slot number of the row of job $id in $tbl ('' when there is none).
sub row_slot
{
	my ($node, $tbl, $id) = @_;
	return $node->safe_psql('postgres', "SELECT slot FROM pgqueue.$tbl WHERE id = '$id'");
}

# Poll $sql on database postgres until it returns 't', for at most $secs
# seconds; returns whether it did.
sub poll_bounded
{
	my ($node, $sql, $secs) = @_;
	my $until = time + $secs;
	for (;;)
	{
		my ($ret, $out) = $node->psql('postgres', $sql);
		return 1 if $ret == 0 && $out eq 't';
		return 0 if time > $until;
		usleep(50_000);
	}
}

# Turn the ring of pgqueue.queue: push batches of 100 jobs with 200-byte
# payloads into queue $q (paused by the caller, so that they stay pending
# and nothing of them reaches work_queue) until the scheduler has made
# another slot current.  Returns (the slot current before, the one after).
sub turn_queue_ring
{
	my ($node, $q) = @_;
	my $from = current_slot($node, 'queue');
	for my $batch (1 .. 40)
	{
		$node->safe_psql('postgres', qq{
SELECT count(*) FROM pgq_push_batch('$q', ARRAY(SELECT jsonb_build_object('n', g, 'pad', repeat('x', 200))
                                                 FROM generate_series(1, 100) g))});
		if (poll_bounded($node, qq{
SELECT coalesce((SELECT slot FROM pgqueue.slots WHERE tbl = 'queue' AND state = 'current'), 0) <> $from},
				1))
		{
			return ($from, current_slot($node, 'queue'));
		}
	}
	die "the ring of pgqueue.queue did not turn from slot $from";
}

# Turn the ring of pgqueue.work_queue: push batches of 50 small jobs into
# queue $q (not paused), wait until the scheduler has released them, claim
# and ack them, until the scheduler has made another slot of work_queue
# current.  Returns (the slot current before, the one after).
sub turn_work_ring
{
	my ($node, $q) = @_;
	my $from = current_slot($node, 'work_queue');
	for my $batch (1 .. 60)
	{
		$node->safe_psql('postgres', qq{
SELECT count(*) FROM pgq_push_batch('$q', ARRAY(SELECT jsonb_build_object('n', g)
                                                 FROM generate_series(1, 50) g))});
		poll_bounded($node,
			"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = '$q' AND state = 'pending'", 10)
		  or die "the jobs of $q were not scheduled";
		$node->safe_psql('postgres', qq{
SELECT count(pgq_ack(c.id, 'turner')) FROM pgq_claim('turner', 100, '1 minute', ARRAY['$q']) c});
		if (poll_bounded($node, qq{
SELECT coalesce((SELECT slot FROM pgqueue.slots WHERE tbl = 'work_queue' AND state = 'current'), 0) <> $from},
				0.5))
		{
			return ($from, current_slot($node, 'work_queue'));
		}
	}
	die "the ring of pgqueue.work_queue did not turn from slot $from";
}

# Jobs lost: 'scheduled' in pgqueue.queue without a row in work_queue (no
# claim can ever take them, no pass looks at them again).  Listed as
# "id:queue", one per line, '' when none.
sub lost_jobs
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
SELECT coalesce(string_agg(q.id || ':' || q.queue, E'\n' ORDER BY q.id), '')
  FROM pgqueue.queue q
 WHERE q.state = 'scheduled'
   AND NOT EXISTS (SELECT FROM pgqueue.work_queue w WHERE w.id = q.id)});
}

# Pump background session $s until its $stream (stdout) matches $re, for at
# most $secs seconds; returns what it read, or undef when it timed out.
sub wait_output
{
	my ($s, $re, $secs, $stream) = @_;
	$stream //= 'stdout';
	my $t = IPC::Run::timer($secs);
	$t->start;
	$s->{run}->pump_nb;
	until ($s->{$stream} =~ $re || $t->is_expired)
	{
		$s->{run}->pump_nb;
		usleep(20_000);
	}
	return $s->{$stream} =~ $re ? $s->{$stream} : undef;
}

# Start $sql in background session $s (it may block: the call returns at
# once); "started" is echoed first, so that its output follows.
sub start_blocked_sql
{
	my ($s, $sql) = @_;
	$s->{stdout} = '';
	$s->{stderr} = '';
	$s->query_until(qr/started/, "\\echo started\n$sql\n\\echo done\n");
	return;
}

1;
