# Flows (1.2) under the background scheduler, on a server whose rings of
# slots turn fast (pgqueue.slot_size = 64 kB, naptime 50 ms):
#
#   (a) a fan-out and a fan-in: no child reaches work_queue before its
#       parent is acked; once it is, the scheduler releases all 50
#       children; the fan-in job is released only after the last child's
#       ack, and then at once;
#   (b) children waiting while the ring turns under a load of other jobs:
#       their rows are moved to the cold slot (counted: a child's row
#       changed slot), and the acks of their parents still free every one
#       of them (none lost, none left waiting; about 20 s);
#   (c) a crash (immediate stop) with children waiting: they wait after the
#       restart, and the acks of their parents free them;
#   (d) pg_dump -Fc / pg_restore into a new database: waiting jobs, their
#       waiting_for and the edges come back, and the flow completes there;
#       so do a grouped queue's limit and its jobs' groups, one job of each
#       group released at a time.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = ring_node('flows');
wait_for_scheduler($node, 'postgres');

# Claim $want jobs of queue $q (trying for 10 s while the scheduler
# releases them) and ack them; returns how many.
sub ack_all
{
	my ($q, $want) = @_;
	my $n = 0;
	for my $try (1 .. 200)
	{
		my $k = $want - $n;
		$n += $node->safe_psql('postgres', qq{
SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'w'))
  FROM pgq_claim('w', $k, '1 minute', ARRAY['$q']) c});
		last if $n >= $want;
		usleep(50_000);
	}
	return $n;
}

sub jobs_in
{
	my ($q, $state) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pgqueue.jobs WHERE queue = '$q' AND state = '$state'");
}

# --- (a) fan-out, fan-in -----------------------------------------------------------
my $parent = $node->safe_psql('postgres', q{
BEGIN;
CREATE TABLE flow_a (role text, id uuid);
INSERT INTO flow_a SELECT 'parent', pgq_push('a_parent', '{}');
INSERT INTO flow_a SELECT 'child', id
  FROM pgq_push_batch('a_kids', ARRAY(SELECT jsonb_build_object('n', n) FROM generate_series(1, 50) n),
                      after => ARRAY(SELECT id FROM flow_a WHERE role = 'parent')) id;
INSERT INTO flow_a SELECT 'fanin', pgq_push('a_fanin', '{}',
                      after => ARRAY(SELECT id FROM flow_a WHERE role = 'child'));
COMMIT;
SELECT id FROM flow_a WHERE role = 'parent';});
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE queue = 'a_parent'")
  or die 'the parent was not scheduled';
# passes run every 50 ms: a second is 20 passes that must leave the children
usleep(1_000_000);
is($node->safe_psql('postgres',
	"SELECT count(*) FROM pgqueue.work_queue WHERE queue IN ('a_kids', 'a_fanin')"),
	'0', '(a) while the parent is not acked, no child reaches work_queue');
is(jobs_in('a_kids', 'waiting'), '50', 'the 50 children wait');
is(ack_all('a_parent', 1), 1, 'the parent is acked');
$node->poll_query_until('postgres',
	"SELECT count(*) = 50 FROM pgqueue.work_queue WHERE queue = 'a_kids'")
  or die 'the children were not released';
pass('the scheduler releases all 50 children');
is(jobs_in('a_fanin', 'waiting'), '1', 'the fan-in job waits for them');
is($node->safe_psql('postgres', q{
SELECT waiting_for FROM pgqueue.jobs WHERE queue = 'a_fanin'}), '50', 'for all 50');
is(ack_all('a_kids', 49), 49, '49 children acked');
usleep(500_000);
is($node->safe_psql('postgres', q{
SELECT state || ' ' || waiting_for FROM pgqueue.jobs WHERE queue = 'a_fanin'}),
	'waiting 1', 'the fan-in job waits for the last child');
is(ack_all('a_kids', 1), 1, 'the last child is acked');
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pgqueue.work_queue WHERE queue = 'a_fanin'")
  or die 'the fan-in job was not released';
pass('then the fan-in job is released');
is(ack_all('a_fanin', 1), 1, 'and acked');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pgqueue.job_parents'), '0',
	'no edge is left');

