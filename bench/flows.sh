#!/usr/bin/env bash
# Flows (1.2) against their goals: how soon after the ack that frees them
# the children of a flow are claimable, with the background scheduler alone
# releasing them (woken by the ack's commit).
#
#   fan-out  one parent, FANOUT (10,000) children after it: from the commit
#            of the parent's ack to the last child in work_queue
#            (claimable), once with pgqueue.batch_size = 100 (the default:
#            a pass releases at most 100 jobs) and once with 10,000; the
#            scheduling passes between the two are counted (pgq_counters)
#   fan-in   FANIN (1,000, the most a job may wait for) children and one
#            job after all of them: the children are claimed, all but one
#            acked, then the last one: from that ack's commit to the fan-in
#            job in work_queue; RUNS (20) times, p50 / p90 / max
#
#   sudo bash bench/flows.sh
#   FANOUT=2000 RUNS=5 BENCH_PORT=5802 sudo -E bash bench/flows.sh
#
# The clock is the server's (clock_timestamp() in a procedure that commits
# and polls work_queue every 0.2 ms), so client round trips are not in the
# figures.  Goal: both within one scheduler pass after the commit, the
# fan-in's p50 <= 5 ms.  Writes bench/results/flows-<commit>.md (OUT) with
# the machine and the settings beside the figures, and prints it.  Needs
# the extension installed for PG_CONFIG (make install); uses port 5802
# (BENCH_PORT, or PORT) and a directory under /tmp, both removed at the end.
set -euo pipefail

PORT=${BENCH_PORT:-${PORT:-5802}}
FANOUT=${FANOUT:-10000}
FANIN=${FANIN:-1000}
RUNS=${RUNS:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$HERE/results/flows-$COMMIT.md}

NAME=flows
. "$HERE/server.sh"

NAPTIME=$(psql -d bench -Atc "SHOW pgqueue.naptime")
PGVER=$("$BIN/postgres" --version)
MEM=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)

psql -d bench <<'SQL' >/dev/null
CREATE TABLE bench_flow (kind text, batch int, run int, n int, ms float8, passes bigint);

-- wait until queue q has n rows in work_queue; returns when (committing
-- between looks, so that each look sees the latest commits)
CREATE PROCEDURE bench_wait(q text, n int, INOUT at timestamptz DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
	c bigint;
BEGIN
	LOOP
		SELECT count(*) INTO c FROM pgqueue.work_queue w WHERE w.queue = q;
		EXIT WHEN c >= n;
		COMMIT;
		PERFORM pg_sleep(0.0002);
	END LOOP;
	at := clock_timestamp();
END $$;

-- one parent, n children after it; from the parent's ack to the last child claimable
CREATE PROCEDURE bench_fanout(run int, n int)
LANGUAGE plpgsql AS $$
DECLARE
	p uuid;
	t0 timestamptz;
	t1 timestamptz;
	p0 bigint;
	p1 bigint;
	b int := current_setting('pgqueue.batch_size')::int;
BEGIN
	p := pgq_push('fo_parent', '{}');
	PERFORM pgq_push_batch('fo_kids', ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, n) g),
	                       after => ARRAY[p]);
	COMMIT;
	CALL bench_wait('fo_parent', 1, t1);
	PERFORM count(*) FROM pgq_claim('b', 1, '1 minute', ARRAY['fo_parent']);
	COMMIT;
	SELECT scheduler_passes INTO p0 FROM pgq_counters();
	PERFORM pgq_ack(p, 'b');
	COMMIT;
	t0 := clock_timestamp();
	CALL bench_wait('fo_kids', n, t1);
	SELECT scheduler_passes INTO p1 FROM pgq_counters();
	INSERT INTO bench_flow VALUES ('fan-out', b, run, n, extract(epoch FROM t1 - t0) * 1000, p1 - p0);
	COMMIT;
	-- the children done, 10,000 an ack
	LOOP
		PERFORM pgq_ack_batch(ARRAY(SELECT c.id FROM pgq_claim('b', 10000, '1 minute', ARRAY['fo_kids']) c), 'b');
		COMMIT;
		EXIT WHEN NOT EXISTS (SELECT FROM pgqueue.queue q WHERE q.queue = 'fo_kids');
	END LOOP;
END $$;

-- n children and a job after them; from the last child's ack to the fan-in claimable
CREATE PROCEDURE bench_fanin(run int, n int)
LANGUAGE plpgsql AS $$
DECLARE
	kids uuid[];
	f uuid;
	t0 timestamptz;
	t1 timestamptz;
	p0 bigint;
	p1 bigint;
	b int := current_setting('pgqueue.batch_size')::int;
