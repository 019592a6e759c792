#!/usr/bin/env bash
# How much of the push-100 figure of bench/run.sh (e) the scheduler takes:
# 2 pgbench clients push 100 jobs per transaction with pgq_push_batch
# (bench/sql/sys4_push_batch_fn.sql) with the scheduler on and with it off
# (pgqueue.enabled, reloaded), in alternating rounds on one private server,
# and the CPU the scheduler process used meanwhile (/proc/<pid>/stat).
#
#   sudo bash bench/push_scheduler.sh                  # 3 rounds of each, 15 s
#   ROUNDS=5 SECONDS_PER_ROUND=20 sudo -E bash bench/push_scheduler.sh
#
# Before each round the tables are emptied with the scheduler off (a
# TRUNCATE can deadlock with a pass).  Needs the extension installed for
# PG_CONFIG (make install); uses port 5521 (PORT) and a directory under
# /tmp, both removed at the end.
set -euo pipefail

PORT=${PORT:-5521}
ROUNDS=${ROUNDS:-3}
SECS=${SECONDS_PER_ROUND:-15}
HERE=$(cd "$(dirname "$0")" && pwd)

NAME=push
. "$HERE/server.sh"
cp "$HERE/sql/sys4_push_batch_fn.sql" "$DIR/push.sql"
chown postgres: "$DIR/push.sql"

enabled() {
	psql -d postgres -c "ALTER SYSTEM SET pgqueue.enabled = $1" -c 'SELECT pg_reload_conf()' >/dev/null
}
sched_ticks() {   # utime + stime of the scheduler, in clock ticks
	local pid
	pid=$(psql -d bench -Atc "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pgqueue scheduler'")
	awk '{print $14 + $15}' "/proc/$pid/stat"
}
HZ=$(getconf CLK_TCK)

echo "# $(nproc) cores, $("$BIN/postgres" --version), $ROUNDS rounds of $SECS s, 2 clients, 100 jobs per transaction"
for r in $(seq 1 "$ROUNDS"); do
	for en in on off; do
		enabled off
		sleep 2
		psql -d bench -c 'TRUNCATE pgqueue.queue, pgqueue.work_queue' -c 'CHECKPOINT'
		enabled "$en"
		sleep 1
		t0=$(sched_ticks)
		tps=$(as_pg "$BIN/pgbench" -n -h "$DIR" -p "$PORT" -M prepared -c 2 -j 2 -T "$SECS" \
			-D batch=100 -f "$DIR/push.sql" bench 2>&1 | awk '/^tps/ {print $3; exit}')
		t1=$(sched_ticks)
		awk -v r="$r" -v en="$en" -v tps="$tps" -v t="$((t1 - t0))" -v hz="$HZ" -v s="$SECS" \
			'BEGIN { printf "round %d, scheduler %-3s: %8.0f jobs/s pushed, scheduler CPU %.2f of a core\n", r, en, tps * 100, t / hz / s }'
	done
done
