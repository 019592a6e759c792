#!/usr/bin/env bash
# Groups (1.2) against their goal: with NGROUPS groups of JOBS jobs each in
# one queue with group_max_in_flight = 1, the scheduler's time per job
# within 1.5x of one group, and no group's next job waiting more than a
# pass beyond its turn.  "Of one group" is read two ways, both measured:
# the same limit on one group (whose jobs then go one a pass), and, the
# stricter, jobs without a group.  On one private server (pgqueue.enabled
# = off: the passes are this script's pgq_schedule calls, of
# pgqueue.batch_size jobs each), each case on a queue of its own:
#
#   grouped    NGROUPS x JOBS jobs, group_max_in_flight = 1
#   ungrouped  the same number of jobs without a group, no limit
#   one group  ONE_JOBS jobs (20,000) of one group, group_max_in_flight = 1
#
# A procedure drains each queue: a pass (pgq_schedule), then a claim of
# everything it released and an ack of each, a COMMIT, again until the
# queue is empty.  The time inside pgq_schedule is summed (one session on a
# server of its own: its wall time is its CPU time while a core is free;
# the report gives the load average); the grouped case
# also records each release's group and pass, from which the largest gap
# between two releases of one group, against the round (ceil(NGROUPS /
# batch_size) passes: every group has a job due at every pass here), says
# whether a group waited beyond its turn.  And, when every group is full
# (each has a job released, none acked): the round that finds them all
# full, the pass after it (which waits for a place to be freed and visits
# none), and a pass after one ack (a round to the group it freed).
#
#   sudo bash bench/groups.sh                      # 100,000 groups x 10 jobs
#   NGROUPS=10000 BENCH_PORT=5905 BENCH_TMP=/some/dir sudo -E bash bench/groups.sh
#
# Writes bench/results/groups-<commit>.md (OUT) with the machine and the
# settings beside the figures, and prints it.  Needs the extension
# installed for PG_CONFIG (make install); uses port 5802 (BENCH_PORT, or
# PORT) and a directory under BENCH_TMP (/tmp), both removed at the end.
set -euo pipefail

PORT=${BENCH_PORT:-${PORT:-5802}}
NGROUPS=${NGROUPS:-100000}
JOBS=${JOBS:-10}
ONE_JOBS=${ONE_JOBS:-20000}
HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$HERE/results/groups-$COMMIT.md}

NAME=groups
EXTRA_CONF='pgqueue.enabled = off' . "$HERE/server.sh"

BATCH=$(psql -d bench -Atc "SHOW pgqueue.batch_size")
PGVER=$("$BIN/postgres" --version)
MEM=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)
TOTAL=$((NGROUPS * JOBS))

psql -d bench <<'SQL' >/dev/null
CREATE TABLE bench_rel (group_key text, pass int);
CREATE TABLE bench_run (queue text, passes int, jobs bigint, sched_us bigint, total_us bigint);
-- drain queue q: pass, claim all, record, ack all, COMMIT; until empty
CREATE PROCEDURE bench_drain(q text, batch int, record boolean) LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	began timestamptz := clock_timestamp();
	sched interval := '0';
	n int;
	passes int := 0;
	jobs bigint := 0;
	ids uuid[];
BEGIN
	LOOP
		t0 := clock_timestamp();
		n := pgq_schedule(batch);
		sched := sched + (clock_timestamp() - t0);
		passes := passes + 1;
		SELECT array_agg(c.id) INTO ids FROM pgq_claim('bench', batch, '1 hour', ARRAY[q]) c;
		IF ids IS NOT NULL THEN
			IF record THEN
				INSERT INTO bench_rel SELECT j.group_key, passes FROM pgqueue.queue j WHERE j.id = ANY (ids);
			END IF;
			PERFORM pgq_ack_batch(ids, 'bench');
			jobs := jobs + cardinality(ids);
		END IF;
		COMMIT;
		EXIT WHEN n = 0 AND NOT EXISTS (SELECT 1 FROM pgqueue.queue j WHERE j.queue = q);
	END LOOP;
	INSERT INTO bench_run VALUES (q, passes, jobs,
		(extract(epoch FROM sched) * 1e6)::bigint,
		(extract(epoch FROM clock_timestamp() - began) * 1e6)::bigint);
	COMMIT;
END $$;
SQL

