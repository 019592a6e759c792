# A call that sees the ring as it was when its
# transaction first called pgqueue.  The scheduler turns the rings (a new
# current slot, rows moved from old slots, emptied slots truncated and
# free) between two calls of one transaction, or while a blocking claim
# waits; every later call of that transaction must see the turn:
#
# - defect 1: a filtered blocking claim waiting across a turn of queue's
#   ring gets the job pushed after the turn (it once found the work row
#   but not the job row, deleted the work row, and the job stayed
#   'scheduled' with no work row, lost);
# - defect 2: in a transaction that called pgqueue before a turn, a
#   filtered pgq_claim gets a job pushed after it, pgq_nack gives back a
#   job pushed after it, pgq_ack finishes (and archives) a job pushed after
#   it, and pgq_ack finishes a held job whose work row the scheduler moved
#   to a slot made current after it (they answered nothing, NULL, true
#   with the job row left and no archive row, and false; the first three
#   deleted the work row: the job was lost);
# - defect 3: a push in a transaction that called pgqueue before the slot
#   then current was emptied, truncated and made free is written where the
#   scheduler finds it, and is scheduled (it once went into the free slot,
#   where no pass looks).
#
# Each part checks that the turn it needs did happen (a race whose window
# never opened would prove nothing), and that no job is left 'scheduled'
# without its work_queue row.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('turn_in_call');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

sub slot_rows
{
	return q1(q{
SELECT coalesce(string_agg(tbl || ' ' || slot || ':' || state || ':' || n, ', ' ORDER BY tbl, slot), '')
  FROM (SELECT s.tbl, s.slot, s.state,
               CASE WHEN s.tbl = 'queue' THEN (SELECT count(*) FROM pgqueue.queue q WHERE q.slot = s.slot)
                    ELSE (SELECT count(*) FROM pgqueue.work_queue w WHERE w.slot = s.slot) END AS n
          FROM pgqueue.slots s) x});
}

# queues whose pushes turn queue's ring and stay pending
q1(q{SELECT pgq_configure('p', paused => true)});
q1(q{SELECT pgq_configure('other', paused => true)});

# Both rings past slot 0 (work_queue's slot 0 is another matter: t/016).
turn_work_ring($node, 'fw');
turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});

# A background session that has run $sql before (so that the catalog
# entries its parsing needs are cached: a cache miss would lock a catalog
# and read every invalidation sent so far), then opens a transaction and
# calls pgqueue in it ($first).
sub open_session
{
	my ($sql, $first) = @_;
	my $s = $node->background_psql('postgres');
	$s->query_safe($sql);
	$s->query_safe('BEGIN');
	$s->query_safe($first);
	return $s;
}

sub scheduled
{
	my ($id) = @_;
	return poll_bounded($node,
		"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'", 20);
}

my $nil = '00000000-0000-0000-0000-000000000000';

# --- defect 1: a blocking claim waiting across a turn ---------------------------
{
	my $w = $node->background_psql('postgres');
	my $bpid = $w->query_safe('SELECT pg_backend_pid()');
	start_blocked_sql($w,
		q{SELECT 'got', id FROM pgq_claim('wA', 1, '5 minutes', ARRAY['x'], '20 seconds');});
	ok( poll_bounded($node, qq{
SELECT wait_event_type = 'Extension' AND state = 'active' FROM pg_stat_activity WHERE pid = $bpid},
			20),
		'defect 1: a claim of queue x waits (20 s)');
	my ($from, $to) = turn_queue_ring($node, 'p');
	isnt($to, $from, "defect 1: queue's ring turned from slot $from to slot $to while it waits");
	my $x = q1(q{SELECT pgq_push('x', '{"job": "x"}')});
	is(row_slot($node, 'queue', $x), $to, "defect 1: job x pushed into slot $to");
	ok(poll_bounded($node, "SELECT state <> 'pending' FROM pgqueue.queue WHERE id = '$x'", 20),
		'defect 1: job x released by the scheduler');
	my $out = wait_output($w, qr/^done$/m, 30) // $w->{stdout};
	like($out, qr/^got\|\Q$x\E$/m, 'defect 1: the waiting claim got job x');
	is(lost_jobs($node), '', "defect 1: no job left 'scheduled' without its work_queue row");
	is(q1(qq{SELECT count(*) FROM pgqueue.work_queue WHERE id = '$x' AND lock_key = 'wA'}),
		'1', 'defect 1: job x is held by the claim that waited');
	is(q1(qq{SELECT pgq_ack('$x', 'wA')}), 't', 'defect 1: and acked by it');
	$w->quit;
}