BEGIN
	kids := ARRAY(SELECT id FROM pgq_push_batch('fi_kids',
	                  ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, n) g)) id);
	f := pgq_push('fi_fanin', '{}', after => kids);
	COMMIT;
	CALL bench_wait('fi_kids', n, t1);
	PERFORM count(*) FROM pgq_claim('b', n, '1 minute', ARRAY['fi_kids']);
	COMMIT;
	PERFORM pgq_ack_batch(kids[2:], 'b');
	COMMIT;
	SELECT scheduler_passes INTO p0 FROM pgq_counters();
	PERFORM pgq_ack(kids[1], 'b');
	COMMIT;
	t0 := clock_timestamp();
	CALL bench_wait('fi_fanin', 1, t1);
	SELECT scheduler_passes INTO p1 FROM pgq_counters();
	INSERT INTO bench_flow VALUES ('fan-in', b, run, n, extract(epoch FROM t1 - t0) * 1000, p1 - p0);
	COMMIT;
	PERFORM pgq_ack(c.id, 'b') FROM pgq_claim('b', 1, '1 minute', ARRAY['fi_fanin']) c;
	COMMIT;
END $$;
SQL

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for batch in 100 10000; do
	psql -d bench -c "ALTER SYSTEM SET pgqueue.batch_size = $batch" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 1
	echo "# fan-out of $FANOUT, batch_size $batch" >&2
	psql -d bench -c "CALL bench_fanout(1, $FANOUT)" >/dev/null
done
psql -d bench -c "ALTER SYSTEM RESET pgqueue.batch_size" -c "SELECT pg_reload_conf()" >/dev/null
sleep 1
echo "# fan-in of $FANIN, $RUNS runs" >&2
for run in $(seq 1 "$RUNS"); do
	psql -d bench -c "CALL bench_fanin($run, $FANIN)" >/dev/null
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

fanout=$(psql -d bench -At -F ' | ' -c "
SELECT '| fan-out | ' || n || ' | ' || batch || ' | ' || round(ms::numeric, 1) || ' | ' || passes || ' |'
  FROM bench_flow WHERE kind = 'fan-out' ORDER BY batch")
fanin=$(psql -d bench -At -c "
SELECT '| fan-in | ' || min(n) || ' | ' || min(batch) || ' | '
       || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) || ' | '
       || round(percentile_cont(0.9) WITHIN GROUP (ORDER BY ms)::numeric, 2) || ' | '
       || round(max(ms)::numeric, 2) || ' | '
       || round(percentile_cont(0.5) WITHIN GROUP (ORDER BY passes)::numeric, 1) || ' / ' || max(passes) || ' | '
       || count(*) || ' |'
  FROM bench_flow WHERE kind = 'fan-in'")

{
	echo "# Flows: fan-out and fan-in, from the ack's commit to claimable"
	echo
	echo "\`bench/flows.sh\` at $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC')."
	echo
	echo "Machine: $(nproc) cores, $MEM of memory, $PGVER; $(uname -sr); load average $load0 at the start, $load1 at the end."
	echo "Server: bench/server.sh's (shared_buffers = 256MB, fsync and synchronous_commit on),"
	echo "pgqueue.naptime = $NAPTIME (the ack's commit wakes the scheduler); the background scheduler alone releases."
	echo "Times are the server's: a procedure commits the ack, reads clock_timestamp(), and polls work_queue"
	echo "every 0.2 ms (each look in a transaction of its own) until the jobs are there."
	echo
	echo "Goal: within one scheduler pass after the commit; the fan-in's p50 <= 5 ms."
	echo
	echo "| flow | children | batch_size | ms to the last child claimable | scheduling passes meanwhile |"
	echo "|---|---|---|---|---|"
	echo "$fanout"
	echo
	echo "| flow | children acked | batch_size | p50 ms to the fan-in claimable | p90 ms | max ms | passes meanwhile p50 / max | runs |"
	echo "|---|---|---|---|---|---|---|---|"
	echo "$fanin"
	echo
	echo "A pass releases at most pgqueue.batch_size jobs, and the scheduler runs the next pass at once when"
	echo "a pass filled its batch: a fan-out of N children takes N / batch_size passes. A job waits for at"
	echo "most 1,000 parents (DESIGN.md), so the fan-in is measured at 1,000; a fan-in after 10,000 jobs is"
	echo "a job after 10 jobs each after 1,000."
} >"$OUT"
cat "$OUT"
