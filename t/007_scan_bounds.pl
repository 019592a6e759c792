# The scan bounds and blocking claims, where several server sessions or a
# standby are needed (src/bounds.c, src/publish.c):
#
# - full walks are spaced by their cost even while scheduling passes keep
#   committing (a walk's cost was once recorded only when its bound was
#   set, and every pass made the set fail: a slow full walk every second),
#   and a scheduling pass's full walk by the cost of the whole pass (it was
#   once measured up to its set, before the walks that visit the entries);
# - a filtered waiting claim ended by FATAL (pg_terminate_backend) leaves
#   no trace: commits wake one waiting claim per job made claimable, not
#   every waiting claim;
# - claims on a hot standby touch no bound: an expired lease replayed just
#   before promotion is stolen by the first claim after it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use Time::Local qw(timegm);

my $node = pgq_node(
	'bounds', qq{
pgqueue.enabled = off
pgqueue.naptime = '1h'
autovacuum = off
}, allows_streaming => 1);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');

# Index entries of work_queue_ready_idx that the current transaction read
# while running $sql (statistics accumulate until the session flushes them,
# so the difference is taken inside the transaction).
sub ready_entries_read
{
	my ($session, $sql) = @_;
	my $out = $session->query_safe(qq{
BEGIN;
CREATE TEMP TABLE before AS
  SELECT pg_stat_get_xact_tuples_returned('pgqueue.work_queue_0_ready_idx'::regclass) AS n;
$sql;
SELECT pg_stat_get_xact_tuples_returned('pgqueue.work_queue_0_ready_idx'::regclass) - n FROM before;
DROP TABLE before;
COMMIT;});
	return (split /\n/, $out)[-1];
}

# The full walks of a bound that the server logged (DEBUG1) after byte
# $from of its log: when, how long each took, when the next was due, and
# the index entries it read when the walker counted them (-1 when not).
sub full_walks
{
	my ($bound, $from) = @_;
	my @walks;
	for my $line (split /\n/, slurp_file($node->logfile, $from))
	{
		next unless $line =~
		  /^(\d+)-(\d+)-(\d+) (\d+):(\d+):([\d.]+) .*full walk of the $bound bound took (\d+) us; the next in (\d+) ms(?:; (\d+) index entries read)?/;
		# seconds since the epoch (as if the log were in UTC: only the gaps
		# between walks count, and DST aside they are the same): a run across
		# midnight once took the walk after 00:00 for one 24 h early
		push @walks,
		  {
			at => timegm(0, $5, $4, $3, $2 - 1, $1) + $6,
			took_us => $7,
			next_ms => $8,
			read => $9 // -1
		  };
	}
	return @walks;
}

# PGQ_FULL_COST (src/bounds.c): a full walk is due no sooner than this
# many times the last one's duration after it, and no sooner than 1 s.
my $full_cost = 100;

# The walks of @_ that came sooner than $full_cost times the previous one's
# duration, or than 1 s, after it (50 ms of slack for the log's clock).
sub early_walks
{
	my @walks = @_;
	return grep {
		my $i = $_;
		my $gap_ms = ($walks[$i]{at} - $walks[ $i - 1 ]{at}) * 1000;
		my $due_ms = $walks[ $i - 1 ]{took_us} * $full_cost / 1000;
		$due_ms = 1000 if $due_ms < 1000;
		$gap_ms < $due_ms - 50;
	} 1 .. $#walks;
}

# --- full walks are spaced by their cost ------------------------------------
# A snapshot held open, then 250,000 jobs scheduled, claimed and acked: their
# entries stay in work_queue_ready_idx, and a full walk visits them all.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT count(*) FROM pgqueue.queue');
$node->safe_psql('postgres', q{
SELECT count(*) FROM generate_series(1, 25) b,
  LATERAL pgq_push_batch('churn', ARRAY(SELECT jsonb_build_object('b', b, 'n', g)
                                         FROM generate_series(1, 10000) g))});
for my $i (1 .. 25)
{
	$node->safe_psql('postgres', 'SELECT pgq_schedule(10000)');
	$node->safe_psql('postgres',
		"SELECT pgq_ack_batch(ARRAY(SELECT id FROM pgq_claim('churn', 10000)), 'churn')");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM pgqueue.queue'),
	'0', '250,000 jobs went through, their index entries held');

