#!/usr/bin/env bash
# The rate limit (1.2) against its goal: a queue with rate_limit
# 100 per rate_period 1 s and a backlog of 20,000 jobs, the background
# scheduler alone releasing it for 60 s: released per second within 1 % of
# 100 over the minute, never above 100 in any 1 s window.  Two runs on one
# private server, each on a queue of its own:
#
#   idle     nothing claims: every release stays in work_queue, whose
#            created column is the releasing pass's time
#   consume  one pgbench client claims (up to 100 at a time) and acks; it
#            copies each claimed job's work_queue.created into a table
#            first, so the releases are counted from that table plus what
#            is left unclaimed in work_queue
#
#   sudo bash bench/rate_limit.sh                  # both runs, 60 s each
#   MODES=idle DURATION=30 BENCH_PORT=5801 sudo -E bash bench/rate_limit.sh
#
# From the release times of the DURATION seconds after the first release:
# releases per second (and the ratio to the limit), the largest count in
# any window (t - 1 s, t], the per-second series (1 s bins from the first
# release) min and max, the bursts (releases less than half a period apart)
# and the steady rate they make (releases before the last burst over the
# time from the first burst to the last).  rate.c's buckets make a queue
# with a backlog get 256/257 of its limit (99.61 per second here).
#
# Writes bench/results/rate-limit-<commit>.md (OUT) with the machine and
# the settings beside the figures, and prints it.  Needs the extension
# installed for PG_CONFIG (make install); uses port 5801 (BENCH_PORT, or
# PORT) and a directory under /tmp, both removed at the end.
set -euo pipefail

PORT=${BENCH_PORT:-${PORT:-5801}}
DURATION=${DURATION:-60}
BACKLOG=${BACKLOG:-20000}
LIMIT=${LIMIT:-100}
PERIOD=${PERIOD:-1 second}
MODES=${MODES:-idle consume}
MODES=${MODES//,/ }
HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$HERE/results/rate-limit-$COMMIT.md}

NAME=rate
. "$HERE/server.sh"

PERIOD_US=$(psql -d bench -Atc "SELECT (extract(epoch FROM interval '$PERIOD') * 1000000)::bigint")
NAPTIME=$(psql -d bench -Atc "SHOW pgqueue.naptime")
BATCH=$(psql -d bench -Atc "SHOW pgqueue.batch_size")
PGVER=$("$BIN/postgres" --version)
MEM=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)

