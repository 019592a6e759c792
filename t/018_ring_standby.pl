# The REPEATABLE READ reader on a hot standby: with
# hot_standby_feedback on, a snapshot taken on the standby is never shown a
# truncated slot's rows as missing.  A reader whose snapshot was taken while
# 30 jobs were pending (before it read pgqueue, so it holds no lock that
# replay would wait for) still counts 30 after the primary acked them all
# and their slot was found empty: the primary waits for the standby's
# snapshot before it truncates the slot, or the reader gets a clean error
# (SQLSTATE 40001, as a recovery conflict has).  On fd91433 the primary
# waits only for its own backends (note_waits), truncates, and the reader
# counts 0.  Then without hot_standby_feedback (as after a crash of the
# primary that set its replication slot's xmin back): the replay of the
# truncation's recovery conflict cancels such a reader instead.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use RingTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = pgq_node(
	'primary', qq{
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
}, allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

sub p1 { return $primary->safe_psql('postgres', $_[0]); }

# The reader counts queue s's jobs: (whether its psql is alive, the count,
# the error, its stderr).  A clean error may end the session (FATAL, as a
# recovery conflict does to a session idle in a transaction): then psql
# exits.
sub reader_count
{
	my ($r) = @_;
	my ($c, $e);
	$r->{stderr} = '';
	my $ok = eval { ($c, $e) = $r->query(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 's'}); 1 };
	return ($ok, $c, $e, $r->{stderr});
}

sub end_reader
{
	my ($r, $ok) = @_;
	if ($ok)
	{
		$r->{stderr} = '';
		$r->query('ROLLBACK');
		$r->quit;
	}
	else
	{
		$r->{run}->kill_kill;
	}
}

# queue's ring past slot 0 (its cold slot, never drained)
p1(q{SELECT pgq_configure('p', paused => true)});
turn_queue_ring($primary, 'p');
p1(q{SELECT pgq_purge('p', 'pending')});

$primary->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'bk', has_streaming => 1);
$standby->append_conf(
	'postgresql.conf', qq{
hot_standby_feedback = on
wal_receiver_status_interval = 1s
});
$standby->start;
ok( poll_bounded($primary,
		'SELECT count(*) = 1 FROM pg_stat_replication WHERE backend_xmin IS NOT NULL', 30),
	'defect 8: the standby streams, with hot_standby_feedback');

# 30 pending jobs in the current slot of queue
p1(q{SELECT pgq_configure('s', paused => true)});
p1(q{SELECT pgq_push('s', jsonb_build_object('n', g)) FROM generate_series(1, 30) g});
my $slot = p1(q{SELECT string_agg(DISTINCT slot::text, ',') FROM pgqueue.queue WHERE queue = 's'});
is($slot, current_slot($primary, 'queue'), "defect 8: 30 jobs pending in slot $slot of queue");
$primary->wait_for_catchup($standby);

# the reader: its snapshot now, no lock on pgqueue's tables
my $reader = $standby->background_psql('postgres', on_error_stop => 0);
$reader->query_safe('\set VERBOSITY verbose');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $xmin = $reader->query_safe('SELECT pg_snapshot_xmin(pg_current_snapshot())');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.queue WHERE queue = 's'}),
	'30', 'defect 8: the standby sees the 30 jobs');
ok( poll_bounded($primary,
		"SELECT backend_xmin::text::bigint <= $xmin FROM pg_stat_replication", 20),
	"defect 8: the primary knows of the reader's snapshot (feedback xmin <= $xmin)");

# on the primary: the jobs scheduled, claimed and acked, their slot no longer current
p1(q{SELECT pgq_configure('s', paused => false)});
ok( poll_bounded($primary,
		q{SELECT count(*) = 30 FROM pgqueue.work_queue WHERE queue = 's'}, 20),
	'defect 8: the primary scheduled them');
is(scalar(drain_queue($primary, 's')), 30, 'defect 8: and they were claimed and acked');
my ($from, $to) = turn_queue_ring($primary, 'p');
p1(q{SELECT pgq_purge('p', 'pending')});
ok( poll_bounded($primary,
		"SELECT state IN ('drained', 'free') FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $slot", 30),
	"defect 8: queue's ring turned (slot $from to $to), slot $slot found empty: "
	  . slot_state($primary, 'queue', $slot));
# give the primary the time to truncate it (it must not, while the reader is open)
my $truncated = poll_bounded($primary,
	"SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $slot", 5);
note "slot $slot on the primary: " . slot_state($primary, 'queue', $slot);
$primary->wait_for_catchup($standby);

