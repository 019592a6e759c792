# ALTER EXTENSION pgqueue UPDATE from 1.1 to 1.2 on a live database, a
# 1.1 dump restored into 1.2, the schema an update leaves, and what stops
# or warns about the update.
#
# 1. Rounds (PGQ_T035_ROUNDS, default 2: about 25 s each; more for a
#    stress run, e.g. PGQ_T035_ROUNDS=8) on database postgres, where the
#    scheduler runs with small slots (the rings turn every few hundred
#    jobs): DROP EXTENSION pgqueue CASCADE; CREATE EXTENSION pgqueue
#    VERSION '1.1'; both rings turned (counted); jobs pending (delayed, and
#    held back by max_in_flight), in retry, scheduled, running under a
#    lease held by 'holder' on its second try, failed, a paused queue's
#    backlog, a dedup job; then pgbench (4 clients, push of 4 jobs / claim+ack in
#    one statement / claim, then ack in a later statement of the
#    transaction / claim+nack) and, while it runs, ALTER EXTENSION pgqueue
#    UPDATE.  Every push, ack and nack is recorded in a table of the test
#    in the transaction that made it.  Afterwards, once the transactions
#    in flight have ended: no job is 'scheduled' without its work_queue
#    row; every job pushed is acked once or still in pgqueue.queue, never
#    both, never twice; the jobs outside the load kept state, tries, lease
#    and holder; the holder extends and acks its job; the failed job is
#    retried; max_tries => 1 makes a nack fail the job.
# 2. After each update: max_tries in every attached slot of pgqueue.queue
#    and pgqueue.work_queue, failed_idx on (queue, id) in every attached
#    slot of pgqueue.queue, and in a slot the ring makes after the update.
# 3. Round 1's 1.1 database, pg_dump'ed (-Fc) before its update, restored
#    into a new database, where CREATE EXTENSION gives 1.2.
# 4. pg_dump --schema-only (plain and --binary-upgrade, normalised as
#    t/033_upgrade_dump.pl does) of a fresh 1.2, a 1.1 updated to 1.2 and
#    a 1.0 updated to 1.2 in one ALTER EXTENSION pgqueue UPDATE.
# 5. A view or a BEGIN ATOMIC function calling pgq_push stops the update
#    (2BP01) and leaves 1.1 working; a role's EXECUTE on pgq_push is named
#    in a WARNING whose HINT holds the GRANT to run again.
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

my $rounds = $ENV{PGQ_T035_ROUNDS} // 2;
my $load_secs = 10;
my $update_after = 4;    # seconds into the load

my $node = pgq_node(
	'upgrade12', qq{
pgqueue.slot_size = 64
pgqueue.naptime = 50
autovacuum = off
});
$node->start;
wait_for_scheduler($node, 'postgres');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# the records of the test, kept across DROP EXTENSION (emptied each round)
q1(q{
CREATE TABLE pushed (id uuid NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE acked (id uuid NOT NULL, key text, ok boolean, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE nacked (id uuid NOT NULL, key text, outcome text, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE claimed (id uuid NOT NULL, key text);
});

my $dir = $PostgreSQL::Test::Utils::tmp_check . '/upgrade12';
mkdir $dir;
my %script = (
	push => q{
\set q random(1, 2)
INSERT INTO pushed (id) SELECT pgq_push_batch((ARRAY['a', 'b'])[:q],
  ARRAY(SELECT jsonb_build_object('n', g, 'pad', repeat('x', 200)) FROM generate_series(1, 3) g));
INSERT INTO pushed (id) SELECT pgq_push((ARRAY['a', 'b'])[:q], jsonb_build_object('pad', repeat('y', 200)));
},
	ack => q{
INSERT INTO acked (id, key, ok) SELECT c.id, 'ack' || :client_id, pgq_ack(c.id, 'ack' || :client_id)
  FROM pgq_claim('ack' || :client_id, 5, '1 minute', ARRAY['a', 'b'], '100 ms') c;
},
	ack_tx => q{
BEGIN;
INSERT INTO claimed SELECT c.id, 'tx' || :client_id
  FROM pgq_claim('tx' || :client_id, 5, '1 minute', ARRAY['a', 'b'], '100 ms') c;
SELECT pg_sleep(0.01);
WITH d AS (DELETE FROM claimed WHERE key = 'tx' || :client_id RETURNING id, key)
INSERT INTO acked (id, key, ok) SELECT d.id, d.key, pgq_ack(d.id, d.key) FROM d;
COMMIT;
},
	nack => q{
INSERT INTO nacked (id, key, outcome) SELECT c.id, 'nack' || :client_id, pgq_nack(c.id, 'nack' || :client_id, 'boom', '0')
  FROM pgq_claim('nack' || :client_id, 1, '1 minute', ARRAY['a', 'b'], '100 ms') c;
},
);
for my $name (keys %script)
{
	open(my $fh, '>', "$dir/$name.sql") or die;
	print $fh $script{$name};
	close($fh);
}

# --- helpers -----------------------------------------------------------------

# psql that gives up instead of waiting behind the update's locks:
# (ok, output)
sub try_q
{
	my ($sql) = @_;
	my ($ret, $out) =
	  $node->psql('postgres', "SET lock_timeout = '200ms';\n$sql", on_error_stop => 1);
	return ($ret == 0, $out);
}

sub current_of { return current_slot($node, $_[0]); }

my $current_sql = q{
SELECT coalesce((SELECT slot FROM pgqueue.slots WHERE tbl = '%s' AND state = 'current'), 0)};

# Turn the ring of pgqueue.queue by pushing batches into the paused queue
# 'stopped' (recorded); returns (slot before, slot after).
sub turn_queue_rec
{
	my $from = current_of('queue');
	for (1 .. 60)
	{
		q1(q{
INSERT INTO pushed (id) SELECT pgq_push_batch('stopped', ARRAY(SELECT jsonb_build_object('n', g, 'pad', repeat('x', 200))
                                                              FROM generate_series(1, 100) g))});
		return ($from, current_of('queue'))
		  if poll_bounded($node, sprintf($current_sql, 'queue') . " <> $from", 1);
	}
	die "the ring of pgqueue.queue did not turn from slot $from";
}

# Turn the ring of pgqueue.work_queue: jobs of queue 'w' pushed, scheduled,
# claimed and acked (recorded); returns (slot before, slot after).
sub turn_work_rec
{
	my $from = current_of('work_queue');
	for (1 .. 80)
	{
		q1(q{
INSERT INTO pushed (id) SELECT pgq_push_batch('w', ARRAY(SELECT jsonb_build_object('n', g)
                                                        FROM generate_series(1, 50) g))});
		poll_bounded($node,
			"SELECT count(*) = 0 FROM pgqueue.queue WHERE queue = 'w' AND state = 'pending'", 20)
		  or die "the jobs of w were not scheduled";
		q1(q{
INSERT INTO acked (id, key, ok) SELECT c.id, 'turner', pgq_ack(c.id, 'turner')
  FROM pgq_claim('turner', 100, '1 minute', ARRAY['w']) c});
		return ($from, current_of('work_queue'))
		  if poll_bounded($node, sprintf($current_sql, 'work_queue') . " <> $from", 0.5);
	}
	die "the ring of pgqueue.work_queue did not turn from slot $from";
}

# wait until the due jobs of queue $q are all released to work_queue
sub wait_scheduled
{
	my ($q) = @_;
	poll_bounded($node, qq{
SELECT count(*) = 0 FROM pgqueue.queue
 WHERE queue = '$q' AND state IN ('pending', 'retry') AND run_after <= now()}, 30)
	  or die "the jobs of $q were not scheduled";
}

# wait until every transaction in flight now (with an xid) has ended
sub wait_in_flight
{
	my ($db) = @_;
	$db //= 'postgres';
	my $x = $node->safe_psql($db, 'SELECT pg_current_xact_id()');
	$node->poll_query_until($db,
		"SELECT pg_snapshot_xmin(pg_current_snapshot()) > '$x'::xid8")
	  or die "transactions in flight at xid $x never ended";
}

# every job outside the load, as it is (state, tries, lease, holder)
my $jobs_sql = q{
SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', q.id, q.queue, q.state,
                                  coalesce(w.tries, q.tries), w.lock_key, w.lock_timeout,
                                  q.last_error, q.run_after, q.payload, q.dedup_key),
                           E'\n' ORDER BY q.id), '')
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 WHERE q.queue NOT IN ('a', 'b')};

