# A backend whose PGPROC xmin is older than a slot (ring.c's made_xmin
# argument skips it at the slot's drain) while it holds a newer snapshot
# that sees the slot's rows: a pgqueue call, which opens slots after its
# snapshot, must not find a slot truncated under it.
#
# An ack runs inside a long READ COMMITTED statement (a PL/pgSQL
# function, as a stored-procedure worker loop is), or in a transaction with
# a cursor open (both parts of this test):
# the outer statement's snapshot was taken before slot Q of queue
# became current, the ack's own snapshot after job J was pushed into Q.
# The ack waits for J's work_queue row (another transaction holds it:
# pgq_extend in an open transaction).  Meanwhile the scheduler moves J's
# job row out of Q (a straggler move to slot 0), finds Q empty, drains it
# and truncates it without waiting for the ack's backend: its xmin (the
# outer statement's) precedes Q's made_xmin.  When the ack goes on, its
# snapshot finds J's job row neither in Q (truncated) nor in slot 0 (the
# moved version is newer than the snapshot), and pgq_job_row_missing asked
# the parent with the statement's active snapshot, which did not see the
# moved row either: the ack answered true, J's work row was gone and its
# job row stayed 'scheduled' in slot 0 for ever (lost; found by an attack
# on the rings' fix).  Now the scheduler waits for the calls under way
# when it drained Q (shmem.c, "Calls under way"): the ack finds J's row in
# Q moved, looks again and finishes J; Q is truncated once the call ended.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = ring_node('old_xmin_ack');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{SELECT pgq_configure('p', paused => true)});
q1(q{SELECT pgq_configure('pf', paused => true)});
q1(q{CREATE TABLE go (id uuid)});
q1(q{GRANT ALL ON go TO PUBLIC});
# a worker loop in PL/pgSQL: waits for a job id, then acks it
q1(q{
CREATE FUNCTION ack_later(key text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE j uuid;
BEGIN
  LOOP
    SELECT id INTO j FROM go;
    EXIT WHEN j IS NOT NULL;
    PERFORM pg_sleep(0.05);
  END LOOP;
  RETURN pgq_ack(j, key);
END $$});

turn_work_ring($node, 'fw');
turn_queue_ring($node, 'p');

sub attack
{

my $mode = shift;
q1('TRUNCATE go');
my $a = $node->background_psql('postgres');
my $apid = $a->query_safe('SELECT pg_backend_pid()');
if ($mode eq 'plpgsql')
{
	# the worker's statement begins (its snapshot: before slot Q is current)
	start_blocked_sql($a, q{SELECT 'acked', ack_later('k');});
	ok(poll_bounded($node, "SELECT state = 'active' FROM pg_stat_activity WHERE pid = $apid", 10),
		"$mode: the worker statement runs");
}
else
{
	# a transaction with a cursor open (its snapshot: before slot Q is current)
	$a->query_safe('BEGIN');
	$a->query_safe('DECLARE c CURSOR FOR SELECT g FROM generate_series(1, 10) g');
	$a->query_safe('FETCH 1 FROM c');
}

# slot Q becomes current; job J is pushed into it
my (undef, $qslot) = turn_queue_ring($node, 'p');
q1(q{SELECT pgq_purge('p', 'pending')});
my $j = q1(q{SELECT pgq_push('j', '{"job": "J"}')});
is(row_slot($node, 'queue', $j), $qslot, "$mode: job J pushed into slot $qslot of queue");

# Q replaced with few rows in it (a straggler move takes up to 100)
for my $i (1 .. 40)
{
	last if current_slot($node, 'queue') != $qslot;
	q1(q{SELECT count(*) FROM pgq_push_batch('pf', ARRAY(
	       SELECT jsonb_build_object('pad', (SELECT string_agg(md5(random()::text || g || s), '')
	                                           FROM generate_series(1, 47) s))
	         FROM generate_series(1, 5) g))});
	usleep(100_000);
}
isnt(current_slot($node, 'queue'), $qslot, "$mode: slot $qslot replaced");
my $nq = q1("SELECT count(*) FROM pgqueue.queue WHERE slot = $qslot");
cmp_ok($nq, '<=', 100, "$mode: slot $qslot holds $nq rows: its stragglers will be moved");

# J scheduled, claimed by k; another transaction holds J's work row
ok(poll_bounded($node, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$j'", 20),
	"$mode: job J scheduled");
is(q1(q{SELECT count(*) FROM pgq_claim('k', 1, '1 hour', ARRAY['j'])}), '1', "$mode: J claimed by k");
my $t = $node->background_psql('postgres');
$t->query_safe('BEGIN');
$t->query_safe(qq{SELECT pgq_extend('$j', 'k', '1 hour')});

# the worker's ack of J begins, and waits for the extend's transaction
if ($mode eq 'plpgsql')
{
	q1(qq{INSERT INTO go VALUES ('$j')});
}
else
{
	start_blocked_sql($a, qq{SELECT 'acked', pgq_ack('$j', 'k');});
}
ok( poll_bounded($node,
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $apid", 10),
	"$mode: the ack of J waits for the transaction that holds its work row");

# J's job row moved to slot 0 and Q drained meanwhile, but not truncated
# while the ack (whose snapshot may see its rows) waits: the truncation
# waits for the calls under way at the drain (shmem.c)
ok(poll_bounded($node, "SELECT state = 'drained' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $qslot", 40),
	"$mode: slot $qslot drained while the ack waits");
is(row_slot($node, 'queue', $j), '0', "$mode: J's job row was moved to slot 0");
usleep(2_000_000);
is(q1("SELECT state FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $qslot"), 'drained',
	"$mode: slot $qslot not truncated while the ack (whose snapshot saw its row) waits");

$t->query_safe('ROLLBACK');
my $out = wait_output($a, qr/^done$/m, 30) // $a->{stdout};
note("$mode: worker: $out / $a->{stderr}");
$a->query_safe('COMMIT') if $mode eq 'cursor';

# The ack answers true (J finished: no row left) or fails; never true
# with J's job row left behind without its work row.
note("$mode: J: " . q1(qq{SELECT state || ' slot ' || slot FROM pgqueue.queue WHERE id = '$j'}) . '; its work row: '
	  . q1(qq{SELECT count(*) FROM pgqueue.work_queue WHERE id = '$j'}));
unlike(lost_jobs($node), qr/\Q$j\E/, "$mode: J not left 'scheduled' without its work_queue row");
like($out, qr/^acked\|t$/m, "$mode: the ack answered true");
is(q1("SELECT count(*) FROM pgqueue.queue WHERE id = '$j'"), '0', "$mode: J is finished");
# the call ended (the worker's statement may go on): the slot is truncated
# (free, or already retired: the ring keeps two free slots)
ok( poll_bounded($node, qq{
SELECT coalesce((SELECT state FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $qslot), 'retired')
       IN ('free', 'retired')}, 40),
	"$mode: slot $qslot truncated once the ack's call ended");
$a->quit;
$t->quit;
}

attack('plpgsql');
attack('cursor');
$node->stop;
done_testing();