# For 8 s, and on until three full walks of READY and two of SCHED were
# logged (at most 90 s): a scheduling pass commits every 50 ms (each lowers
# the READY bound), and a claim runs after each.  The server logs each full
# walk, how long it took and when the next is due (DEBUG1); the walks that
# followed must have kept to that: no sooner than PGQ_FULL_COST times the
# last one's duration, at least 1 s.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET log_min_messages = debug1; SELECT pg_reload_conf()");
my $log_from = -s $node->logfile;
my $claimer = $node->background_psql('postgres');
my $pusher = $node->background_psql('postgres');
my $claims = 0;
my $most_read = 0;
my $began = time();
my $checked = $began;
while (time() < $began + 90)
{
	if (time() >= $began + 8 && time() >= $checked + 1)
	{
		$checked = time();
		last
		  if scalar(full_walks('READY', $log_from)) >= 3
		  && scalar(full_walks('SCHED', $log_from)) >= 2;
	}
	$pusher->query_safe("SELECT pgq_push('live', '{}'); SELECT pgq_schedule();");
	my $read = ready_entries_read($claimer,
		"SELECT pgq_ack_batch(ARRAY(SELECT id FROM pgq_claim('live', 10)), 'live')");
	$most_read = $read if $read > $most_read;
	$claims++;
	usleep(50_000);
}
$claimer->quit;
$pusher->quit;
$node->safe_psql('postgres',
	"ALTER SYSTEM RESET log_min_messages; SELECT pg_reload_conf()");
my @walks = full_walks('READY', $log_from);
note(scalar(@walks) . " full walks of READY in $claims claims, took (us): "
	  . join(' ', map { $_->{took_us} } @walks));
ok(@walks >= 2, 'full walks ran, and were logged');
my $longest = 0;
$longest = $_->{took_us} > $longest ? $_->{took_us} : $longest for @walks;
# what a full walk costs depends on the machine; what it reads does not
ok($most_read >= 250_000,
	"a full walk visits the held entries ($most_read index entries read by one claim, the longest walk $longest us)");
is(scalar(early_walks(@walks)), 0,
	"every full walk came no sooner than $full_cost times the last one took, and 1 s");
is(join(' ', map { $_->{next_ms} >= 1000 && $_->{next_ms} >= $_->{took_us} * $full_cost / 1000 - 1 ? 'ok' : 'short' } @walks),
	join(' ', map { 'ok' } @walks), 'each walk set the next one by its own cost');

# The same for the SCHED bound, whose full walks the pusher's pgq_schedule
# calls took: the 250,000 jobs scheduled left their entries at the head of
# queue 'churn' in queue_ready_idx.  A pass's full walk only resets the
# queues' heads when it sets the bound; the walks of the pass from them
# visit the entries, and they are what its cost must count.  It was once
# measured up to the set alone (some 100 us, whatever the entries held):
# a full walk of every held entry every second.
my @sched_walks = full_walks('SCHED', $log_from);
note(scalar(@sched_walks) . " full walks of SCHED, took (us) / index entries read: "
	  . join(' ', map { "$_->{took_us}/$_->{read}" } @sched_walks));
ok(@sched_walks >= 1, 'full walks of SCHED ran, and were logged');
my $sched_most = 0;
$sched_most = $_->{read} > $sched_most ? $_->{read} : $sched_most for @sched_walks;
ok($sched_most >= 250_000,
	"a pass's full walk visits the held entries, and counts them ($sched_most index entries read)");
is(scalar(early_walks(@sched_walks)), 0,
	"every full walk of SCHED came no sooner than $full_cost times the last one took (its pass included), and 1 s");

$holder->query_safe('COMMIT');
$holder->quit;
$node->safe_psql('postgres', 'TRUNCATE pgqueue.queue, pgqueue.work_queue');

# --- a filtered waiting claim ended by FATAL --------------------------------
my $filtered = $node->background_psql('postgres', on_error_stop => 0);
my $fpid = $filtered->query_safe('SELECT pg_backend_pid()');
$filtered->query_until(qr/waiting/,
	"\\echo waiting\nSELECT count(*) FROM pgq_claim('f', 1, queues => ARRAY['other'], wait => '60 seconds');\n");
