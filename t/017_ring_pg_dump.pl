# pg_dump never fails because of the ring.  The
# scheduler keeps two free slots of a ring and drops the others (src/ring.c,
# ring_shrink); pg_dump lists the tables in its snapshot, then locks each by
# name: a slot dropped in between made it fail with 'relation
# "pgqueue.queue_3" does not exist'.
#
# - what pg_dump does, by hand: a REPEATABLE READ transaction lists the
#   slots, the scheduler would drop free ones, then it locks them by name;
# - the real pg_dump, held between its snapshot and its locks by a lock on
#   a table it locks first (public.gate, made before the extension: pg_dump
#   locks in OID order) while the scheduler would drop free slots;
# - the real pg_dump in a loop while the ring grows and free slots are
#   dropped.
# Each checks that slots were there to drop, and that they were dropped (at
# the latest once the dump was over).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = pgq_node(
	'ring_dump', qq{
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE TABLE public.gate (i int)');
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

is(q1(q{SELECT 'public.gate'::regclass::oid < 'pgqueue.queue'::regclass::oid}),
	't', 'public.gate is older than pgqueue.queue (pg_dump locks it first)');
q1(q{SELECT pgq_configure('big', paused => true)});
q1(q{SELECT pgq_push('keep', jsonb_build_object('n', g)) FROM generate_series(1, 10) g});

# the slots of queue after slot 0 that exist, as "queue_N,..."
sub slot_tables
{
	return q1(q{
SELECT coalesce(string_agg(c.relname, ',' ORDER BY c.oid), '') FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'pgqueue.queue'::regclass AND c.relname <> 'queue_0'});
}

# the same, as their OIDs (a slot dropped may be made again with its name)
sub slot_table_oids
{
	return q1(q{
SELECT coalesce(string_agg(i.inhrelid::text, ','), '') FROM pg_inherits i
 WHERE i.inhparent = 'pgqueue.queue'::regclass});
}

sub free_slots
{
	return q1(q{SELECT count(*) FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'});
}

# Grow queue's ring by $n slots with a backlog of a paused queue, then purge
# it: its slots are truncated and free.  A session holding ACCESS SHARE on
# the parent alone keeps the scheduler from dropping them (it drops only
# when it has ACCESS EXCLUSIVE on the parent at once); returned, for the
# caller to end.
sub free_slots_pinned
{
	my ($n) = @_;
	my $pin = $node->background_psql('postgres');
	$pin->query_safe('BEGIN');
	$pin->query_safe('LOCK TABLE ONLY pgqueue.queue IN ACCESS SHARE MODE');
	turn_queue_ring($node, 'big') for 1 .. $n;
	q1(q{SELECT pgq_purge('big', 'pending')});
	ok(poll_bounded($node, "SELECT count(*) >= $n - 1 FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'", 20),
		'defect 6: ' . free_slots() . ' free slots of queue, held from being dropped');
	return $pin;
}

# --- by hand: list, the scheduler drops, lock by name --------------------------
{
	my $pin = free_slots_pinned(5);
	my $e = $node->background_psql('postgres', on_error_stop => 0);
	$e->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	my $listed = $e->query_safe(q{
SELECT string_agg(c.relname, ',' ORDER BY c.oid) FROM pg_class c
 WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind = 'r' AND c.relname ~ '^queue_[0-9]+$'});
	my $free = free_slots();
	cmp_ok($free, '>', 2, "defect 6: a transaction listed slots $listed, $free of them free");
	$pin->query_safe('COMMIT');
	$pin->quit;
	# the scheduler may drop the free slots beyond two now: give it the time
	my $gone = poll_bounded($node, qq{
SELECT bool_or(to_regclass('pgqueue.' || t) IS NULL) FROM unnest(string_to_array('$listed', ',')) t}, 3);
	note 'dropped while the transaction was open: ' . ($gone ? 'yes' : 'no') . '; slots now ' . slot_tables();
	$e->{stderr} = '';
	my ($out, $err) = $e->query(join('; ',
		'LOCK TABLE pgqueue.queue IN ACCESS SHARE MODE',
		map { "LOCK TABLE pgqueue.$_ IN ACCESS SHARE MODE" } split(/,/, $listed)));
	is($e->{stderr}, '', 'defect 6: it then locks every slot it listed, by name');
	$e->{stderr} = '';
	$e->query('COMMIT');
	$e->quit;
	ok(poll_bounded($node, "SELECT count(*) <= 2 FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'", 20),
		'defect 6: the free slots beyond two were dropped (after it, at the latest): ' . slot_tables());
}

# --- the real pg_dump, held between its snapshot and its locks ------------------
{
	my $pin = free_slots_pinned(5);
	my $listed = slot_tables();
	my $gate = $node->background_psql('postgres');
	$gate->query_safe('BEGIN');
	$gate->query_safe('LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE');
	my $dump = $PostgreSQL::Test::Utils::tmp_check . '/held.dump';
	my ($stdout, $stderr) = ('', '');
	my $h = IPC::Run::start([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
		'>', \$stdout, '2>', \$stderr);
	# pg_dump's backend: the one waiting for public.gate
	my $waiting = q{
SELECT pid FROM pg_locks WHERE relation = 'public.gate'::regclass AND NOT granted};
	ok(poll_bounded($node, "SELECT count(*) = 1 FROM ($waiting) w", 30),
		'defect 6: pg_dump took its snapshot and waits to lock public.gate');
	is( q1(qq{
SELECT count(*) FROM pg_locks l
 WHERE l.pid IN ($waiting)
   AND l.relation IN (SELECT oid FROM pg_class WHERE relnamespace = 'pgqueue'::regnamespace)}),
		'0', "defect 6: holding no lock on pgqueue's tables yet");
	my $free = free_slots();
	cmp_ok($free, '>', 2, "defect 6: slots then: $listed, $free of them free");
	$pin->query_safe('COMMIT');
	$pin->quit;
	my $gone = poll_bounded($node, qq{
SELECT bool_or(to_regclass('pgqueue.' || t) IS NULL) FROM unnest(string_to_array('$listed', ',')) t}, 3);
	note 'dropped while pg_dump waited: ' . ($gone ? 'yes' : 'no') . '; slots now ' . slot_tables();
	$gate->query_safe('COMMIT');
	$gate->quit;
	$h->finish;
	is($h->result(0), 0, 'defect 6: pg_dump succeeds');
	is($stderr, '', 'defect 6: and says nothing');
	ok(poll_bounded($node, "SELECT count(*) <= 2 FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'", 20),
		'defect 6: the free slots beyond two were dropped (after it, at the latest): ' . slot_tables());
}

# --- the real pg_dump in a loop while free slots are dropped ---------------------
{
	my $dumps = $PostgreSQL::Test::Utils::tmp_check . '/loop';
	mkdir $dumps;
	my ($stdout, $stderr) = ('', '');
	my $connstr = $node->connstr('postgres');
	my $h = IPC::Run::start(
		[
			'bash', '-c',
			qq{i=0; while [ ! -e $dumps/stop ]; do i=\$((i+1));
			   pg_dump -Fc -f $dumps/d.dump -d "$connstr" || echo "pg_dump run \$i failed";
			   done; echo "runs \$i"}
		],
		'>', \$stdout, '2>', \$stderr);
	# every slot seen during the loop, and those gone at its end: dropped
	my %seen;
	my $started = time;
	while (time - $started < 12)
	{
		for (1 .. 4)
		{
			turn_queue_ring($node, 'big');
			$seen{$_} = 1 for split(/,/, slot_table_oids());
		}
		q1(q{SELECT pgq_purge('big', 'pending')});
		poll_bounded($node,
			"SELECT count(*) <= 2 FROM pgqueue.slots WHERE tbl = 'queue' AND slot > 0 AND state = 'free'", 10);
	}
	my %left = map { $_ => 1 } split(/,/, slot_table_oids());
	my $dropped = grep { !$left{$_} } keys %seen;
	open(my $fh, '>', "$dumps/stop") or die;
	close($fh);
	$h->finish;
	my ($runs) = $stdout =~ /runs (\d+)/;
	cmp_ok($dropped, '>', 0, "defect 6: $dropped free slots dropped during the loop");
	cmp_ok($runs // 0, '>', 1, 'defect 6: pg_dump ran ' . ($runs // 0) . ' times');
	my $failed = () = $stdout =~ /failed/g;
	is($failed, 0, 'defect 6: every run of pg_dump succeeded (failed: ' . $failed . ')');
	is($stderr, '', 'defect 6: and said nothing');
}

is(q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'keep'}), '10', 'the jobs of queue keep are all there');
$node->stop;
done_testing();
