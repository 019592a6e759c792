# The rows left in work_queue's slot 0 when its ring
# first turns (jobs of a queue no one claims, a job held for an hour) are
# moved to the current slot as the rows left in any old slot are (src/ring.c,
# ring_move: 10 s after the slot stopped being current), at the first turn.
# They once stayed until the second turn: slot 0 has no row in
# pgqueue.slots until the first turn, which writes it with the same since as
# the new slot's, and a slot counts as replaced only by one made current
# strictly after it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ring_node('slot0');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_push('stay', jsonb_build_object('n', g)) FROM generate_series(1, 5) g});
q1(q{SELECT pgq_push('held', '{}')});
ok( poll_bounded($node,
		"SELECT count(*) = 6 FROM pgqueue.work_queue WHERE queue IN ('stay', 'held')", 20),
	'defect 9: 6 jobs scheduled');
is(q1(q{SELECT count(*) FROM pgq_claim('holder', 1, '1 hour', ARRAY['held'])}),
	'1', 'defect 9: one of them held for an hour');
is( q1(q{SELECT string_agg(DISTINCT slot::text, ',') FROM pgqueue.work_queue
          WHERE queue IN ('stay', 'held')}),
	'0', "defect 9: their work rows are in slot 0 of work_queue");

# the first turn of work_queue's ring, and no more load after it
my ($from, $to) = turn_work_ring($node, 'fw');
is("$from -> $to", "0 -> $to", "defect 9: work_queue's ring turned for the first time (slot 0 to slot $to)");
ok( poll_bounded($node, q{
SELECT count(*) = 0 FROM pgqueue.work_queue WHERE slot = 0 AND queue IN ('stay', 'held')}, 25),
	'defect 9: the rows left in slot 0 were moved out of it: '
	  . q1(q{SELECT string_agg(slot || ':' || queue, ',' ORDER BY slot, queue)
	           FROM pgqueue.work_queue WHERE queue IN ('stay', 'held')}));
is(current_slot($node, 'work_queue'), $to, "defect 9: with no second turn (slot $to is still current)");
is(q1(q{SELECT count(*) FROM pgqueue.work_queue WHERE queue IN ('stay', 'held')}),
	'6', 'defect 9: the 6 jobs are all still there');
# slot 0, the extension's, is never truncated once another slot is current
# (pg_dump -j's workers lock it without waiting: t/026); emptied, it is
# drained (claims stop walking it) and stays so
is(q1(q{SELECT count(*) FROM pgqueue.work_queue_0}), '0', 'defect 9: slot 0 is empty');
ok(poll_bounded($node, q{SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = 0}, 20),
	'slot 0, empty, is drained');

# a work row put into the drained slot 0 behind the API's back (a restore
# whose pgqueue.slots, saying drained, came after a pgq_schedule() wrote
# slot 0, current then for want of a row saying otherwise): the slot is
# live again, and the job claimed
q1(q{SELECT pgq_push('back', '{}')});
ok( poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE queue = 'back'", 20),
	'a job scheduled');
# (read back by the UPDATE itself: the scheduler may move the row out
# again before a later SELECT, as it should)
is(q1(q{UPDATE pgqueue.work_queue SET slot = 0 WHERE queue = 'back' RETURNING slot}), '0',
	'its work row moved into the drained slot 0');
ok( poll_bounded($node, q{SELECT state = 'live' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = 0}, 20),
	'slot 0 with a row is live again');
ok( poll_bounded($node, q{SELECT count(*) = 1 FROM pgq_claim('c', 1, '1 min', ARRAY['back'])}, 20),
	'and the job in it is claimed');
ok( poll_bounded($node, q{SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'work_queue' AND slot = 0}, 30),
	'slot 0 drained again once its row moved out: '
	  . q1(q{SELECT string_agg(slot || ':' || queue, ',') FROM pgqueue.work_queue}));
is(q1(q{SELECT pgq_ack(id, 'holder') FROM pgqueue.work_queue WHERE queue = 'held'}),
	't', 'defect 9: the held job is acked by its holder in its new slot');
is(scalar(drain_queue($node, 'stay')), 5, 'defect 9: the others are claimed');

$node->stop;
done_testing();