echo "pushing $NGROUPS groups x $JOBS jobs" >&2
psql -d bench -c "SELECT pgq_configure('grouped', group_max_in_flight => 1)" >/dev/null
psql -d bench -c "
SELECT count(*) FROM generate_series(1, $NGROUPS) g,
       LATERAL pgq_push_batch('grouped',
                              (SELECT array_agg(jsonb_build_object('g', g, 'n', n)) FROM generate_series(1, $JOBS) n),
                              group_key => 'customer-' || g)" >/dev/null
psql -d bench -c "VACUUM ANALYZE" >/dev/null

# passes when every group is full: one job of each released, none acked.
# The first round that finds them all full; the pass after it (the queue
# waits for a commit that frees a place); a pass after one ack (a round to
# find the group it freed).
echo "passes with every group full" >&2
FULL=$(psql -d bench -At <<SQL
DO \$\$ BEGIN
	WHILE (SELECT count(*) FROM pgqueue.work_queue WHERE queue = 'grouped') < $NGROUPS LOOP
		PERFORM pgq_schedule($BATCH);
	END LOOP;
END \$\$;
\\timing on
SELECT pgq_schedule($BATCH);
SELECT pgq_schedule($BATCH);
\\timing off
SELECT pgq_ack(c.id, 'bench') FROM pgq_claim('bench', 1, '1 hour', ARRAY['grouped']) c;
\\timing on
SELECT pgq_schedule($BATCH);
SQL
)
TIMES=$(printf '%s\n' "$FULL" | sed -nE 's/^Time: ([0-9.]+) ms.*/\1/p')
ROUND_MS=$(printf '%s\n' "$TIMES" | sed -n 1p)
FULL_MS=$(printf '%s\n' "$TIMES" | sed -n 2p)
ACK_MS=$(printf '%s\n' "$TIMES" | sed -n 3p)
FULL_TOOK=$(printf '%s\n' "$FULL" | grep -E '^[0-9]+$' | sed -n 2p)
ACK_TOOK=$(printf '%s\n' "$FULL" | grep -E '^[0-9]+$' | tail -1)
# those jobs claimed and acked: the drain starts with every group free
psql -d bench >/dev/null <<'SQL'
DO $$
DECLARE
	ids uuid[];
BEGIN
	LOOP
		SELECT array_agg(c.id) INTO ids FROM pgq_claim('bench', 10000, '1 hour', ARRAY['grouped']) c;
		EXIT WHEN ids IS NULL;
		PERFORM pgq_ack_batch(ids, 'bench');
	END LOOP;
END $$;
SQL

echo "draining: grouped" >&2
psql -d bench -c "CALL bench_drain('grouped', $BATCH, true)" >/dev/null
# the same number of jobs without a group, once the grouped queue is
# empty (a pass serves every queue: each case has the passes to itself)
echo "pushing $TOTAL jobs without a group" >&2
psql -d bench -c "
SELECT count(*) FROM generate_series(0, ($TOTAL - 1) / 10000) b,
       LATERAL pgq_push_batch('ungrouped',
                              (SELECT array_agg(jsonb_build_object('n', n))
                                 FROM generate_series(b * 10000 + 1, least(b * 10000 + 10000, $TOTAL)) n))" >/dev/null
psql -d bench -c "VACUUM ANALYZE" >/dev/null
echo "draining: ungrouped" >&2
psql -d bench -c "CALL bench_drain('ungrouped', $BATCH, false)" >/dev/null

# one group under the same limit: one job a pass
echo "pushing $ONE_JOBS jobs of one group" >&2
psql -d bench -c "SELECT pgq_configure('onegroup', group_max_in_flight => 1)" >/dev/null
psql -d bench -c "
SELECT count(*) FROM generate_series(0, ($ONE_JOBS - 1) / 10000) b,
       LATERAL pgq_push_batch('onegroup',
                              (SELECT array_agg(jsonb_build_object('n', n))
                                 FROM generate_series(b * 10000 + 1, least(b * 10000 + 10000, $ONE_JOBS)) n),
                              group_key => 'only')" >/dev/null
psql -d bench -c "VACUUM ANALYZE" >/dev/null
echo "draining: one group" >&2
psql -d bench -c "CALL bench_drain('onegroup', $BATCH, false)" >/dev/null