# --- (b) the ring turns while children wait -------------------------------------------
# a load of other jobs, pushed and acked: it fills the slots
sub load
{
	$node->safe_psql('postgres', q{
SELECT count(*) FROM pgq_push_batch('b_load',
  ARRAY(SELECT jsonb_build_object('pad', repeat('x', 400), 'n', n) FROM generate_series(1, 200) n))});
	ack_all('b_load', 200);
}
# slot 0 of pgqueue.queue is the cold slot, where moved rows go: the
# children are pushed once another slot is current
# (before the first turn no slot is marked current: slot 0 is)
my $current = "SELECT coalesce(max(slot), 0) FROM pgqueue.slots WHERE tbl = 'queue' AND state = 'current'";
for my $round (1 .. 60)
{
	last if $node->safe_psql('postgres', $current) ne '0';
	load();
}
isnt($node->safe_psql('postgres', $current), '0', '(b) a slot other than 0 is current');
$node->safe_psql('postgres', q{
CREATE TABLE flow_b (parent uuid, child uuid, slot int);
SELECT pgq_configure('b_parent', paused => true);
WITH p AS (SELECT pgq_push('b_parent', jsonb_build_object('n', n)) AS id FROM generate_series(1, 40) n)
INSERT INTO flow_b (parent, child)
SELECT p.id, pgq_push('b_kids', '{}', after => ARRAY[p.id]) FROM p;
UPDATE flow_b b SET slot = q.slot FROM pgqueue.queue q WHERE q.id = b.child;
});
my $since = $node->safe_psql('postgres',
	"SELECT coalesce(max(since), '-infinity') FROM pgqueue.slots WHERE tbl = 'queue'");
# the load turns the ring: until another slot than the children's is
# current (two turns at least)
my ($turns, $moved) = (0, 0);
my $children_slot = $node->safe_psql('postgres', 'SELECT min(slot) FROM flow_b');
for my $round (1 .. 60)
{
	load();
	$turns = $node->safe_psql('postgres',
		"SELECT count(*) FROM pgqueue.slots WHERE tbl = 'queue' AND since > '$since'");
	last if $turns >= 2 && $node->safe_psql('postgres', $current) ne $children_slot;
}
# the scheduler moves the rows left in a slot (at most 100) once the slot
# made current after it has been current for 10 s (ring.c, the straggler
# moves); the load stops so that no later turn reuses that slot meanwhile
for my $i (1 .. 300)
{
	last if $node->safe_psql('postgres', q{
SELECT count(*) > 0 FROM flow_b b JOIN pgqueue.queue q ON q.id = b.child WHERE q.slot <> b.slot}) eq 't';
	usleep(100_000);
}

$moved = $node->safe_psql('postgres', q{
SELECT count(*) FROM flow_b b JOIN pgqueue.queue q ON q.id = b.child WHERE q.slot <> b.slot});
cmp_ok($turns, '>=', 2, "the ring of pgqueue.queue turned ($turns slots made current)");
cmp_ok($moved, '>', 0, "waiting children's rows were moved to another slot ($moved of 40)");
is(jobs_in('b_kids', 'waiting'), '40', 'all 40 children still wait');
$node->safe_psql('postgres', "SELECT pgq_configure('b_parent', paused => false)");
is(ack_all('b_parent', 40), 40, 'their 40 parents are acked');
is(ack_all('b_kids', 40), 40, 'and every child is released and acked');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM pgqueue.queue WHERE queue IN ('b_parent', 'b_kids')}), '0',
	'none is left');

# --- (c) a crash with children waiting ---------------------------------------------------
$node->safe_psql('postgres', q{
SELECT pgq_configure('c_parent', paused => true);
CREATE TABLE flow_c AS
SELECT p.id AS parent, pgq_push('c_kids', '{}', after => ARRAY[p.id]) AS child
  FROM (SELECT pgq_push('c_parent', jsonb_build_object('n', n)) AS id FROM generate_series(1, 10) n) p;
});
$node->stop('immediate');
$node->start;
wait_for_scheduler($node, 'postgres');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM flow_c c JOIN pgqueue.jobs j ON j.id = c.child
 WHERE j.state = 'waiting' AND j.waiting_for = 1}), '10',
	'(c) after a crash, the 10 children still wait');
