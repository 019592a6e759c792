# A restore into a database whose scheduler is running
# brings back every job and every setting, and a paused queue stays paused
# throughout.
#
# The source has jobs over several slots of both rings (pgqueue.slot_size
# = 64 kB), scheduled, running under leases, pending in a paused queue,
# pending behind a queue's max_in_flight, delayed, and archived by a queue
# with a retention.  Its pg_dump -Fc is restored into a database without a
# scheduler (the reference: t/008 shows such a restore is faithful), then
# into five databases named in pgqueue.database, created up front so that
# each has its scheduler running (waiting for the extension, passes every
# 50 ms) when its restore begins: a whole pg_restore, one by sections
# (pre-data, data, post-data, a few seconds apart), a whole one in a single
# transaction (-1), one by sections each in a single transaction, and a
# parallel one (-j 2).  For the whole and parallel ones, a session holds
# SHARE on pgqueue.queues for 3 s from the moment the restore's CREATE
# EXTENSION commits, so that the restore waits, with the jobs loaded, for
# the queue settings (loaded after them): the window a slow restore has.
#
# Each restore must end without error, with every row of every pgqueue
# table (jobs with their state, version, tries, lease and holder, work_queue
# rows in their slots, settings, archive, pgqueue.slots, partitions) as in
# the reference, the paused queue's jobs pending.  The schedulers pause
# while a session loads pgqueue's tables and for 60 s after (src/hook.c),
# then resume: a new job is scheduled, the paused queue's are not, and
# every job restored in work_queue is claimed and acked from its slot.
# On fd91433 every mode but the whole single-transaction one failed (a
# single transaction makes everything visible at once: it is kept as a
# guard).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use PgqTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my @targets = qw(r_whole r_sections r_single r_single_sections r_parallel);
my $node = pgq_node(
	'restore_running', qq{
pgqueue.database = 'postgres, } . join(', ', @targets) . qq{'
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
max_worker_processes = 16
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION pgqueue');
$node->safe_psql('postgres', "CREATE DATABASE $_") for (@targets, 'ref');
wait_for_scheduler($node, $_) for @targets;
pass('every target database has its scheduler running, before the extension is created');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# --- the source: jobs in every state over several slots ----------------------
q1(q{
SELECT pgq_configure('r', max_tries => 7);
SELECT pgq_configure('held', paused => true, weight => 4);
SELECT pgq_configure('kept', retention => '7 days', weight => 2);
SELECT pgq_configure('capped', max_in_flight => 3);
SELECT pgq_push_batch('held', ARRAY(SELECT jsonb_build_object('h', g) FROM generate_series(1, 30) g));
SELECT pgq_push_batch('r', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, 1500) g));
});
my $all_scheduled = q{
SELECT count(*) = 0 FROM pgqueue.queue
 WHERE state = 'pending' AND queue IN ('r', 'kept') AND run_after <= now()};
ok($node->poll_query_until('postgres', $all_scheduled), '1,500 jobs scheduled');
q1(q{
SELECT pgq_push_batch('held', ARRAY(SELECT jsonb_build_object('h', g) FROM generate_series(31, 60) g));
SELECT pgq_push_batch('r', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1501, 3000) g));
SELECT pgq_push_batch('capped', ARRAY(SELECT jsonb_build_object('c', g) FROM generate_series(1, 10) g));
SELECT pgq_push('r', '{"n": "delayed"}', run_after => now() + interval '1 day');
SELECT pgq_push_batch('kept', ARRAY(SELECT jsonb_build_object('k', g) FROM generate_series(1, 40) g));
});
ok($node->poll_query_until('postgres', $all_scheduled), '1,500 more scheduled');
is(q1(q{SELECT count(*) FILTER (WHERE pgq_ack(id, 'a')) FROM pgq_claim('a', 40, '1 hour', ARRAY['kept'])}),
	'40', "the retention queue's jobs acked into the archive");
is(q1(q{SELECT count(*) FROM pgq_claim('w1', 10, '1 hour', ARRAY['r'])}),
	'10', 'ten jobs running under a lease of w1');
is(q1(q{SELECT count(*) FROM pgq_claim('w2', 3, '1 hour', ARRAY['capped'])}),
	'3', 'the capped queue: three running, seven pending');