# --- defect 2: calls in a transaction that began before a turn ------------------
{
	# job h: held for an hour, its work row in the current slot of work_queue
	my $h = q1(q{SELECT pgq_push('h', '{"job": "h"}')});
	ok(scheduled($h), 'defect 2: job h scheduled');
	is(q1(q{SELECT count(*) FROM pgq_claim('wH', 1, '1 hour', ARRAY['h'])}),
		'1', 'defect 2: job h held by wH for an hour');
	my $h_slot = row_slot($node, 'work_queue', $h);

	my $claim_y = q{SELECT id FROM pgq_claim('wS', 1, '5 minutes', ARRAY['y'])};
	my $push = q{SELECT pgq_push('other', '{}')};
	my $sc = open_session($claim_y, $push);
	my $sn = open_session("SELECT pgq_nack('$nil', 'wN', 'boom', '0 seconds')", $push);
	my $sa = open_session("SELECT pgq_ack('$nil', 'wH')", $push);
	q1(q{SELECT pgq_configure('k', retention => '1 day')});
	my $sk = open_session("SELECT pgq_ack('$nil', 'wK')", $push);

	my ($from, $to) = turn_queue_ring($node, 'p');
	isnt($to, $from, "defect 2: queue's ring turned from slot $from to slot $to");
	my $y = q1(q{SELECT pgq_push('y', '{"job": "y"}')});
	my $n = q1(q{SELECT pgq_push('n', '{"job": "n"}')});
	my $k = q1(q{SELECT pgq_push('k', '{"job": "k"}')});
	is( row_slot($node, 'queue', $y) . ',' . row_slot($node, 'queue', $n) . ',' . row_slot($node, 'queue', $k),
		"$to,$to,$to", "defect 2: jobs y, n and k pushed into slot $to");
	ok(scheduled($y) && scheduled($n) && scheduled($k), 'defect 2: all three scheduled');
	is(q1(q{SELECT count(*) FROM pgq_claim('wN', 1, '1 hour', ARRAY['n'])}),
		'1', 'defect 2: job n held by wN');
	is(q1(q{SELECT count(*) FROM pgq_claim('wK', 1, '1 hour', ARRAY['k'])}),
		'1', 'defect 2: job k held by wK');

	is($sc->query_safe($claim_y), $y,
		'defect 2: pgq_claim of queue y in the transaction gets job y');
	is($sn->query_safe("SELECT pgq_nack('$n', 'wN', 'boom', '0 seconds')"),
		'retry', 'defect 2: pgq_nack of job n by its holder, in the transaction: retry');
	$sc->query_safe('COMMIT');
	$sn->query_safe('COMMIT');
	is(lost_jobs($node), '', "defect 2: no job left 'scheduled' without its work_queue row");
	is(q1(qq{SELECT lock_key FROM pgqueue.work_queue WHERE id = '$y'}),
		'wS', 'defect 2: job y is held by the claim of the transaction');
	is(q1(qq{SELECT pgq_ack('$y', 'wS')}), 't', 'defect 2: and acked by it');
	# given back: retry (due now), or scheduled again (with its work row)
	like( q1(qq{
SELECT coalesce(string_agg(q.state::text || CASE WHEN w.id IS NULL THEN '' ELSE ' in work_queue' END, ','), 'gone')
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w ON w.id = q.id WHERE q.id = '$n'}),
		qr/^(retry|pending|scheduled in work_queue)$/,
		'defect 2: job n was given back by the nack');

	# what t/019 saw under load (defect 14): an ack that answers true, writes
	# no archive row and leaves the job 'scheduled' with no work row
	is($sk->query_safe("SELECT pgq_ack('$k', 'wK')"),
		't', 'defect 2: pgq_ack of job k by its holder, in the transaction: true');
	$sk->query_safe('COMMIT');
	is( q1(qq{
SELECT (SELECT count(*) FROM pgqueue.queue WHERE id = '$k') || ' job row, '
    || (SELECT count(*) FROM pgqueue.work_queue WHERE id = '$k') || ' work row, '
    || (SELECT count(*) FROM pgqueue.archive WHERE id = '$k' AND outcome = 'acked') || ' archived'}),
		'0 job row, 0 work row, 1 archived',
		'defect 2 (and 14): job k is finished, and archived (its queue keeps an archive)');
	q1(q{SELECT pgq_purge('p', 'pending')});

	# job h's work row moved to a slot of work_queue made current after $sa's
	# first call (a straggler move: 10 s after its slot stopped being current)
	my ($wfrom, $wto) = turn_work_ring($node, 'fw');
	isnt($wto, $wfrom, "defect 2: work_queue's ring turned from slot $wfrom to slot $wto");
	ok( poll_bounded($node,
			"SELECT slot <> $h_slot FROM pgqueue.work_queue WHERE id = '$h'", 40),
		"defect 2: job h's work row moved from slot $h_slot to slot "
		  . row_slot($node, 'work_queue', $h) . ': ' . slot_rows());
	is($sa->query_safe("SELECT pgq_ack('$h', 'wH')"),
		't', 'defect 2: pgq_ack of job h by its holder, in the transaction: true');
	$sa->query_safe('COMMIT');
	is(q1(qq{SELECT count(*) FROM pgqueue.jobs WHERE id = '$h'}), '0',
		'defect 2: job h is finished');
	$_->quit for ($sc, $sn, $sa, $sk);
}

