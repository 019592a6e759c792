# pg_dump -j while the rings turn.
#
# pg_dump's leader locks (ACCESS SHARE) the tables it dumps, but not the
# members of an extension: the rows of the extension's configuration
# tables (queue_0, work_queue_0, queues, slots, periodic) are dumped by a
# worker, which locks each table it dumps with LOCK TABLE ... NOWAIT and
# fails the whole dump when the lock is not free ("could not obtain lock
# on relation").  So the scheduler must never take ACCESS EXCLUSIVE on a
# member of the extension: slot 0 of each ring, once another slot was
# made current, is never truncated, made current again, or its
# statistics settled (work_queue_0 was all three, and pg_dump -j failed on
# it, 2 dumps of 291 in a loop under load; found by an attack on the
# rings' fix); work_queue's, emptied, is drained (a state in
# pgqueue.slots, no lock) and stays drained.
#
# Here: while both rings turn (each turn counted, and the truncation of
# slots after 0), the locks on slot 0 of both rings are sampled, and
# pg_dump -Fd -j 2 runs in a loop; no sample may show ACCESS EXCLUSIVE on
# a slot 0, and every dump must succeed.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Path qw(rmtree);
use Time::HiRes qw(time usleep);

my $node = ring_node('pg_dump_j');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('p', paused => true)});

# the first turns: away from slot 0 in both rings
turn_queue_ring($node, 'p');
turn_work_ring($node, 'w');
ok( poll_bounded($node, q{
SELECT count(*) = 2 FROM pgqueue.slots
 WHERE slot = 0 AND (state = 'live' OR (tbl = 'work_queue' AND state = 'drained'))}, 10),
	'slot 0 of both rings is out of the ring once another slot is current');

# a sampler of the locks on the slots 0, in a session of its own
my $sampler = $node->background_psql('postgres');
$sampler->query_safe(q{
CREATE TEMP TABLE samples AS SELECT 0 AS n, 0 AS slot0_exclusive WHERE false});

my $dumps = 0;
my @failed;
my ($turns_q, $turns_w) = (0, 0);
my $files0 = q1(q{
SELECT string_agg(pg_relation_filenode(c.oid)::text, ',' ORDER BY c.relname)
  FROM pg_class c WHERE c.relname IN ('queue_0', 'work_queue_0')
   AND c.relnamespace = 'pgqueue'::regnamespace});
my $t0 = time;
while (time - $t0 < 30 || $dumps < 4)
{
	last if time - $t0 > 90;
	# the rings turn: pushes into the paused queue (queue's ring), jobs
	# scheduled, claimed and acked (work_queue's ring)
	my ($a, $b) = turn_queue_ring($node, 'p');
	$turns_q++ if $a != $b;
	($a, $b) = turn_work_ring($node, 'w');
	$turns_w++ if $a != $b;
	$sampler->query_safe(q{
INSERT INTO samples
SELECT (SELECT coalesce(max(n), 0) + 1 FROM samples),
       (SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
         WHERE c.relname IN ('queue_0', 'work_queue_0')
           AND c.relnamespace = 'pgqueue'::regnamespace
           AND l.mode = 'AccessExclusiveLock')});

	# a pg_dump -j 2 meanwhile
	my $dir = $node->basedir . "/dump$dumps";
	my ($out, $err) = ('', '');
	my $dump = IPC::Run::start(
		[ 'pg_dump', '-Fd', '-j', '2', '-f', $dir, '-d', $node->connstr('postgres') ],
		'>', \$out, '2>', \$err);
	while ($dump->pumpable)
	{
		$sampler->query_safe(q{
INSERT INTO samples
SELECT (SELECT coalesce(max(n), 0) + 1 FROM samples),
       (SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
         WHERE c.relname IN ('queue_0', 'work_queue_0')
           AND c.relnamespace = 'pgqueue'::regnamespace
           AND l.mode = 'AccessExclusiveLock')});
		$dump->pump_nb;
		usleep(20_000);
	}
	$dump->finish;
	push @failed, $err if $? != 0;
	$dumps++;
	rmtree($dir);
}
my $samples = $sampler->query_safe(q{SELECT count(*) || ' ' || sum(slot0_exclusive) FROM samples});
$sampler->quit;
my ($nsamples, $exclusive) = split / /, $samples;

cmp_ok($turns_q, '>=', 2, "queue's ring turned $turns_q times");
cmp_ok($turns_w, '>=', 2, "work_queue's ring turned $turns_w times");
ok( poll_bounded($node, q{
SELECT count(*) > 0 FROM pgqueue.slots WHERE slot > 0 AND state = 'free'}, 30),
	'slots after 0 were truncated');
cmp_ok($nsamples, '>', 20, "the locks on slot 0 sampled $nsamples times");
is($exclusive, '0', 'no ACCESS EXCLUSIVE on a slot 0 in any sample');
is( q1(q{
SELECT string_agg(pg_relation_filenode(c.oid)::text, ',' ORDER BY c.relname)
  FROM pg_class c WHERE c.relname IN ('queue_0', 'work_queue_0')
   AND c.relnamespace = 'pgqueue'::regnamespace}),
	$files0, 'slot 0 of either ring never truncated');
ok( poll_bounded($node, q{
SELECT string_agg(tbl || ':' || state, ' ' ORDER BY tbl) = 'queue:live work_queue:drained'
  FROM pgqueue.slots WHERE slot = 0}, 20),
	'slot 0 of queue still live, of work_queue drained (emptied), neither truncated: '
	  . q1(q{SELECT string_agg(tbl || ':' || state, ' ' ORDER BY tbl) FROM pgqueue.slots WHERE slot = 0}));
cmp_ok($dumps, '>=', 4, "$dumps runs of pg_dump -j 2 while the rings turned");
is(scalar(@failed), 0, 'every pg_dump -j succeeded') or diag(join("\n", @failed));
is(lost_jobs($node), '', 'no job left scheduled without its work_queue row');

$node->stop;
done_testing();
