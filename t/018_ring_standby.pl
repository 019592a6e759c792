# The REPEATABLE READ reader on a hot standby: with
# hot_standby_feedback on, a snapshot taken on the standby is never shown a
# truncated slot's rows as missing.  A reader whose snapshot was taken while
# 30 jobs were pending (before it read pgqueue, so it holds no lock that
# replay would wait for) still counts 30 after the primary acked them all
# and their slot was found empty: the primary waits for the standby's
# snapshot before it truncates the slot, or the reader gets a clean error
# (SQLSTATE 40001, as a recovery conflict has).  On fd91433 the primary
# waits only for its own backends (note_waits), truncates, and the reader
# counts 0.
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

$reader->{stderr} = '';
# a clean error may end the session (FATAL, as a recovery conflict does to
# a session idle in a transaction): then psql exits
my ($count, $err);
my $alive = eval { ($count, $err) = $reader->query(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 's'}); 1 };
my $stderr = $reader->{stderr};
if (!$alive || $err)
{
	like($stderr, qr/(ERROR|FATAL):\s+40001:/, 'defect 8: the reader got a clean error (40001)');
}
else
{
	is($count, '30', 'defect 8: the reader still counts the 30 jobs its snapshot saw');
}
if ($alive)
{
	$reader->{stderr} = '';
	$reader->query('ROLLBACK');
	$reader->quit;
}
else
{
	$reader->{run}->kill_kill;
}

# once the reader is gone, the slot is truncated (or dropped)
ok( poll_bounded($primary, qq{
SELECT coalesce((SELECT state = 'free' FROM pgqueue.slots WHERE tbl = 'queue' AND slot = $slot), true)},
		30),
	"defect 8: slot $slot truncated once the reader ended: " . slot_state($primary, 'queue', $slot));

$standby->stop;
$primary->stop;
done_testing();