# attached slots (partitions) of pgqueue.$tbl
sub slot_names
{
	my ($db, $tbl) = @_;
	return $node->safe_psql($db, qq{
SELECT string_agg(c.relname, ',' ORDER BY c.relname)
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'pgqueue.$tbl'::regclass});
}

# the attached slots of pgqueue.$tbl that lack column max_tries
my $no_max_tries_sql = q{
SELECT count(*), coalesce(string_agg(c.relname, ',') FILTER (WHERE a.attname IS NULL), '')
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'max_tries' AND NOT a.attisdropped
 WHERE i.inhparent = 'pgqueue.%s'::regclass};

# the attached slots of pgqueue.queue and their failed_idx definition
my $failed_idx_sql = q{
SELECT count(*),
       coalesce(string_agg(c.relname || ': ' || coalesce(pg_get_indexdef(x.oid), 'none'), '; ')
                  FILTER (WHERE pg_get_indexdef(x.oid) IS DISTINCT FROM
                          format('CREATE INDEX %I ON pgqueue.%I USING btree (queue, id) WHERE (state = ''failed''::pgqueue.job_state)',
                                 c.relname || '_failed_idx', c.relname)), '')
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  LEFT JOIN pg_class x ON x.relname = c.relname || '_failed_idx' AND x.relnamespace = c.relnamespace
 WHERE i.inhparent = 'pgqueue.queue'::regclass};

# the attached slots of pgqueue.queue whose group_idx (1.2) is missing or
# not the one ring.c makes
my $group_idx_sql = q{
SELECT count(*),
       coalesce(string_agg(c.relname || ': ' || coalesce(pg_get_indexdef(x.oid), 'none'), '; ')
                  FILTER (WHERE pg_get_indexdef(x.oid) IS DISTINCT FROM
                          format('CREATE INDEX %I ON pgqueue.%I USING btree (queue, group_key, ((state = ''pending''::pgqueue.job_state)), ((- (priority)::bigint)), run_after, id) WHERE ((group_key IS NOT NULL) AND (state = ANY (ARRAY[''pending''::pgqueue.job_state, ''retry''::pgqueue.job_state, ''scheduled''::pgqueue.job_state])))',
                                 c.relname || '_group_idx', c.relname)), '')
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  LEFT JOIN pg_class x ON x.relname = c.relname || '_group_idx' AND x.relnamespace = c.relnamespace
 WHERE i.inhparent = 'pgqueue.queue'::regclass};

sub check_slots
{
	my ($db, $what) = @_;
	for my $tbl ('queue', 'work_queue')
	{
		my ($n, $missing) = split /\|/, $node->safe_psql($db, sprintf($no_max_tries_sql, $tbl)), -1;
		is($missing, '', "$what: column max_tries in each of the $n attached slots of pgqueue.$tbl");
	}
	my ($n, $bad) = split /\|/, $node->safe_psql($db, $failed_idx_sql), -1;
	is($bad, '', "$what: failed_idx on (queue, id) in each of the $n attached slots of pgqueue.queue");
	($n, $bad) = split /\|/, $node->safe_psql($db, $group_idx_sql), -1;
	is($bad, '', "$what: group_idx in each of the $n attached slots of pgqueue.queue");
}

