# A restore into a database whose scheduler runs (it is named in
# pgqueue.database), with a slot 0 bigger than pgqueue.slot_size.
#
# pg_restore loads the data of pgqueue's tables one table at a time, each in
# a transaction of its own, in pg_dump's order: queue_0, queue_1, ...,
# queue_N, then queues, then slots, then work_queue_0.  A scheduler that
# ran all along scheduled the pending jobs of a queue paused in the dump
# (their settings row not in yet), turned the ring of the full queue_0 and
# wrote its own rows into pgqueue.slots, on which the dump's COPY then
# failed ((queue, 0) existed): the restored slots had no state, and the
# paused queue's jobs, and new pushes to it, were scheduled (its settings,
# read before the restore loaded them, were never read again).  The
# scheduler pauses while a session loads pgqueue's tables (hook.c) and
# forgets what it knew of them when it resumes: every mode below restores
# without an error, the paused queue stays paused, and the restored states
# are those of the dump.  (-1 was fine before: nothing shows before it
# commits.)
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pgq_node(
	'restore_sched', q{
pgqueue.database = 'postgres,dst,dst2,dst3'
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
});
$node->start;

sub q1 { return $node->safe_psql($_[0], $_[1]); }

q1('postgres', 'CREATE EXTENSION pgqueue');
q1('postgres', q{SELECT pgq_configure('p', paused => true)});
q1('postgres', q{SELECT pgq_configure('big', paused => true)});
q1('postgres', q{SELECT count(*) FROM pgq_push_batch('p', ARRAY(
  SELECT jsonb_build_object('n', g) FROM generate_series(1, 300) g))});
q1('postgres', q{SELECT count(*) FROM pgq_push_batch('r', ARRAY(
  SELECT jsonb_build_object('n', g) FROM generate_series(1, 5) g))});
$node->poll_query_until('postgres', q{SELECT count(*) = 5 FROM pgqueue.work_queue WHERE queue = 'r'})
  or die 'r not scheduled';
q1('postgres', q{SELECT count(*) FROM pgq_push_batch('p', ARRAY(
  SELECT jsonb_build_object('n', g, 'pad', repeat('x', 200)) FROM generate_series(1, 200) g))});
sleep 1;
for my $i (1 .. 10)
{
	q1('postgres', q{SELECT count(*) FROM pgq_push_batch('big', ARRAY(
	  SELECT jsonb_build_object('n', g, 'pad', repeat('y', 300)) FROM generate_series(1, 10000) g))});
}
my $src = q1('postgres', q{
SELECT queue || ':' || count(*) FROM pgqueue.queue GROUP BY queue ORDER BY queue});
note("dump: $src; slots: " . q1('postgres', q{SELECT string_agg(tbl || slot || state, ' ') FROM pgqueue.slots}));
is(q1('postgres', q{SELECT count(*) FROM pgqueue.queue WHERE queue IN ('p', 'big') AND state <> 'pending'}), '0',
	'in the dumped database every job of the paused queues is pending');

my $dump = $node->basedir . '/pgq.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
	'pg_dump');

sub check_restored
{
	my ($db, $what, $rc, $err) = @_;
	is($rc, 0, "$what: pg_restore succeeds");
	unlike($err, qr/error/i, "$what: pg_restore reports no error")
	  or note($err);
	is(q1($db, q{SELECT queue || ':' || count(*) FROM pgqueue.queue GROUP BY queue ORDER BY queue}),
		$src, "$what: every job came back");
	is( q1($db, q{SELECT count(*) FROM pgqueue.queue WHERE queue IN ('p', 'big') AND state <> 'pending'}),
		'0', "$what: no job of a paused queue was scheduled")
	  or note(q1($db, q{SELECT string_agg(queue || ' ' || state || ' ' || n, ', ') FROM (SELECT queue, state, count(*) n FROM pgqueue.queue GROUP BY 1, 2) x}));
	is(q1($db, q{SELECT count(*) FROM pgqueue.work_queue WHERE queue IN ('p', 'big')}),
		'0', "$what: no job of a paused queue is in work_queue");
	is( q1($db, q{SELECT count(*) FROM pgqueue.slots s WHERE tbl = 'queue' AND slot > 0}),
		q1('postgres', q{SELECT count(*) FROM pgqueue.slots s WHERE tbl = 'queue' AND slot > 0}),
		"$what: pgqueue.slots has the dumped slots' states");
}

# a whole restore
q1('postgres', 'CREATE DATABASE dst');
wait_for_scheduler($node, 'dst');    # up, waiting for the extension
sleep 1;
my ($out, $err) = ('', '');
IPC::Run::run([ 'pg_restore', '-d', $node->connstr('dst'), $dump ], '>', \$out, '2>', \$err);
my $rc = $? >> 8;
sleep 1;
check_restored('dst', 'whole restore', $rc, $err);

# by sections
q1('postgres', 'CREATE DATABASE dst2');
wait_for_scheduler($node, 'dst2');
sleep 1;
my $allerr = '';
my $allrc  = 0;
for my $section ('pre-data', 'data', 'post-data')
{
	IPC::Run::run([ 'pg_restore', "--section=$section", '-d', $node->connstr('dst2'), $dump ],
		'>', \$out, '2>', \$err);
	$allrc ||= $? >> 8;
	$allerr .= $err;
	sleep 1;
}
check_restored('dst2', 'restore by sections', $allrc, $allerr);

# in parallel
q1('postgres', 'CREATE DATABASE dst3');
wait_for_scheduler($node, 'dst3');
sleep 1;
IPC::Run::run([ 'pg_restore', '-j', '2', '-d', $node->connstr('dst3'), $dump ], '>', \$out, '2>', \$err);
$rc = $? >> 8;
sleep 1;
check_restored('dst3', 'restore -j 2', $rc, $err);

$node->stop;
done_testing();