# --- defect 3: a push after the slot it saw current was made free ---------------
{
	# job j: pushed while slot $p0 is current, held
	my $p0 = current_slot($node, 'queue');
	my $j = q1(q{SELECT pgq_push('j', '{"job": "j"}')});
	ok(scheduled($j), 'defect 3: job j scheduled');
	is(q1(q{SELECT count(*) FROM pgq_claim('wJ', 1, '1 hour', ARRAY['j'])}),
		'1', 'defect 3: job j held by wJ');
	my $s = $node->background_psql('postgres');
	$s->query_safe(q{SELECT pgq_push('other', '{}')});    # into slot $p0

	my (undef, $a) = turn_queue_ring($node, 'p');
	isnt($a, $p0, "defect 3: queue's ring turned from slot $p0 to slot $a");

	# the transaction: its ack finds job j in slot $p0, and leaves slot $a alone
	$s->query_safe('BEGIN');
	is(row_slot($node, 'queue', $j), $p0, "defect 3: job j is still in slot $p0");
	is($s->query_safe(qq{SELECT pgq_ack('$j', 'wJ')}), 't',
		"defect 3: a transaction acks job j while slot $a is current");

	# slot $a: no longer current, its rows gone, truncated
	my (undef, $b) = turn_queue_ring($node, 'p');
	isnt($b, $a, "defect 3: queue's ring turned from slot $a to slot $b");
	q1(q{SELECT pgq_purge('p', 'pending')});
	ok( poll_bounded($node,
			"SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $a", 20),
		"defect 3: slot $a emptied, truncated and free: " . slot_rows());

	my $z = $s->query_safe(q{SELECT pgq_push('z', '{"job": "z"}')});
	my $z_slot = row_slot($node, 'queue', $z);    # not yet committed: none
	$s->query_safe('COMMIT');
	$z_slot = row_slot($node, 'queue', $z);
	my $z_state = slot_state($node, 'queue', $z_slot);
	isnt($z_state, 'free',
		"defect 3: the transaction's push went into slot $z_slot ($z_state), not a free one");
	ok(scheduled($z), "defect 3: job z, pushed by the transaction, is scheduled");
	is(scalar(drain_queue($node, 'z')), 1, 'defect 3: and claimed');
	$s->quit;
}

is(lost_jobs($node), '', "no job left 'scheduled' without its work_queue row");
$node->stop;
done_testing();