my ($alive, $count, $err, $stderr) = reader_count($reader);
if (!$alive || $err)
{
	like($stderr, qr/(ERROR|FATAL):\s+40001:/, 'defect 8: the reader got a clean error (40001)');
}
else
{
	is($count, '30', 'defect 8: the reader still counts the 30 jobs its snapshot saw');
}
end_reader($reader, $alive);

# once the reader is gone, the slot is truncated (or dropped)
ok( poll_bounded($primary, qq{
SELECT coalesce((SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $slot), true)},
		30),
	"defect 8: slot $slot truncated once the reader ended: " . slot_state($primary, 'queue', $slot));

# Without hot_standby_feedback the primary knows nothing of the standby's
# snapshots and truncates at once; the replay of the truncation's recovery
# conflict then cancels the reader whose snapshot is older than the
# slot's deletes (as a VACUUM's cleanup does), before the TRUNCATE is
# replayed: an error, never a count of 0.  A REPEATABLE READ transaction
# on the primary, begun before the slot became current, keeps every row
# deleted from then on from being pruned (a pruning would raise a
# conflict of its own and hide whether the truncation raises one), and
# holds up no truncation of that slot (its snapshot is older than the
# slot).  Before the conflict record the reader counted 0 here.
$standby->append_conf(
	'postgresql.conf', qq{
hot_standby_feedback = off
max_standby_streaming_delay = 1s
});
$standby->restart;
ok( poll_bounded($primary,
		q{SELECT count(*) = 1 FROM pg_stat_replication WHERE backend_xmin IS NULL AND state = 'streaming'}, 30),
	'standby conflict: the standby streams again, without hot_standby_feedback');
my $conflicts0 = $standby->safe_psql('postgres',
	q{SELECT confl_snapshot FROM pg_stat_database_conflicts WHERE datname = 'postgres'});

my $holder = $primary->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT 1');
($from, $to) = turn_queue_ring($primary, 'p');
p1(q{SELECT pgq_purge('p', 'pending')});
p1(q{SELECT pgq_configure('s', paused => true)});
p1(q{SELECT pgq_push('s', jsonb_build_object('n', g)) FROM generate_series(1, 3) g});
$slot = p1(q{SELECT string_agg(DISTINCT slot::text, ',') FROM pgqueue.queue WHERE queue = 's'});
is($slot, current_slot($primary, 'queue'), "standby conflict: 3 jobs pending in slot $slot of queue");
$primary->wait_for_catchup($standby);

$reader = $standby->background_psql('postgres', on_error_stop => 0);
$reader->query_safe('\set VERBOSITY verbose');
$reader->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$reader->query_safe('SELECT pg_snapshot_xmin(pg_current_snapshot())');

p1(q{SELECT pgq_configure('s', paused => false)});
ok( poll_bounded($primary,
		q{SELECT count(*) = 3 FROM pgqueue.work_queue WHERE queue = 's'}, 20),
	'standby conflict: the primary scheduled them');
is(scalar(drain_queue($primary, 's')), 3, 'standby conflict: and they were claimed and acked');
($from, $to) = turn_queue_ring($primary, 'p');
p1(q{SELECT pgq_purge('p', 'pending')});
# the mechanism under test: the primary truncates while the reader is open
ok( poll_bounded($primary,
		"SELECT coalesce((SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $slot), true)",
		30),
	"standby conflict: the primary truncated slot $slot (ring turned $from to $to) with the reader open: "
	  . slot_state($primary, 'queue', $slot));
$primary->wait_for_catchup($standby);

($alive, $count, $err, $stderr) = reader_count($reader);
ok((!$alive || $err) && $stderr =~ /(ERROR|FATAL):\s+40001:.*conflict with recovery/,
	'standby conflict: the reader whose snapshot is older than the deletes is cancelled, '
	  . 'not shown an empty slot (count ' . ($count // 'none') . ", stderr: $stderr)");
end_reader($reader, $alive);
$holder->query_safe('COMMIT');
$holder->quit;
cmp_ok(
	$standby->safe_psql('postgres',
		q{SELECT confl_snapshot FROM pg_stat_database_conflicts WHERE datname = 'postgres'}),
	'>', $conflicts0, 'standby conflict: counted as a snapshot conflict on the standby');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pgqueue.queue WHERE queue = 's'}),
	'0', 'standby conflict: a new snapshot on the standby sees the jobs acked');

$standby->stop;
$primary->stop;
done_testing();