cmp_ok(q1('SELECT count(DISTINCT tableoid) FROM pgqueue.work_queue'),
	'>=', 2, 'work_queue rows in several slots');
cmp_ok(q1(q{SELECT count(*) FROM pg_partition_tree('pgqueue.queue') WHERE isleaf}),
	'>=', 2, 'queue has several slots');
is(q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'held' AND state = 'pending'}),
	'60', 'the paused queue has 60 jobs pending');

my $dump = $PostgreSQL::Test::Utils::tmp_check . '/running.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', 'postgres' ], 'pg_dump -Fc');

# Every row of every pgqueue table, as text, in a stable order.
my $everything = q{
SELECT concat_ws(E'\n',
  (SELECT string_agg(q.tableoid::regclass::text || ' ' || q::text, E'\n' ORDER BY q.id)
     FROM pgqueue.queue q),
  (SELECT string_agg(w.tableoid::regclass::text || ' ' || w::text, E'\n' ORDER BY w.id)
     FROM pgqueue.work_queue w),
  (SELECT string_agg(s::text, E'\n' ORDER BY s.queue) FROM pgqueue.queues s),
  (SELECT string_agg(a.tableoid::regclass::text || ' ' || a::text, E'\n' ORDER BY a.id)
     FROM pgqueue.archive a),
  (SELECT string_agg(s::text, E'\n' ORDER BY s.tbl, s.slot) FROM pgqueue.slots s),
  (SELECT string_agg(c.oid::regclass::text || ' ' || pg_get_expr(c.relpartbound, c.oid), E'\n'
                     ORDER BY c.oid::regclass::text)
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent IN ('pgqueue.archive'::regclass, 'pgqueue.queue'::regclass,
                          'pgqueue.work_queue'::regclass)))};

# --- the reference: restored where no scheduler runs ---------------------------
my ($out, $err);
IPC::Run::run([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('ref'), $dump ],
	'>', \$out, '2>', \$err);
is($? >> 8, 0, 'the reference restore succeeds');
my $ref = $node->safe_psql('ref', $everything);
like($ref, qr/queue_1 .*work_queue_1 /s, 'the reference has rows in slots made at run time');

# A session of database $db that, from the moment pgqueue.queues exists (the
# restore's CREATE EXTENSION committed), holds SHARE on it for $secs: the
# restore's COPY of the settings waits, the jobs' rows already in.
sub stall_settings
{
	my ($db, $secs) = @_;
	my $s = $node->background_psql($db);
	$s->query_until(qr/stalling/, qq{\\echo stalling
DO \$\$
BEGIN
  LOOP
    COMMIT;
    EXIT WHEN to_regclass('pgqueue.queues') IS NOT NULL;
    PERFORM pg_sleep(0.005);
  END LOOP;
  EXECUTE 'LOCK TABLE pgqueue.queues IN SHARE MODE';
  PERFORM pg_sleep($secs);
END
\$\$;
});
	return $s;
}

# Run pg_restore with @opts into $db; returns its exit code and stderr.
sub restore
{
	my ($db, @opts) = @_;
	my ($o, $e);
	IPC::Run::run([ 'pg_restore', '--exit-on-error', @opts, '-d', $node->connstr($db), $dump ],
		'>', \$o, '2>', \$e);
	return ($? >> 8, $e);
}