read -r G_PASSES G_JOBS G_US G_TOTAL < <(psql -d bench -At -F ' ' -c "SELECT passes, jobs, sched_us, total_us FROM bench_run WHERE queue = 'grouped'")
read -r U_PASSES U_JOBS U_US U_TOTAL < <(psql -d bench -At -F ' ' -c "SELECT passes, jobs, sched_us, total_us FROM bench_run WHERE queue = 'ungrouped'")
read -r O_PASSES O_JOBS O_US O_TOTAL < <(psql -d bench -At -F ' ' -c "SELECT passes, jobs, sched_us, total_us FROM bench_run WHERE queue = 'onegroup'")
ROUND=$(( (NGROUPS + BATCH - 1) / BATCH ))
# the largest gap, in passes, between two releases of one group (its first
# release counted from pass 0)
read -r MAXGAP GAPGROUPS < <(psql -d bench -At -F ' ' -c "
SELECT max(gap), count(DISTINCT group_key) FILTER (WHERE gap > $ROUND + 1)
  FROM (SELECT group_key, pass - coalesce(lag(pass) OVER (PARTITION BY group_key ORDER BY pass), 0) AS gap
          FROM bench_rel) s")
PER_G=$(awk -v t="$G_US" -v n="$G_JOBS" 'BEGIN { printf "%.2f", t / n }')
PER_U=$(awk -v t="$U_US" -v n="$U_JOBS" 'BEGIN { printf "%.2f", t / n }')
PER_O=$(awk -v t="$O_US" -v n="$O_JOBS" 'BEGIN { printf "%.2f", t / n }')
RATIO_O=$(awk -v g="$G_US" -v gn="$G_JOBS" -v o="$O_US" -v on="$O_JOBS" 'BEGIN { printf "%.2f", (g / gn) / (o / on) }')
RATIO=$(awk -v g="$G_US" -v gn="$G_JOBS" -v u="$U_US" -v un="$U_JOBS" 'BEGIN { printf "%.2f", (g / gn) / (u / un) }')

mkdir -p "$(dirname "$OUT")"
cat >"$OUT" <<EOF2
# Groups: $NGROUPS groups x $JOBS jobs, group_max_in_flight = 1 (commit $COMMIT)

\`bash bench/groups.sh\` (NGROUPS=$NGROUPS JOBS=$JOBS) on $(date -u +%Y-%m-%d):
$(nproc) cores ($(sed -nE 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), $MEM,
load average $(cut -d' ' -f1-3 /proc/loadavg) at the end,
$PGVER, shared_buffers 256MB, pgqueue.enabled off (the passes are the
script's pgq_schedule($BATCH) calls: pgqueue.batch_size = $BATCH), one
session; each pass's releases claimed and acked before the next pass.

| case | jobs | passes | time in pgq_schedule | per job | drain in all |
|---|---:|---:|---:|---:|---:|
| grouped ($NGROUPS groups, limit 1) | $G_JOBS | $G_PASSES | $((G_US / 1000)) ms | $PER_G us | $((G_TOTAL / 1000)) ms |
| ungrouped | $U_JOBS | $U_PASSES | $((U_US / 1000)) ms | $PER_U us | $((U_TOTAL / 1000)) ms |
| one group (limit 1) | $O_JOBS | $O_PASSES | $((O_US / 1000)) ms | $PER_O us | $((O_TOTAL / 1000)) ms |

- Scheduler time per job, grouped / one group: **${RATIO_O}x** (goal: at
  most 1.5x; the one group's jobs go one a pass, so each pays a pass).
- Scheduler time per job, grouped / ungrouped: **${RATIO}x** (the
  stricter reading of the goal: at most 1.5x).
- Largest gap between two releases of one group: **$MAXGAP passes**; a
  round of $NGROUPS groups at $BATCH a pass is $ROUND passes; groups with a
  gap over a round plus one pass: **$GAPGROUPS** (goal: 0).
- Every group full (each with a job released, none acked): the round that
  finds them all full $ROUND_MS ms; the pass after it $FULL_MS ms, $FULL_TOOK jobs
  released (the queue waits for a commit that frees a place); after one
  ack, a pass $ACK_MS ms, $ACK_TOOK released (a round from the group served
  last to the one the ack freed) (docs/internals.md, "Groups").
EOF2
cat "$OUT"
