# A REPEATABLE READ transaction whose snapshot was
# taken before the scheduler moved a job's row out of an old slot (a
# straggler move) and found that slot empty ('drained': calls no longer
# visit it, but it is not truncated while such a snapshot is open).  The
# only version of the row that snapshot can see is in the drained slot.
# Its holder's pgq_ack must give the right answer (true, and the job is
# finished) or fail with 40001, which the caller retries (DESIGN.md, 1.1
# as built); never false (the job would run twice) and never true with the
# job left behind ('scheduled' with no work_queue row).
#
# - the job row moved (to queue's slot 0), its work_queue row in place;
# - the work_queue row moved (to the current slot of work_queue).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('repeatable_read');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('p', paused => true)});

# both rings past slot 0 (queue's slot 0 is never drained, work_queue's
# first turn is t/016's)
turn_work_ring($node, 'fw');
turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});

# jobs a and b: held for an hour by wa and wb
my %id;
for my $j ('a', 'b')
{
	$id{$j} = q1(qq{SELECT pgq_push('$j', '{"job": "$j"}')});
	ok( poll_bounded($node,
			"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id{$j}'", 20),
		"defect 4: job $j scheduled");
	is(q1(qq{SELECT count(*) FROM pgq_claim('w$j', 1, '1 hour', ARRAY['$j'])}),
		'1', "defect 4: job $j held by w$j for an hour");
}
my $q_slot = row_slot($node, 'queue', $id{a});
my $w_slot = row_slot($node, 'work_queue', $id{a});
isnt($q_slot, '0', "defect 4: the job rows are in slot $q_slot of queue");

# the snapshots: taken now, before anything moves
my %s;
for my $j ('a', 'b')
{
	$s{$j} = $node->background_psql('postgres', on_error_stop => 0);
	$s{$j}->query_safe('\set VERBOSITY verbose');
	$s{$j}->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	$s{$j}->query_safe('SELECT 1');
}

# pgq_ack of job $j by its holder in the REPEATABLE READ transaction: true
# (committed: the job is finished) or 40001 (rolled back: a new transaction
# acks it).  Returns what the ack answered.
sub ack_in_snapshot
{
	my ($j, $what) = @_;
	my $s = $s{$j};
	$s->{stderr} = '';
	my ($out, $err) = $s->query("SELECT pgq_ack('$id{$j}', 'w$j')");
	my $stderr = $s->{stderr};
	if ($err)
	{
		like($stderr, qr/ERROR:\s+40001:/,
			"defect 4 ($what): the ack failed with a serialization failure, nothing else");
		$s->{stderr} = '';
		$s->query_safe('ROLLBACK');
		is(q1(qq{SELECT pgq_ack('$id{$j}', 'w$j')}), 't',
			"defect 4 ($what): the ack retried in a new transaction: true");
	}
	else
	{
		is($out, 't', "defect 4 ($what): the ack answered '$out' (true, or 40001, wanted)");
		$s->query_safe('COMMIT');
	}
	is( q1(qq{
SELECT (SELECT count(*) FROM pgqueue.queue WHERE id = '$id{$j}') || ' job row, '
    || (SELECT count(*) FROM pgqueue.work_queue WHERE id = '$id{$j}') || ' work row'}),
		'0 job row, 0 work row', "defect 4 ($what): job $j is finished");
	unlike(lost_jobs($node), qr/\Q$id{$j}\E/,
		"defect 4 ($what): job $j not left 'scheduled' without its work_queue row");
	$s->quit;
	return $out;
}

# --- the job rows moved, their slot drained -------------------------------------
my ($from, $to) = turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});
ok( poll_bounded($node, "SELECT slot = 0 FROM pgqueue.queue WHERE id = '$id{b}'", 40),
	"defect 4: queue's ring turned (slot $from to $to), job b's row moved from slot $q_slot to slot "
	  . row_slot($node, 'queue', $id{b}));
ok(poll_bounded($node, "SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $q_slot", 20),
	"defect 4: slot $q_slot of queue drained (not truncated: the snapshots can see its rows): "
	  . slot_state($node, 'queue', $q_slot));
is(row_slot($node, 'work_queue', $id{b}), $w_slot, "defect 4: job b's work row still in slot $w_slot");
ack_in_snapshot('b', 'job row moved');

# --- the work rows moved, their slot drained ------------------------------------
($from, $to) = turn_work_ring($node, 'fw');
ok( poll_bounded($node, "SELECT slot <> $w_slot FROM pgqueue.work_queue WHERE id = '$id{a}'", 40),
	"defect 4: work_queue's ring turned (slot $from to $to), job a's work row moved from slot $w_slot to slot "
	  . row_slot($node, 'work_queue', $id{a}));
ok( poll_bounded($node,
		"SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = $w_slot", 20),
	"defect 4: slot $w_slot of work_queue drained (not truncated: the snapshot can see its rows): "
	  . slot_state($node, 'work_queue', $w_slot));
ack_in_snapshot('a', 'work row moved');

# once the snapshots are gone, both slots are truncated
ok( poll_bounded($node, qq{
SELECT bool_and(state = 'free') FROM pgqueue.slots
 WHERE (tbl, slot) IN (('queue', $q_slot), ('work_queue', $w_slot))}, 20),
	'the drained slots truncated once the snapshots ended: '
	  . slot_state($node, 'queue', $q_slot) . ', ' . slot_state($node, 'work_queue', $w_slot));

is(lost_jobs($node), '', "no job left 'scheduled' without its work_queue row");
$node->stop;
done_testing();