# Check database $db against the reference after the restore of mode $mode.
sub check_restored
{
	my ($db, $mode, $rc, $stderr) = @_;
	is($rc, 0, "$mode: pg_restore exits with 0");
	is($stderr, '', "$mode: and says nothing");
	my $got = $node->safe_psql($db, $everything);
	ok($got eq $ref, "$mode: every job (state, version, tries, lease, holder, slot), setting, archive row, slot state and partition is back as in the reference");
	if ($got ne $ref)
	{
		# the first lines that differ, for the log
		my @g = split /\n/, $got;
		my @r = split /\n/, $ref;
		my $shown = 0;
		for my $i (0 .. ($#g > $#r ? $#g : $#r))
		{
			next if ($g[$i] // '') eq ($r[$i] // '');
			diag("line $i\n  got:  " . ($g[$i] // '(none)') . "\n  want: " . ($r[$i] // '(none)'));
			last if ++$shown >= 5;
		}
		diag(sprintf('%d lines, want %d', scalar(@g), scalar(@r)));
	}
	is( $node->safe_psql($db, q{
SELECT count(*) FILTER (WHERE q.state = 'pending' AND w.id IS NULL) || '/' || count(*)
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id) WHERE q.queue = 'held'}),
		'60/60', "$mode: the paused queue's 60 jobs are pending, none in work_queue");
	is($node->safe_psql($db, q{SELECT paused FROM pgqueue.queues WHERE queue = 'held'}),
		't', "$mode: and the queue is paused");
}

my $offset = -s $node->logfile;

# --- a whole pg_restore, the settings held back 3 s --------------------------
my $s = stall_settings('r_whole', 3);
my $t0 = time;
my ($rc, $e) = restore('r_whole');
my $dt = time - $t0;
$s->quit;
cmp_ok($dt, '>', 2.5, sprintf('whole: the restore waited for the settings (%.1fs)', $dt));
check_restored('r_whole', 'whole', $rc, $e);

# --- by sections, 3 s apart ------------------------------------------------------
my @errs;
($rc, $e) = restore('r_sections', '--section=pre-data');
push @errs, $e;
sleep 3;
if ($rc == 0)
{
	($rc, $e) = restore('r_sections', '--section=data');
	push @errs, $e;
}
sleep 3;
if ($rc == 0)
{
	($rc, $e) = restore('r_sections', '--section=post-data');
	push @errs, $e;
}
check_restored('r_sections', 'by sections', $rc, join('', @errs));

# --- whole, in a single transaction ---------------------------------------------
($rc, $e) = restore('r_single', '-1');
check_restored('r_single', 'single transaction', $rc, $e);

# --- by sections, each in a single transaction, 3 s apart ----------------------
@errs = ();
($rc, $e) = restore('r_single_sections', '-1', '--section=pre-data');
push @errs, $e;
sleep 3;
if ($rc == 0)
{
	($rc, $e) = restore('r_single_sections', '-1', '--section=data');
	push @errs, $e;
}
sleep 3;
if ($rc == 0)
{
	($rc, $e) = restore('r_single_sections', '-1', '--section=post-data');
	push @errs, $e;
}
check_restored('r_single_sections', 'by sections, each a single transaction', $rc,
	join('', @errs));

# --- parallel (-j 2), the settings held back 3 s ---------------------------------
$s = stall_settings('r_parallel', 3);
$t0 = time;
($rc, $e) = restore('r_parallel', '-j', '2');
$dt = time - $t0;
$s->quit;
cmp_ok($dt, '>', 2.5, sprintf('parallel: the restore waited for the settings (%.1fs)', $dt));
check_restored('r_parallel', 'parallel', $rc, $e);

# --- the schedulers paused, and resume ------------------------------------------
for my $db (@targets)
{
	like(
		slurp_file($node->logfile, $offset),
		qr/pgqueue scheduler LOG:  pgqueue scheduler: database "$db": pausing/,
		"$db: its scheduler said it paused");
}
like(
	slurp_file($node->logfile, $offset),
	qr/LOG:  pgqueue: the scheduler of database "r_whole" pauses while this session loads pgqueue's tables/,
	'the restoring session said what it does');
for my $db (@targets)
{
	$node->wait_for_log(
		qr/pgqueue scheduler LOG:  pgqueue scheduler: database "$db": resuming/, $offset);
	pass("$db: its scheduler resumed");
	my $id = $node->safe_psql($db, q{SELECT pgq_push('r', '{"n": "new"}')});
	ok( $node->poll_query_until(
			$db, "SELECT count(*) = 1 FROM pgqueue.work_queue WHERE id = '$id'"),
		"$db: a new job is scheduled");
	is( $node->safe_psql($db, q{
SELECT count(*) FROM pgqueue.queue WHERE queue = 'held' AND state = 'pending'}),
		'60', "$db: the paused queue's jobs are still pending");
	is( $node->safe_psql($db, q{
SELECT count(*) FILTER (WHERE pgq_ack(id, 'w1')) FROM pgqueue.work_queue WHERE lock_key = 'w1'}),
		'10', "$db: the restored leases are acked by their holder");
	is( $node->safe_psql($db, q{
SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'w3')) FROM pgq_claim('w3', 10000, '1 hour', ARRAY['r']) c}),
		'2991', "$db: every other job of r is claimed and acked, from every slot");
}

$node->stop;
done_testing();
