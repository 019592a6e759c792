# t/015 for the other calls.  Under REPEATABLE READ and SERIALIZABLE, a
# snapshot taken before the
# scheduler moved a job's row out of an old slot and drained it: pgq_nack,
# pgq_extend, pgq_cancel and pgq_release by the job's holder must give the
# right answer or fail with 40001 (retried in a new transaction), never a
# wrong NULL/false, and leave no job 'scheduled' without its work_queue row.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('rr_calls');
sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('p', paused => true)});
turn_work_ring($node, 'fw');
turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});

# job name => [isolation, call (%s: id, %k: key), moved ring]
my %calls = (
	n1 => [ 'REPEATABLE READ', q{SELECT pgq_nack('%s', '%k', 'boom', '1 hour')}, 'queue' ],
	x1 => [ 'SERIALIZABLE', q{SELECT pgq_extend('%s', '%k', '2 hours') IS NOT NULL}, 'queue' ],
	c1 => [ 'SERIALIZABLE', q{SELECT pgq_cancel('%s')}, 'queue' ],
	r1 => [ 'REPEATABLE READ', q{SELECT pgq_release('%k')}, 'queue' ],
	n2 => [ 'SERIALIZABLE', q{SELECT pgq_nack('%s', '%k', 'boom', '1 hour')}, 'work_queue' ],
	x2 => [ 'REPEATABLE READ', q{SELECT pgq_extend('%s', '%k', '2 hours') IS NOT NULL}, 'work_queue' ],
	c2 => [ 'REPEATABLE READ', q{SELECT pgq_cancel('%s')}, 'work_queue' ],
	r2 => [ 'SERIALIZABLE', q{SELECT pgq_release('%k')}, 'work_queue' ],
);
my %expect = (n1 => 'retry', n2 => 'retry', x1 => 't', x2 => 't', c1 => 't', c2 => 't', r1 => '1', r2 => '1');
my %id;
for my $j (sort keys %calls)
{
	$id{$j} = q1(qq{SELECT pgq_push('$j', '{"job": "$j"}')});
	ok(poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id{$j}'", 20),
		"job $j scheduled");
	is(q1(qq{SELECT count(*) FROM pgq_claim('w$j', 1, '1 hour', ARRAY['$j'])}), '1', "job $j held by w$j");
}
my %s;
for my $j (sort keys %calls)
{
	$s{$j} = $node->background_psql('postgres', on_error_stop => 0);
	$s{$j}->query_safe('\set VERBOSITY verbose');
	$s{$j}->query_safe("BEGIN ISOLATION LEVEL $calls{$j}[0]");
	$s{$j}->query_safe('SELECT 1');
}

sub call_in_snapshot
{
	my ($j) = @_;
	my $s = $s{$j};
	(my $sql = $calls{$j}[1]) =~ s/%s/$id{$j}/;
	$sql =~ s/%k/w$j/;
	$s->{stderr} = '';
	my ($out, $err) = $s->query($sql);
	my $what = "$j ($calls{$j}[0], $calls{$j}[2] row moved)";
	if ($err)
	{
		like($s->{stderr}, qr/ERROR:\s+40001:/, "$what: failed with 40001, nothing else")
		  or note($s->{stderr});
		$s->{stderr} = '';
		$s->query_safe('ROLLBACK');
		$out = q1($sql);
		is($out, $expect{$j}, "$what: retried in a new transaction: $out");
	}
	else
	{
		is($out, $expect{$j}, "$what: answered '$out'");
		$s->query_safe('COMMIT');
	}
	unlike(lost_jobs($node), qr/\Q$id{$j}\E/, "$what: not left 'scheduled' without its work_queue row");
	$s->quit;
}

# the job rows moved out of their slot, which is drained
turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});
ok(poll_bounded($node, "SELECT bool_and(slot = 0) FROM pgqueue.queue WHERE queue IN ('n1', 'x1', 'c1', 'r1')", 40),
	'the job rows of n1, x1, c1, r1 moved to slot 0');
call_in_snapshot($_) for ('n1', 'x1', 'c1', 'r1');

# the work rows moved
my $w = row_slot($node, 'work_queue', $id{n2});
turn_work_ring($node, 'fw');
ok(poll_bounded($node, "SELECT bool_and(slot <> $w) FROM pgqueue.work_queue WHERE queue IN ('n2', 'x2', 'c2', 'r2')", 40),
	'the work rows of n2, x2, c2, r2 moved');
call_in_snapshot($_) for ('n2', 'x2', 'c2', 'r2');

is(q1(q{SELECT string_agg(queue || ':' || state, ',' ORDER BY queue) FROM pgqueue.jobs WHERE queue ~ '^[ncxr][12]$'}),
	'n1:retry,n2:retry,r1:scheduled,r2:scheduled,x1:running,x2:running', 'the jobs are as the calls left them');
is(lost_jobs($node), '', "no job left 'scheduled' without its work_queue row");
$node->stop;
done_testing();
