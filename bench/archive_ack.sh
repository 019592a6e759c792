#!/usr/bin/env bash
# What archiving costs on the ack path: jobs/s of consumers that claim one
# job and ack it (bench/sql/sys4_consume.sql's two transactions), from a
# queue without a retention (A) and from one with a retention (B: every ack
# also writes the job into pgqueue.archive), in alternating rounds A B A B
# ... on one private server, so that both see the same machine.
#
#   sudo bash bench/archive_ack.sh                 # 3 rounds of each, 15 s, 4 clients
#   ROUNDS=5 SECONDS_PER_ROUND=20 CLIENTS=4 SYNC=off sudo -E bash bench/archive_ack.sh
#
# Before each round the queue gets a backlog that the scheduler moves into
# work_queue before the clock starts, so the rounds measure claim + ack
# only.  SYNC sets synchronous_commit (on, the default, is what users see;
# off leaves the CPU cost of the ack path without the WAL flush that
# otherwise dominates it).  Then the CPU that pgq_ack itself takes, A and B
# alternating: one statement acks CPU_JOBS claimed jobs (default 20000).
# Needs the extension installed for PG_CONFIG
# (make install); uses port 5520 (PORT) and a directory under /tmp, both removed
# at the end.
set -euo pipefail

PORT=${PORT:-5520}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_ROUND:-15}
CLIENTS=${CLIENTS:-4}
SYNC=${SYNC:-on}
BACKLOG=${BACKLOG:-100000}

HERE=$(cd "$(dirname "$0")" && pwd)
NAME=archive
EXTRA_CONF="max_wal_size = 4GB
synchronous_commit = $SYNC"
. "$HERE/server.sh"
psql -d bench -c "SELECT pgq_configure('plain')" \
	-c "SELECT pgq_configure('kept', retention => '1 day')" >/dev/null

# one consumer script per queue (sys4_consume.sql with a queues filter)
for q in plain kept; do
	cat >"$DIR/consume_$q.sql" <<EOF
SELECT count(*) AS n, min(id::text) AS job_id
  FROM pgq_claim('bench-' || :client_id::text, 1, '30 seconds', ARRAY['$q']) \gset
\if :n > 0
SELECT pgq_ack(:job_id::uuid, 'bench-' || :client_id::text);
\endif
EOF
done
chown postgres: "$DIR"/consume_*.sql

fill() {
	local q=$1
	psql -d bench -c "TRUNCATE pgqueue.queue, pgqueue.work_queue" \
		-c "SELECT count(*) FROM generate_series(1, $BACKLOG / 1000) b,
		      LATERAL pgq_push_batch('$q', (SELECT array_agg(jsonb_build_object('b', b, 'n', g, 'pad', repeat('x', 100)))
		                                      FROM generate_series(1, 1000) g))" >/dev/null
	# the scheduler moves the backlog into work_queue before the round
	until [ "$(psql -d bench -At -c "SELECT count(*) FROM pgqueue.queue WHERE state = 'pending'")" = 0 ]; do
		sleep 0.5
	done
	psql -d bench -c 'VACUUM ANALYZE pgqueue.queue, pgqueue.work_queue' >/dev/null
}

# jobs acked per second over the round, from pgq_counters() (not pgbench's
# tps, which would count empty claims if the backlog ran out)
round() {
	local q=$1 before after left
	fill "$q"
	before=$(psql -d bench -At -c "SELECT acked FROM pgq_counters()")
	as_pg "$BIN/pgbench" -h "$DIR" -p "$PORT" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" \
		-f "$DIR/consume_$q.sql" bench >"$DIR/pgbench.out" 2>&1 || { head -20 "$DIR/pgbench.out" >&2; exit 1; }
	after=$(psql -d bench -At -c "SELECT acked FROM pgq_counters()")
	left=$(psql -d bench -At -c "SELECT count(*) FROM pgqueue.work_queue")
	[ "$left" -gt 0 ] || echo "backlog of $BACKLOG ran out: raise BACKLOG" >&2
	echo $(((after - before) / SECS))
}

echo "synchronous_commit = $SYNC, $CLIENTS clients, $SECS s rounds, backlog $BACKLOG jobs"
round plain >/dev/null # warm-up
a_all=()
b_all=()
for r in $(seq 1 "$ROUNDS"); do
	a=$(round plain)
	b=$(round kept)
	a_all+=("$a")
	b_all+=("$b")
	printf 'round %d  A (no retention) %8.0f jobs/s   B (retention) %8.0f jobs/s\n' "$r" "$a" "$b"
done

# The CPU of the ack itself: one statement acks CPU_JOBS claimed jobs in a
# row (no commit per job, no other client), A and B alternating.
CPU_JOBS=${CPU_JOBS:-20000}
ack_usecs() {
	local q=$1
	fill_n "$q" "$CPU_JOBS"
	psql -d bench -At -c "SELECT count(*) FROM pgq_claim('cpu', 10000, '1 hour', ARRAY['$q'])" \
		-c "SELECT count(*) FROM pgq_claim('cpu', 10000, '1 hour', ARRAY['$q'])" >/dev/null
	psql -d bench -At -c "
	  WITH t0 AS MATERIALIZED (SELECT clock_timestamp() AS t),
	       a AS MATERIALIZED (SELECT count(*) FILTER (WHERE pgq_ack(w.id, 'cpu')) AS n
	                            FROM t0, pgqueue.work_queue w WHERE w.queue = '$q')
	  SELECT round(extract(epoch FROM clock_timestamp() - t0.t) * 1e6 / a.n, 1) FROM t0, a"
}
fill_n() {
	BACKLOG=$2 fill "$1"
}
echo "CPU per pgq_ack call, $CPU_JOBS acks in one statement:"
ack_usecs plain >/dev/null # warm-up
for r in $(seq 1 "$ROUNDS"); do
	printf 'round %d  A (no retention) %6s us/ack   B (retention) %6s us/ack\n' "$r" \
		"$(ack_usecs plain)" "$(ack_usecs kept)"
done

archived=$(psql -d bench -At -c "SELECT count(*) FROM pgqueue.archive")
printf '%s\n' "${a_all[@]}" | sort -n | awk '{v[NR]=$1} END {printf "A median %.0f jobs/s\n", v[int((NR+1)/2)]}'
printf '%s\n' "${b_all[@]}" | sort -n | awk '{v[NR]=$1} END {printf "B median %.0f jobs/s\n", v[int((NR+1)/2)]}'
echo "rows archived by the B rounds: $archived"