# the consumer: claims up to 100, keeps each one's release time, acks
psql -d bench <<'SQL' >/dev/null
CREATE TABLE bench_released (id uuid PRIMARY KEY, queue text, created timestamptz);
CREATE FUNCTION bench_consume(q text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
	r record;
	n int := 0;
BEGIN
	FOR r IN SELECT c.id FROM pgq_claim('bench', 100, '1 minute', ARRAY[q]) c LOOP
		INSERT INTO bench_released
		SELECT w.id, w.queue, w.created FROM pgqueue.work_queue w WHERE w.id = r.id;
		PERFORM pgq_ack(r.id, 'bench');
		n := n + 1;
	END LOOP;
	RETURN n;
END $$;
SQL

# release times (us since the epoch) of queue $1: claimed ones and those
# still in work_queue, in table bench_times
collect() {
	psql -d bench -c "SET client_min_messages = warning" -c "DROP TABLE IF EXISTS bench_times" -c "
CREATE TABLE bench_times AS
SELECT (extract(epoch FROM created) * 1000000)::bigint AS t
  FROM (SELECT created FROM bench_released WHERE queue = '$1'
        UNION ALL
        SELECT created FROM pgqueue.work_queue WHERE queue = '$1') s" >/dev/null
}

# the figures of bench_times over DURATION s from its first release, one
# line: n mean ratio maxwin binmin binmax bursts burst_min burst_max interval_ms steady
figures() {
	psql -d bench -At -F ' ' <<SQL
WITH b AS (SELECT min(t) AS t0 FROM bench_times),
m AS (SELECT t, t - b.t0 AS dt FROM bench_times, b WHERE t < b.t0 + $DURATION * 1000000::bigint),
win AS (SELECT count(*) OVER (ORDER BY t RANGE BETWEEN $PERIOD_US - 1 PRECEDING AND CURRENT ROW) AS c FROM m),
bins AS (SELECT k, count(m.t) AS c
           FROM generate_series(0, $DURATION - 1) k
           LEFT JOIN m ON m.dt / 1000000 = k GROUP BY k),
g AS (SELECT t, CASE WHEN t - lag(t) OVER (ORDER BY t) < $PERIOD_US / 2 THEN 0 ELSE 1 END AS starts FROM m),
gn AS (SELECT t, sum(starts) OVER (ORDER BY t) AS burst FROM g),
bu AS (SELECT burst, min(t) AS t, count(*) AS c FROM gn GROUP BY burst)
SELECT (SELECT count(*) FROM m),
       round((SELECT count(*) FROM m) / $DURATION::numeric, 2),
       round((SELECT count(*) FROM m) / $DURATION::numeric / $LIMIT, 4),
       (SELECT max(c) FROM win),
       (SELECT min(c) FROM bins), (SELECT max(c) FROM bins),
       (SELECT count(*) FROM bu), (SELECT min(c) FROM bu), (SELECT max(c) FROM bu),
       (SELECT round((max(t) - min(t)) / 1000.0 / nullif(count(*) - 1, 0), 2) FROM bu),
       (SELECT round(((SELECT count(*) FROM m) - (SELECT c FROM bu ORDER BY t DESC LIMIT 1))
                     / nullif((max(t) - min(t)) / 1000000.0, 0), 2) FROM bu)
SQL
}

results=()
for mode in $MODES; do
	q="rl_$mode"
	psql -d bench -c "SELECT pgq_configure('$q', rate_limit => $LIMIT, rate_period => '$PERIOD')" >/dev/null
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	echo "# $mode: pushing $BACKLOG jobs to $q, then $DURATION s" >&2
	# in one transaction, 10,000 a call (pgq_push_batch's most)
	psql -d bench -c "BEGIN" -c "SELECT count(*) FROM generate_series(0, ($BACKLOG - 1) / 10000) b,
		LATERAL pgq_push_batch('$q', (SELECT array_agg(jsonb_build_object('n', n))
		                                FROM generate_series(b * 10000 + 1, least((b + 1) * 10000, $BACKLOG)) n))" -c "COMMIT" >/dev/null
	if [ "$mode" = consume ]; then
		cat >"$DIR/consume.sql" <<EOF
SELECT bench_consume('$q') AS n \gset
\if :n
\else
\sleep 10 ms
\endif
EOF
		chown postgres: "$DIR/consume.sql"
		as_pg "$BIN/pgbench" -n -h "$DIR" -p "$PORT" -c 1 -T "$((DURATION + 2))" -f "$DIR/consume.sql" bench >"$DIR/pgbench.out" 2>&1
	else
		sleep "$((DURATION + 2))"
	fi
	# stop the queue before counting (its backlog stays)
	psql -d bench -c "SELECT pgq_configure('$q', paused => true)" >/dev/null
	load1=$(cut -d' ' -f1-3 /proc/loadavg)
	collect "$q"
	claimed=$(psql -d bench -Atc "SELECT count(*) FROM bench_released WHERE queue = '$q'")
	read -r n mean ratio maxwin binmin binmax bursts bmin bmax interval steady <<<"$(figures)"
	ok=yes
	[ "$maxwin" -le "$LIMIT" ] || ok="NO (over the limit)"
	within=$(awk -v r="$ratio" 'BEGIN { print (r >= 0.99 && r <= 1.01) ? "yes" : "no" }')
	results+=("| $mode | $n | $mean | $ratio | $within | $maxwin | $ok | $binmin / $binmax | $bursts ($bmin..$bmax each) | $interval | $steady | $claimed | $load0 / $load1 |")
done

{
	echo "# Rate limit: rate_limit = $LIMIT per $PERIOD, a backlog of $BACKLOG, $DURATION s"
	echo
	echo "\`bench/rate_limit.sh\` at $COMMIT, $(date -u '+%Y-%m-%d %H:%M UTC')."
	echo
	echo "Machine: $(nproc) cores, $MEM of memory, $PGVER; $(uname -sr)."
	echo "Server: bench/server.sh's (shared_buffers = 256MB, fsync and synchronous_commit on),"
	echo "pgqueue.naptime = $NAPTIME, pgqueue.batch_size = $BATCH; the background scheduler alone releases."
	echo "Modes: idle = nothing claims; consume = one pgbench client claims up to 100 and acks each."
	echo
	echo "Goal: released per second within 1 % of $LIMIT over the minute, never above $LIMIT in any 1 s window."
	echo "Counted from the first release, over $DURATION s; a window is (t - period, t] at each release time t."
	echo
	echo "| mode | released | per second | ratio to $LIMIT | within 1 % | largest window | <= $LIMIT | per-second bins min / max | bursts | ms between bursts | steady rate /s | claimed (whole run) | load avg start / end |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${results[@]}"
	echo
	echo "The steady rate is the releases before the last burst over the time from the first burst to the last:"
	echo "src/rate.c counts a release up to one bucket (period / 256) longer than it must, so a queue with a"
	echo "backlog gets 256/257 of its limit ($(awk -v l="$LIMIT" 'BEGIN { printf "%.2f", l * 256 / 257 }') per second, a burst every $(awk -v p="$PERIOD_US" 'BEGIN { printf "%.1f", p * 257 / 256 / 1000 }') ms)."
	echo "The per-second figure counts every burst that began in the $DURATION s from the first, so it is"
	echo "above the steady rate by up to one burst over the duration."
} >"$OUT"
cat "$OUT"