# lost jobs: 'scheduled' without a work_queue row, checked once the
# transactions in flight have ended; diagnostic detail on failure
sub check_lost
{
	my ($what, $log_offset, $context) = @_;
	wait_in_flight();
	my $n = q1(q{
SELECT count(*) FROM pgqueue.queue q WHERE q.state = 'scheduled'
   AND NOT EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id)});
	my $ok = is($n, '0', "$what: no job 'scheduled' without its work_queue row");
	my $orphans = q1(q{
SELECT count(*) FROM pgqueue.work_queue w
 WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queue q WHERE q.id = w.id AND q.state = 'scheduled')});
	$ok &= is($orphans, '0', "$what: no work_queue row without its 'scheduled' job");
	return if $ok;
	diag("context: $context");
	diag("lost jobs (id, queue, created, slot, version, tries, run_after, pushed at, acks, nacks):\n"
		  . q1(q{
SELECT q.id, q.queue, q.created, q.tableoid::regclass, q.version, q.tries, q.run_after,
       (SELECT string_agg(p.at::text, ',') FROM pushed p WHERE p.id = q.id),
       (SELECT string_agg(a.key || ':' || a.ok || '@' || a.at, ',') FROM acked a WHERE a.id = q.id),
       (SELECT string_agg(n.key || ':' || n.outcome || '@' || n.at, ',') FROM nacked n WHERE n.id = q.id)
  FROM pgqueue.queue q WHERE q.state = 'scheduled'
   AND NOT EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id)
 ORDER BY q.created LIMIT 60}));
	diag("lost jobs by slot and created second:\n" . q1(q{
SELECT q.tableoid::regclass, date_trunc('second', q.created), count(*)
  FROM pgqueue.queue q WHERE q.state = 'scheduled'
   AND NOT EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id)
 GROUP BY 1, 2 ORDER BY 2, 1}));
	diag("slots:\n" . q1(q{SELECT tbl, slot, state, since, low FROM pgqueue.slots ORDER BY tbl, slot}));
	my @log = split /\n/, slurp_file($node->logfile, $log_offset);
	my $from = @log > 80 ? @log - 80 : 0;
	diag("server log tail:\n" . join("\n", @log[ $from .. $#log ]));
}

# every job pushed is acked once or still in pgqueue.queue, never both
sub check_accounting
{
	my ($what) = @_;
	my $r = q1(q{
WITH p AS (SELECT id, count(*) n FROM pushed GROUP BY id),
     a AS (SELECT id, count(*) n FROM acked WHERE ok GROUP BY id),
     q AS (SELECT id, count(*) n FROM pgqueue.queue GROUP BY id)
SELECT (SELECT count(*) FROM p),
       (SELECT count(*) FROM p WHERE n > 1),
       (SELECT count(*) FROM a),
       (SELECT count(*) FROM a WHERE n > 1),
       (SELECT count(*) FROM q WHERE n > 1),
       (SELECT count(*) FROM p WHERE NOT EXISTS (SELECT FROM a WHERE a.id = p.id)
                                 AND NOT EXISTS (SELECT FROM q WHERE q.id = p.id)),
       (SELECT count(*) FROM a JOIN q USING (id)),
       (SELECT count(*) FROM q WHERE NOT EXISTS (SELECT FROM p WHERE p.id = q.id)),
       (SELECT count(*) FROM a WHERE NOT EXISTS (SELECT FROM p WHERE p.id = a.id)),
       (SELECT count(*) FROM pgqueue.queue WHERE state = 'failed'),
       (SELECT count(*) FROM pgqueue.queue)});
	my ($pushed, $pushed2, $acks, $acks2, $queue2, $gone, $both, $unknown, $acked_unknown,
		$failed, $left) = split /\|/, $r;
	is( "$pushed2|$acks2|$queue2|$gone|$both|$unknown|$acked_unknown",
		'0|0|0|0|0|0|0',
		"$what: each of $pushed jobs pushed is accounted for once ($acks acked, $left in pgqueue.queue of which $failed failed)"
	  )
	  or diag("pushed twice $pushed2, acked twice $acks2, twice in queue $queue2, "
		  . "neither acked nor in queue $gone, acked and in queue $both, in queue unpushed $unknown, "
		  . "acked unpushed $acked_unknown\n"
		  . q1(q{
SELECT p.id, p.at FROM pushed p
 WHERE NOT EXISTS (SELECT FROM acked a WHERE a.id = p.id AND a.ok)
   AND NOT EXISTS (SELECT FROM pgqueue.queue q WHERE q.id = p.id) LIMIT 30}));
	my $archived = q1(q{SELECT count(*) FROM pgqueue.archive WHERE outcome = 'acked' AND queue IN ('a', 'b')});
	my $acks_ab = q1(q{
SELECT count(*) FROM acked a WHERE a.ok AND a.key IS DISTINCT FROM 'turner'
   AND EXISTS (SELECT FROM pgqueue.archive r WHERE r.id = a.id AND r.queue IN ('a', 'b'))});
	my $acks_load = q1(q{SELECT count(*) FROM acked a WHERE a.ok AND (a.key LIKE 'ack%' OR a.key LIKE 'tx%' OR a.key = 'last')});
	is("$archived|$acks_ab", "$acks_load|$acks_load",
		"$what: each of the $acks_load acks of the load wrote its archive row");
	return ($pushed, $acks, $failed, $left);
}

# the pgbench of the load, started at once
sub start_load
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-c', 4, '-j', 2, '-T', $load_secs,
			'-f', "$dir/push.sql\@4", '-f', "$dir/ack.sql\@2",
			'-f', "$dir/ack_tx.sql\@2", '-f', "$dir/nack.sql\@1",
			$node->connstr('postgres')
		],
		'>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# --- the rounds ----------------------------------------------------------------
my $dump = "$dir/v11.dump";
my $dump_jobs;     # round 1's jobs at the dump
my %total = (pushed => 0, acked => 0, nacked => 0, failed => 0, qturns => 0, wturns => 0,
	new_slots => 0);

for my $round (1 .. $rounds)
{
	my $r = "round $round";
	my $log_offset = -s $node->logfile;
	q1(q{
DROP EXTENSION IF EXISTS pgqueue CASCADE;
TRUNCATE pushed, acked, nacked, claimed;
CREATE EXTENSION pgqueue VERSION '1.1';
});
	is(q1("SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"), '1.1',
		"$r: installed at 1.1");
	my $passes = counter($node, 'postgres', 'scheduler_passes');
	ok($node->poll_query_until('postgres', "SELECT scheduler_passes > $passes + 2 FROM pgq_counters()"),
		"$r: the scheduler runs its passes on 1.1");
	q1(q{
SELECT pgq_configure('a', retention => '1 day');
SELECT pgq_configure('b', retention => '1 day', max_tries => 1);
SELECT pgq_configure('capped', max_in_flight => 1);
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_configure('stopped', paused => true);
});

	# the rings turned on 1.1
	my %turns = (queue => 0, work_queue => 0);
	my @seen;
	for (1 .. 2)
	{
		my ($f, $t) = turn_queue_rec();
		push @seen, "queue $f->$t";
		$turns{queue}++;
		($f, $t) = turn_work_rec();
		push @seen, "work_queue $f->$t";
		$turns{work_queue}++;
	}
	note "$r: turns on 1.1 before the load: @seen";

	# jobs in every state
	my $later = q1(q{INSERT INTO pushed (id) SELECT pgq_push('later', '{"n": "later"}', run_after => now() + interval '1 hour') RETURNING id});
	q1(q{INSERT INTO pushed (id) SELECT pgq_push('capped', jsonb_build_object('n', g)) FROM generate_series(1, 3) g});
	my $dedup = q1(q{INSERT INTO pushed (id) SELECT pgq_push('dd', '{"n": "once"}', run_after => now() + interval '1 hour', dedup_key => 'once') RETURNING id});
	my $dead = q1(q{INSERT INTO pushed (id) SELECT pgq_push('dead', '{"n": "dead"}') RETURNING id});
	my $rq = q1(q{INSERT INTO pushed (id) SELECT pgq_push('rq', '{"n": "retry"}') RETURNING id});
	my $held = q1(q{INSERT INTO pushed (id) SELECT pgq_push('held', '{"n": "held"}') RETURNING id});
	wait_scheduled($_) for qw(dead rq held);
	is( q1(q{
INSERT INTO nacked (id, key, outcome) SELECT id, 'w_dead', pgq_nack(id, 'w_dead', 'failed on 1.1')
  FROM pgq_claim('w_dead', 1, '1 hour', ARRAY['dead']) RETURNING outcome}),
		'failed', "$r: a job failed on 1.1");
	is( q1(q{
INSERT INTO nacked (id, key, outcome) SELECT id, 'w_rq', pgq_nack(id, 'w_rq', 'later', '1 hour')
  FROM pgq_claim('w_rq', 1, '1 hour', ARRAY['rq']) RETURNING outcome}),
		'retry', "$r: a job nacked on 1.1, to retry in an hour");
	is( q1(q{
INSERT INTO nacked (id, key, outcome) SELECT id, 'holder', pgq_nack(id, 'holder', 'first try', '0')
  FROM pgq_claim('holder', 1, '1 hour', ARRAY['held']) RETURNING outcome}),
		'retry', "$r: the held job's first try nacked");
	wait_scheduled('held');
	is(q1(q{SELECT id, tries FROM pgq_claim('holder', 1, '1 hour', ARRAY['held'])}),
		"$held|2", "$r: 'holder' holds its job on its second try, under a lease of an hour");
	poll_bounded($node,
		"SELECT count(*) = 1 FROM pgqueue.queue WHERE queue = 'capped' AND state = 'scheduled'", 30)
	  or die 'no job of capped was scheduled';
	is( q1(q{
SELECT string_agg(queue || ':' || state, ',' ORDER BY queue, state) FROM
  (SELECT q.queue, CASE WHEN w.lock_key IS NOT NULL THEN 'running' ELSE q.state::text END AS state
     FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
    WHERE q.queue <> 'stopped' GROUP BY 1, 2) s}),
		'capped:pending,capped:scheduled,dd:pending,dead:failed,held:running,later:pending,rq:retry',
		"$r: jobs pending, scheduled, running, in retry and failed on 1.1");
	my $backlog = q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue = 'stopped' AND state = 'pending'});
	cmp_ok($backlog, '>=', 200, "$r: the paused queue's backlog: $backlog jobs");
	my $held_tries = q1("SELECT tries || '|' || lock_key || '|' || version FROM pgqueue.work_queue WHERE id = '$held'");

	# 3. round 1's 1.1 database, dumped as it is now
	if ($round == 1)
	{
		$dump_jobs = q1($jobs_sql);
		$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ],
			"$r: pg_dump -Fc of the 1.1 database");
		is(q1($jobs_sql), $dump_jobs, "$r: no job outside the load changed while pg_dump ran");
		note "$r: dumped with slots queue: " . slot_names('postgres', 'queue')
		  . '; work_queue: ' . slot_names('postgres', 'work_queue');
	}
	my $before = q1($jobs_sql);

	# the load, and the update while it runs
	my $load = start_load();
	my $began = time;
	my ($upd, $upd_out, $upd_err, $upd_started, $upd_done_at, $upd_secs);
	my %cur = map { $_ => current_of($_) } keys %turns;
	my %after_turns = (queue => 0, work_queue => 0);
	my %spread = (queue => 0, work_queue => 0);
	my $samples = 0;
	my $waiters = 0;       # most sessions seen waiting for a lock during the update
	my $upd_waited = 0;    # samples that saw the update wait for a lock
	while ($load->{h}->pumpable || ($upd && $upd->pumpable))
	{
		if (!$upd && time - $began >= $update_after)
		{
			($upd_out, $upd_err) = ('', '');
			$upd_started = time;
			$upd = IPC::Run::start(
				[
					'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
					'-c', 'ALTER EXTENSION pgqueue UPDATE'
				],
				'>', \$upd_out, '2>', \$upd_err);
		}
		if ($upd && !defined $upd_secs && !$upd->pumpable)
		{
			$upd->finish;
			$upd_secs = time - $upd_started;
			$upd_done_at = q1('SELECT clock_timestamp()');
		}
		if ($upd && !defined $upd_secs)
		{
			my ($ok, $n) = try_q(q{
SELECT count(*) FILTER (WHERE query NOT LIKE 'ALTER EXTENSION%'),
       count(*) FILTER (WHERE query LIKE 'ALTER EXTENSION%')
  FROM pg_stat_activity
 WHERE datname = 'postgres' AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'});
			if ($ok)
			{
				my ($w, $u) = split /\|/, $n;
				$waiters = $w if $w > $waiters;
				$upd_waited++ if $u > 0;
			}
		}
		for my $tbl (keys %turns)
		{
			my ($ok, $now) = try_q(sprintf($current_sql, $tbl));
			next unless $ok;
			if ($now ne $cur{$tbl})
			{
				$turns{$tbl}++;
				$after_turns{$tbl}++ if defined $upd_secs;
			}
			$cur{$tbl} = $now;
			my ($ok2, $n) = try_q("SELECT count(DISTINCT tableoid) FROM pgqueue.$tbl");
			$spread{$tbl} = $n if $ok2 && $n > $spread{$tbl};
		}
		$samples++;
		$load->{h}->pump_nb;
		$upd->pump_nb if $upd && $upd->pumpable;
		usleep(100_000);
	}
	$load->{h}->finish;
	if (!defined $upd_secs)
	{
		$upd->finish;
		$upd_secs = time - $upd_started;
		$upd_done_at = q1('SELECT clock_timestamp()');
	}
	is($upd->result(0), 0, sprintf("$r: ALTER EXTENSION pgqueue UPDATE under load (%.1f s)", $upd_secs))
	  or diag("update stderr: $upd_err");
	is(q1("SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"), '1.2', "$r: at 1.2");
	note "$r: the update's messages: $upd_err" if $upd_err ne '';
	is($load->{h}->result(0), 0, "$r: pgbench ran to its end") or diag(${ $load->{err} });
	unlike(${ $load->{err} }, qr/aborted|ERROR/, "$r: no pgbench client met an error");
	my ($tx) = ${ $load->{out} } =~ /number of transactions actually processed: (\d+)/;
	note "$r: pgbench: " . ($tx // '?') . " transactions; " . join('; ', map { s/^\s+//r }
		  grep { /^(tps|latency average|number of failed)/ || /^ +[\d.]+ +.*\.sql/ } split /\n/, ${ $load->{out} });

	# what the load did before and after the update
	my ($p_before, $p_after, $a_after, $n_after) = split /\|/, q1(qq{
SELECT (SELECT count(*) FROM pushed WHERE at < '$upd_done_at'),
       (SELECT count(*) FROM pushed WHERE at > '$upd_done_at'),
       (SELECT count(*) FROM acked WHERE ok AND at > '$upd_done_at'),
       (SELECT count(*) FROM nacked WHERE at > '$upd_done_at')});
	cmp_ok($p_after, '>', 0,
		"$r: the load pushed after the update too ($p_before jobs pushed before its end, $p_after after)");
	cmp_ok($a_after, '>', 0, "$r: acks after the update ($a_after)");
	cmp_ok($n_after, '>', 0, "$r: nacks after the update ($n_after)");
	# queue b has a max_tries of 1: a nack fails its job
	my ($f_before, $f_after, $f_jobs) = split /\|/, q1(qq{
SELECT count(*) FILTER (WHERE at < '$upd_done_at'), count(*) FILTER (WHERE at > '$upd_done_at'),
       (SELECT count(*) FROM pgqueue.queue WHERE queue IN ('a', 'b') AND state = 'failed')
  FROM nacked WHERE outcome = 'failed' AND key LIKE 'nack%'});
	cmp_ok($f_before + $f_after, '>', 0,
		"$r: the load's nacks failed jobs ($f_before before the update's end, $f_after after)");
	is($f_jobs, $f_before + $f_after, "$r: each nack that answered 'failed' left its job failed");
	cmp_ok($turns{queue}, '>=', 3, "$r: queue's ring turned $turns{queue} times ($after_turns{queue} after the update)");
	cmp_ok($turns{work_queue}, '>=', 3,
		"$r: work_queue's ring turned $turns{work_queue} times ($after_turns{work_queue} after the update)");
	cmp_ok($after_turns{queue} + $after_turns{work_queue}, '>', 0,
		"$r: the rings turned under the load after the update too");
	cmp_ok($spread{queue}, '>=', 2, "$r: pgqueue.queue's rows were in up to $spread{queue} slots at once");
	cmp_ok($spread{work_queue}, '>=', 2,
		"$r: pgqueue.work_queue's rows were in up to $spread{work_queue} slots at once");
	note "$r: $samples samples of the rings over the load; during the update up to $waiters sessions seen waiting for a lock, the update seen waiting in $upd_waited samples";

	check_lost("$r, right after the load", $log_offset,
		"update from +${update_after}s for ${upd_secs}s, done at $upd_done_at");

	# the jobs outside the load kept everything
	is(q1($jobs_sql), $before, "$r: every job outside the load kept its state, tries, lease and holder");
	is(q1("SELECT tries || '|' || lock_key || '|' || version FROM pgqueue.work_queue WHERE id = '$held'"),
		$held_tries, "$r: the held job's tries, holder and version in its work_queue row");

	# 2. the slots
	check_slots('postgres', "$r, after the update");

	# the rest of the load, claimed and acked
	for (1 .. 300)
	{
		my $n = q1(q{
WITH c AS (SELECT * FROM pgq_claim('last', 100, '1 minute', ARRAY['a', 'b'], '100 ms'))
INSERT INTO acked (id, key, ok) SELECT c.id, 'last', pgq_ack(c.id, 'last') FROM c RETURNING 1});
		last
		  if $n eq ''
		  && q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue IN ('a', 'b') AND state <> 'failed'}) eq '0';
	}
	is(q1(q{SELECT count(*) FROM pgqueue.queue WHERE queue IN ('a', 'b') AND state <> 'failed'}),
		'0', "$r: the load's jobs left are claimed and acked");
	check_lost("$r, after the drain", $log_offset, "update done at $upd_done_at");

	# the holder carries on, with the tries it had
	ok(q1("SELECT pgq_extend('$held', 'holder', '1 hour') IS NOT NULL") eq 't',
		"$r: the holder extends its lease after the update");
	is(q1("SELECT pgq_extend('$held', 'other', '1 hour') IS NULL"), 't', "$r: another key cannot");
	is( q1(qq{
INSERT INTO acked (id, key, ok) SELECT '$held', 'holder', pgq_ack('$held', 'holder') RETURNING ok}),
		't', "$r: and acks it");

	# the job failed on 1.1 is retried
	is(q1("SELECT pgq_retry('$dead')"), 't', "$r: the job failed on 1.1 is retried");
	wait_scheduled('dead');
	is( q1(q{
WITH c AS (SELECT * FROM pgq_claim('w_dead', 1, '1 hour', ARRAY['dead']))
INSERT INTO acked (id, key, ok) SELECT c.id, 'w_dead', pgq_ack(c.id, 'w_dead') FROM c
RETURNING format('%s|%s', id, ok)}),
		"$dead|t", "$r: claimed and acked");

	# the dedup job keeps its key; the retry and the delayed job wait
	is(q1("SELECT pgq_push('dd', '{}', dedup_key => 'once')"), $dedup,
		"$r: a push with the dedup job's key returns it");
	is(q1("SELECT state FROM pgqueue.queue WHERE id IN ('$later', '$rq') ORDER BY id = '$rq'"),
		"pending\nretry", "$r: the delayed job is pending, the nacked one in retry");

	# max_tries after the update
	my $mt = q1(q{INSERT INTO pushed (id) SELECT pgq_push('mt', '{"n": "mt"}', max_tries => 1) RETURNING id});
	q1(q{INSERT INTO pushed (id) SELECT pgq_push_batch('mt2', ARRAY['{}'::jsonb], max_tries => 2)});
	is(q1("SELECT max_tries FROM pgqueue.jobs WHERE queue IN ('mt', 'mt2') ORDER BY queue"),
		"1\n2", "$r: pgq_push and pgq_push_batch with max_tries, shown in pgqueue.jobs");
	wait_scheduled('mt');
	is( q1(q{
INSERT INTO nacked (id, key, outcome) SELECT id, 'w_mt', pgq_nack(id, 'w_mt', 'once is enough')
  FROM pgq_claim('w_mt', 1, '1 hour', ARRAY['mt']) RETURNING id || '|' || outcome}),
		"$mt|failed", "$r: a nack of a job pushed with max_tries => 1 fails it");
	wait_scheduled('mt2');
	is( q1(q{
INSERT INTO nacked (id, key, outcome) SELECT id, 'w_mt', pgq_nack(id, 'w_mt', 'first', '0')
  FROM pgq_claim('w_mt', 1, '1 hour', ARRAY['mt2']) RETURNING outcome}),
		'retry', "$r: one of max_tries => 2 retries after its first nack");

	# a slot made by the ring after the update: turns of queue's ring
	# (jobs of the paused queue) until a table that was not there appears.
	# The free slots are reused first, and the slots the turns leave are
	# emptied (the paused queue's rows moved into slot 0) and made free
	# again: a snapshot held meanwhile keeps them from being truncated
	# (src/ring.c), so that the ring soon runs out of free slots.
	my $pin = $node->background_psql('postgres');
	$pin->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	$pin->query_safe('SELECT count(*) FROM pgqueue.slots');
	my %had = map { $_ => 1 } split /,/, slot_names('postgres', 'queue');
	my ($new, $tries) = ('', 0);
	while ($new eq '' && $tries++ < 40)
	{
		my ($f, $t) = turn_queue_rec();
		$after_turns{queue}++;
		$new = join ',', grep { !$had{$_} } split /,/, slot_names('postgres', 'queue');
	}
	$pin->query_safe('COMMIT');
	$pin->quit;
	isnt($new, '', "$r: the ring made slot(s) $new of pgqueue.queue after the update ($tries turns)");
	for my $t (split /,/, $new)
	{
		is( q1(qq{
SELECT pg_get_indexdef('pgqueue.${t}_failed_idx'::regclass) || ' / ' || count(a.attname)
  FROM pg_attribute a WHERE a.attrelid = 'pgqueue.$t'::regclass AND a.attname = 'max_tries'}),
			"CREATE INDEX ${t}_failed_idx ON pgqueue.$t USING btree (queue, id) WHERE (state = 'failed'::pgqueue.job_state) / 1",
			"$r: $t, made after the update, has failed_idx on (queue, id) and max_tries");
	}
	my ($f, $t) = turn_work_rec();
	$after_turns{work_queue}++;
	note "$r: work_queue's ring turned after the update from slot $f to $t";
	check_slots('postgres', "$r, after the turns");
	check_lost("$r, at its end", $log_offset, "update done at $upd_done_at");
	my ($pushed, $acks, $failed) = check_accounting("$r, at its end");
	my $nacks = q1('SELECT count(*) FROM nacked');
	note "$r: $pushed jobs pushed, $acks acked, $nacks nacks, $failed failed; turns queue "
	  . "$turns{queue} + after $after_turns{queue}, work_queue $turns{work_queue} + after $after_turns{work_queue}";
	$total{pushed} += $pushed;
	$total{acked} += $acks;
	$total{nacked} += $nacks;
	$total{failed} += $failed;
	$total{qturns} += $turns{queue} + $after_turns{queue};
	$total{wturns} += $turns{work_queue} + $after_turns{work_queue};
	my @new = split /,/, $new;
	$total{new_slots} += @new;
	is(log_count($node, qr/\] pgqueue (?:launcher|scheduler) (?:ERROR|FATAL|PANIC|WARNING):|server process .* was terminated/, $log_offset),
		0, "$r: no failure of the scheduler in the server log");
}
note sprintf("all %d rounds: %d jobs pushed, %d acked, %d nacks, %d failed; ring turns queue %d, "
	  . "work_queue %d; %d slots made after an update",
	$rounds, @total{qw(pushed acked nacked failed qturns wturns new_slots)});