$node->poll_query_until('postgres',
	"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $fpid")
  or die 'filtered claim did not wait';
$node->safe_psql('postgres', "SELECT pg_terminate_backend($fpid)");
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $fpid")
  or die 'filtered claim did not end';
$filtered->{run}->finish;

# A waiting claim and one job made claimable: the commit that made it
# claimable wakes one waiting claim (logged at DEBUG1), not every one, as it
# did while a filtered claim was counted as waiting.
$node->safe_psql('postgres',
	"ALTER SYSTEM SET log_min_messages = debug1; SELECT pg_reload_conf()");
my $waiter = $node->background_psql('postgres');
my $wpid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/waiting/,
	"\\echo waiting\nSELECT 'claimed', count(*) FROM pgq_claim('u1', 1, wait => '10 seconds');\n");
$node->poll_query_until('postgres',
	"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $wpid")
  or die 'claim did not wait';
$log_from = -s $node->logfile;
$node->safe_psql('postgres', "SELECT pgq_push('q', '{}')");
$node->safe_psql('postgres', 'SELECT pgq_schedule()');
like($waiter->query_until(qr/claimed\|\d/, ''), qr/claimed\|1/, 'the waiting claim got the job');
$waiter->quit;
$node->safe_psql('postgres',
	"ALTER SYSTEM RESET log_min_messages; SELECT pg_reload_conf()");
my $wake_log = slurp_file($node->logfile, $log_from);
like($wake_log, qr/pgqueue: waking 1 waiting claims/,
	'the pass woke one waiting claim');
unlike($wake_log, qr/pgqueue: waking every waiting claim/,
	'and not every one: no filtered claim is counted as waiting');

# --- claims on a hot standby ------------------------------------------------
$node->safe_psql('postgres', 'TRUNCATE pgqueue.queue, pgqueue.work_queue');
$node->backup('bk');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'bk', has_streaming => 1);
$standby->start;

# a claim on the standby fails its read-only check before it reads a
# bound or probes an index: no scan of work_queue_lease_idx
my ($rc, $out, $err) = $standby->psql('postgres', q{
DO $$
DECLARE
    before bigint := pg_stat_get_xact_numscans('pgqueue.work_queue_0_lease_idx'::regclass);
BEGIN
    BEGIN
        PERFORM pgq_claim('standby', 1);
    EXCEPTION WHEN read_only_sql_transaction THEN
        RAISE NOTICE 'read only: %', SQLERRM;
    END;
    RAISE NOTICE 'lease index scans: %',
        pg_stat_get_xact_numscans('pgqueue.work_queue_0_lease_idx'::regclass) - before;
END
$$;});
like($err, qr/read only: cannot execute pgq_claim in a read-only transaction/,
	'a claim on the standby is refused');
like($err, qr/lease index scans: 0/, 'before it touched a bound or an index');

# claims keep failing on the standby (read only) until it is promoted
my $loop = $standby->background_psql('postgres', on_error_stop => 0);
$loop->query_until(qr/looping/, q{\echo looping
DO $$
BEGIN
    WHILE pg_catalog.pg_is_in_recovery() LOOP
        BEGIN
            PERFORM pgq_claim('standby', 1, '1 hour', ARRAY['other']);
        EXCEPTION WHEN read_only_sql_transaction THEN
            NULL;
        END;
    END LOOP;
END
$$;
\echo stopped
});

# the primary hands out a job under a lease that runs out at once
$node->safe_psql('postgres', q{
SELECT pgq_push('q', '{"n": "replayed"}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 1, '1 millisecond');});
$node->wait_for_catchup($standby);
usleep(100_000);
$node->stop;
$standby->promote;
$loop->query_until(qr/stopped/, '');
$loop->quit;
is( $standby->safe_psql(
		'postgres', "SELECT payload->>'n', tries FROM pgq_claim('w2', 1, '1 hour')"),
	'replayed|2',
	'after promotion the first claim steals the lease that ran out');

$standby->stop;
done_testing();