$node->safe_psql('postgres', "SELECT pgq_configure('c_parent', paused => false)");
is(ack_all('c_parent', 10), 10, 'their parents are acked');
is(ack_all('c_kids', 10), 10, 'and the children are released and acked');

# --- (d) pg_dump / pg_restore ----------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql('src', q{
CREATE EXTENSION pgqueue;
SELECT pgq_configure('d_parent', paused => true);
CREATE TABLE flow_d AS SELECT pgq_push('d_parent', '{}') AS parent;
SELECT pgq_push_batch('d_kids', ARRAY['{"n": 1}', '{"n": 2}']::jsonb[],
                      after => ARRAY(SELECT parent FROM flow_d));
SELECT pgq_push('d_fanin', '{}', after => ARRAY(SELECT id FROM pgqueue.queue WHERE queue = 'd_kids'));
SELECT pgq_configure('d_group', group_max_in_flight => 1);
SELECT pgq_push('d_group', jsonb_build_object('n', n), group_key => 'g' || n % 2)
  FROM generate_series(1, 4) n;
});
my $flows = q{
SELECT string_agg(j.queue || ' ' || j.state || ' ' || j.waiting_for, ',' ORDER BY j.queue, j.id)
       || ' / ' || (SELECT count(*) FROM pgqueue.job_parents)
  FROM pgqueue.jobs j WHERE j.queue <> 'd_group'};
my $groups = q{
SELECT (SELECT group_max_in_flight FROM pgqueue.queues WHERE queue = 'd_group') || ' / ' ||
       string_agg(j.group_key || ' ' || (j.payload->>'n'), ',' ORDER BY j.id)
  FROM pgqueue.jobs j WHERE j.queue = 'd_group'};
my $groups_before = $node->safe_psql('src', $groups);
is($groups_before, '1 / g1 1,g0 2,g1 3,g0 4', '(d) the source: a queue of two groups, limit 1');
my $before = $node->safe_psql('src', $flows);
is($before, 'd_fanin waiting 2,d_kids waiting 1,d_kids waiting 1,d_parent pending 0 / 4',
	'(d) the source: a parent, two children, a fan-in, four edges');
my $dump = $PostgreSQL::Test::Utils::tmp_check . '/flows.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'src' ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
my ($stdout, $stderr);
IPC::Run::run([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
	'>', \$stdout, '2>', \$stderr);
is($?, 0, 'pg_restore succeeds') or diag($stderr);
is($node->safe_psql('restored', $flows), $before,
	'the waiting jobs, their waiting_for and the edges came back');
$node->safe_psql('restored', "SELECT pgq_configure('d_parent', paused => false)");
my $acked = sub {
	my ($q) = @_;
	return $node->safe_psql('restored', qq{
SELECT pgq_schedule() >= 0;
SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'w')) FROM pgq_claim('w', 10, '1 minute', ARRAY['$q']) c});
};
is($acked->('d_parent'), "t\n1", 'in the restored database the parent is acked');
is($acked->('d_kids'), "t\n2", 'then its two children');
is($acked->('d_fanin'), "t\n1", 'then the fan-in job');
is($node->safe_psql('restored', $groups), $groups_before,
	'the groups came back: each job its group_key, the queue its limit');
my $group_round = sub {
	return $node->safe_psql('restored', q{
SELECT pgq_schedule() >= 0;
SELECT string_agg(c.payload->>'n', ',' ORDER BY (c.payload->>'n')::int)
  FROM pgq_claim('w', 10, '1 minute', ARRAY['d_group']) c, LATERAL pgq_ack(c.id, 'w') a});
};
is($group_round->(), "t\n1,2", 'in the restored database one job of each group is released');
is($group_round->(), "t\n3,4", 'then, once those are acked, the next of each');
is($node->safe_psql('restored', 'SELECT count(*) FROM pgqueue.queue'), '0', 'the flow completed');

$node->stop;
done_testing();