# --- 3. the 1.1 dump restored into 1.2 --------------------------------------------
{
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres', 'CREATE DATABASE restored');
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ],
		'>', \$out, '2>', \$err);
	is($?, 0, 'pg_restore of the 1.1 dump into a server whose default is 1.2');
	is($err, '', 'and says nothing');
	my $rq = sub { $node->safe_psql('restored', $_[0]) };
	is($rq->("SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'"), '1.2',
		'the restored database is at 1.2');
	is($rq->($jobs_sql), $dump_jobs, 'every job came back in its state, tries, lease and holder');
	my $slots = $rq->(q{
SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent IN ('pgqueue.queue'::regclass, 'pgqueue.work_queue'::regclass)
   AND c.relname !~ '_0$'});
	cmp_ok($slots, '>=', 2, "$slots slots made at run time restored");
	is(log_count($node, qr/column "max_tries" added to the restored slot/, $offset), $slots,
		'the column was added to each of them before its ATTACH (logged)');
	check_slots('restored', 'the restored database');
	is(log_count($node, qr/index "queue_[0-9]+_group_idx" made for the restored slot/, $offset),
		$rq->(q{SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		         WHERE i.inhparent = 'pgqueue.queue'::regclass AND c.relname !~ '_0$'}),
		'the group_idx of each restored slot of pgqueue.queue was made (logged)');
	# no scheduler in this database: pgq_schedule does its passes
	my $held = $rq->(q{SELECT id FROM pgqueue.work_queue WHERE lock_key = 'holder'});
	is($rq->("SELECT tries FROM pgqueue.work_queue WHERE id = '$held'"), '2',
		'the held job is restored on its second try');
	ok($rq->("SELECT pgq_extend('$held', 'holder', '1 hour') IS NOT NULL") eq 't'
		  && $rq->("SELECT pgq_ack('$held', 'holder')") eq 't',
		'its holder extends and acks it');
	my $dead = $rq->(q{SELECT id FROM pgqueue.queue WHERE queue = 'dead' AND state = 'failed'});
	is($rq->("SELECT pgq_retry('$dead')"), 't', 'the failed job is retried');
	$rq->(q{SELECT pgq_configure('stopped', paused => false)});
	my $waiting = $rq->(q{SELECT count(*) FROM pgqueue.queue WHERE state IN ('pending', 'scheduled') AND run_after <= now()});
	my $acked = 0;
	for (1 .. 200)
	{
		$rq->('SELECT pgq_schedule(1000)');
		my $n = $rq->(q{SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'r')) FROM pgq_claim('r', 1000, '1 hour') c});
		$acked += $n;
		last if $n == 0 && $rq->(q{SELECT count(*) FROM pgqueue.queue WHERE state <> 'failed' AND run_after <= now()}) eq '0';
	}
	cmp_ok($waiting, '>=', 200, "$waiting jobs due in the restored database (the paused queue resumed, the retried one)");
	is($acked, $waiting, "every due job claimed and acked, from every restored slot");
	my $mt = $rq->(q{SELECT pgq_push('mt', '{}', max_tries => 1)});
	$rq->('SELECT pgq_schedule()');
	is( $rq->(q{SELECT pgq_nack(id, 'r', 'no') FROM pgq_claim('r', 1, '1 hour', ARRAY['mt'])}),
		'failed', 'pgq_push(..., max_tries => 1) works there: a nack fails the job');
}

# --- 4. the schema: fresh 1.2, 1.1 updated, 1.0 updated in one step ------------
{
	for my $db (qw(fresh12 up11 up10))
	{
		$node->safe_psql('postgres', "CREATE DATABASE $db");
	}
	$node->safe_psql('fresh12', 'CREATE EXTENSION pgqueue');
	$node->safe_psql('up11', "CREATE EXTENSION pgqueue VERSION '1.1'");
	$node->safe_psql('up10', "CREATE EXTENSION pgqueue VERSION '1.0'");
	for my $db (qw(up11 up10))
	{
		$node->safe_psql($db, q{
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_push('q', jsonb_build_object('n', g)) FROM generate_series(1, 4) g;
SELECT pgq_push('dead', '{}');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 1, '1 hour', ARRAY['q']);
SELECT pgq_nack(id, 'w4', 'no more') FROM pgq_claim('w4', 1, '1 hour', ARRAY['dead']);
});
		$node->safe_psql($db, 'ALTER EXTENSION pgqueue UPDATE');
	}
	is( join(',', map { $node->safe_psql($_, "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'") }
			  qw(fresh12 up11 up10)),
		'1.2,1.2,1.2', 'a fresh install, and 1.1 and 1.0 each updated by one ALTER EXTENSION, are at 1.2');

	my ($plain_fresh) = schema_normalise(schema_dump($node, 'fresh12'));
	my ($full_fresh, $missing_fresh) = schema_normalise(schema_dump($node, 'fresh12', '--binary-upgrade'));
	like($plain_fresh, qr/^CREATE EXTENSION IF NOT EXISTS pgqueue WITH SCHEMA public;$/m,
		'the plain dump of a fresh 1.2 creates the extension');
	like($full_fresh, qr/^CREATE TABLE pgqueue\.queue_0 .*max_tries integer/ms,
		'the --binary-upgrade dump of a fresh 1.2 writes out queue_0 with max_tries');
	is($missing_fresh, '', 'a fresh 1.2 has no missing values');
	for my $db (qw(up11 up10))
	{
		my ($plain) = schema_normalise(schema_dump($node, $db));
		same_schema("plain_$db", $plain, $plain_fresh,
			"pg_dump --schema-only: $db, updated to 1.2, dumps as a fresh 1.2 does");
		my ($full, $missing) = schema_normalise(schema_dump($node, $db, '--binary-upgrade'));
		same_schema("binary_upgrade_$db", $full, $full_fresh,
			"pg_dump --schema-only --binary-upgrade: every member of the extension in $db is a fresh 1.2's");
		# the columns added with a default to tables that had rows (t/033):
		# by 1.0 -> 1.1 only; 1.1 -> 1.2 adds max_tries without a default
		is(join(',', map { s/=.*//r } split /,/, $missing),
			$db eq 'up10'
			? 'pgqueue.queue_0.slot,pgqueue.queues.retention,pgqueue.work_queue_0.slot,pgqueue.work_queue_0.tries'
			: '',
			"$db: missing values only for the columns 1.0 -> 1.1 added with a default");
	}
}

# --- 5. what stops the update, and what it warns about -----------------------------
{
	$node->safe_psql('postgres', 'CREATE DATABASE deps');
	my $dq = sub { $node->safe_psql('deps', $_[0]) };
	$dq->("CREATE EXTENSION pgqueue VERSION '1.1'");
	my $version = "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'";
	my $works = sub {
		my ($what) = @_;
		my $id = $dq->(q{SELECT pgq_push('works', '{}')});
		$dq->('SELECT pgq_schedule()');
		is( $dq->(q{SELECT format('%s|%s', id, pgq_ack(id, 'k')) FROM pgq_claim('k', 1, '1 hour', ARRAY['works'])}),
			"$id|t", "$what: 1.1 still pushes, schedules, claims and acks");
	};
	for my $case (
		[ 'a view', 'CREATE VIEW v AS SELECT pgq_push(\'x\') AS id', qr/view v depends on function pgq_push/,
			'DROP VIEW v' ],
		[
			'a BEGIN ATOMIC function',
			"CREATE FUNCTION f() RETURNS uuid LANGUAGE sql BEGIN ATOMIC SELECT pgq_push('x'); END",
			qr/function f\(\) depends on function pgq_push/,
			'DROP FUNCTION f()'
		])
	{
		my ($what, $create, $detail, $drop) = @$case;
		$dq->($create);
		my ($ret, $out, $err) =
		  $node->psql('deps', "\\set VERBOSITY verbose\nALTER EXTENSION pgqueue UPDATE");
		isnt($ret, 0, "$what calling pgq_push: the update fails");
		like($err, qr/ERROR:\s+2BP01:/, "$what: with SQLSTATE 2BP01") or diag($err);
		like($err, $detail, "$what: naming it") or diag($err);
		is($dq->($version), '1.1', "$what: the database stays at 1.1");
		$works->($what);
		$dq->($drop);
	}

	# privileges granted by the user: named in a WARNING, with the GRANT
	$dq->(q{
CREATE ROLE pusher LOGIN;
CREATE ROLE batcher LOGIN;
GRANT EXECUTE ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text) TO pusher;
GRANT EXECUTE ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int) TO batcher WITH GRANT OPTION;
});
	my $as = sub {
		my ($role, $sql) = @_;
		my ($ret, $out, $err) = $node->psql('deps', $sql, extra_params => [ '-U', $role ]);
		return $ret == 0 ? $out : "ERROR: $err";
	};
	like($as->('pusher', q{SELECT pgq_push('granted', '{}') IS NOT NULL}), qr/^t$/, 'on 1.1 pusher pushes');
	my ($ret, $out, $err) = $node->psql('deps', 'ALTER EXTENSION pgqueue UPDATE');
	is($ret, 0, 'with privileges granted on pgq_push and pgq_push_batch, the update succeeds');
	is($dq->($version), '1.2', 'at 1.2');
	like($err,
		qr/WARNING:  pgqueue 1\.2: the EXECUTE privilege of pusher on pgq_push\(text, jsonb, timestamptz, int, text, int, uuid\[\], text\) is not kept by the update/,
		'a WARNING names pusher\'s privilege') or diag($err);
	my ($hint) = $err =~ /HINT:  (After the update: GRANT EXECUTE ON FUNCTION pgq_push\(text[^\n]*;)/;
	is($hint, 'After the update: GRANT EXECUTE ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text, int, uuid[], text) TO pusher;',
		'its HINT holds the GRANT to run again');
	my ($hint_b) = $err =~ /HINT:  (After the update: GRANT EXECUTE ON FUNCTION pgq_push_batch[^\n]*;)/;
	is($hint_b,
		'After the update: GRANT EXECUTE ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int, int, uuid[], text) TO batcher WITH GRANT OPTION;',
		'and batcher\'s, WITH GRANT OPTION');
	like($as->('pusher', q{SELECT pgq_push('granted', '{}')}), qr/permission denied/,
		'until it is run, pusher cannot push');
	$dq->($hint =~ s/^After the update: //r);
	$dq->($hint_b =~ s/^After the update: //r);
	like($as->('pusher', q{SELECT pgq_push('granted', '{"by": "pusher"}', max_tries => 2) IS NOT NULL}),
		qr/^t$/, 'after the GRANT of the HINT, pusher pushes (with max_tries)');
	like($as->('batcher', q{SELECT count(*) FROM pgq_push_batch('granted', ARRAY['{}'::jsonb])}),
		qr/^1$/, 'and batcher pushes batches');
	is($dq->(q{SELECT count(*) FROM pgqueue.jobs WHERE queue = 'granted' AND max_tries = 2}), '1',
		'the job pusher pushed has its max_tries');
}

$node->stop;
done_testing();
