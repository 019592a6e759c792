#!/usr/bin/env bash
# The worker libraries against their targets, side by side on one throwaway
# server, in interleaved rounds (medians of --rounds, at least 5 for the
# targets):
#
#   throughput  drains of a fully scheduled backlog of --jobs jobs (default
#               20,000), handlers that do nothing:
#               - concurrency 8: the Python and Node workers against raw
#                 single-call SQL (pgbench, sql/sys4_consume.sql: one claim
#                 and one ack per job, each its own transaction; target 4x)
#                 and pgbench's own batch loop (sql/sys4_claim_ack_batch.sql:
#                 pgq_claim(key, 10) and pgq_ack_batch of what it got, in one
#                 statement; target 0.5x);
#               - concurrency 1: the workers against raw single-call SQL
#                 (target 1.0x).
#               A ratio is taken per round, against the pgbench run of the
#               same round and concurrency just before, and the report
#               gives the median of the rounds' ratios.
#   latency     steady load: 2 producers push single jobs (one transaction
#               each) at --rate jobs/s in all (default 500) for
#               --steady-seconds (default 20), one worker process at
#               concurrency 8 runs them; latency from the push's commit to
#               the handler's start, p50 and p99 (targets 5 and 20 ms), per
#               library (clients/steady.py says how).
#   CPU         per job, next to each figure: the client process's
#               (/proc/PID/stat utime + stime: the worker's, or pgbench's)
#               and the server's (the postmaster and all its processes,
#               ended backends included: clients/procstat.py).
#
#   sudo bash bench/clients.sh                       # writes bench/CLIENTS.md (about 15 minutes on 2 cores)
#   sudo bash bench/clients.sh --jobs 2000 --rounds 1 --steady-seconds 5 --out /tmp/clients.md  # a short check
#   sudo bash bench/clients.sh --clients "pgbench pgbatch python" --out /tmp/py.md   # some of them
#
# --clients: which of pgbench (single-call SQL), pgbatch (the batch loop),
# python, node (default all four; the ratios need the pgbench runs).
# --steady-seconds 0 leaves the steady load out.  The server is the client
# tests' (test/clients/cluster.sh, ports PGQ_PORTS, default 5800-5849 here)
# with fsync on, shared_buffers 256MB, pgqueue.naptime at its default (1 s:
# a push's commit wakes the scheduler) and pgqueue.batch_size 1000 (the
# backlogs are scheduled faster); it is stopped and removed at the end.
# PG_CONFIG picks the installation (pgqueue must be installed there: make
# install); the libraries are installed from this tree's clients/.
set -uo pipefail

if [ "$(id -u)" != 0 ]; then
	exec sudo -E bash "$0" "$@"
fi
COMMAND="${PG_CONFIG:+PG_CONFIG=$PG_CONFIG }bash bench/clients.sh${*:+ $(printf '%q ' "$@")}"
COMMAND=${COMMAND% }
SRC=$(cd "$(dirname "$0")/.." && pwd)
JOBS=20000
ROUNDS=5
OUT=$SRC/bench/CLIENTS.md
CLIENTS="pgbench pgbatch python node"
BATCH=10
RATE=500
PRODUCERS=2
STEADY=20
WARMUP=2
STEADY_CONCURRENCY=8
usage() {
	echo "usage: $0 [--jobs N] [--rounds N] [--out FILE] [--clients \"pgbench pgbatch python node\"]"
	echo "       [--batch N] [--rate JOBS_PER_S] [--producers N] [--steady-seconds S] [--warmup S]"
	exit 2
}
while [ $# -gt 0 ]; do
	[ $# -ge 2 ] || usage
	case $1 in
	--jobs) JOBS=$2 ;;
	--rounds) ROUNDS=$2 ;;
	--out) OUT=$2 ;;
	--clients) CLIENTS=$2 ;;
	--batch) BATCH=$2 ;;
	--rate) RATE=$2 ;;
	--producers) PRODUCERS=$2 ;;
	--steady-seconds) STEADY=$2 ;;
	--warmup) WARMUP=$2 ;;
	*) usage ;;
	esac
	shift 2
done
for client in $CLIENTS; do
	[[ " pgbench pgbatch python node " == *" $client "* ]] || usage
done
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PGQ_PORTS=${PGQ_PORTS:-5800-5849}
log() { printf '==> %s %s\n' "$(date -u +%T)" "$*" >&2; }
has() { [[ " $CLIENTS " == *" $1 "* ]]; }

need=()
/usr/bin/python3 -c 'import psycopg' 2>/dev/null || need+=(python3-psycopg)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -x "$("$PG_CONFIG" --bindir)/pgbench" ] || need+=(postgresql-contrib-15)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null || { echo "apt-get install failed"; exit 1; }
fi
[ -f "$("$PG_CONFIG" --pkglibdir)/pgqueue.so" ] ||
	{ echo "pgqueue is not installed for $PG_CONFIG: run make install first"; exit 1; }

WORK=$(mktemp -d "${PGQ_TMP_PREFIX:-/tmp/pgq14-clients}-bench.XXXXXX")
chmod 755 "$WORK"
# shellcheck source=../test/clients/cluster.sh
source "$SRC/test/clients/cluster.sh"
trap 'cluster_stop; rm -rf "$WORK"' EXIT

log "installing the clients into $WORK"
mkdir -p "$WORK/tree"
tar -C "$SRC" --exclude=node_modules --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
	-cf - clients bench/clients bench/sql/sys4_consume.sql bench/sql/sys4_claim_ack_batch.sql | tar -C "$WORK/tree" -xf -
{ /usr/bin/python3 -m venv --system-site-packages "$WORK/venv" &&
	(cd "$WORK" && "$WORK/venv/bin/python" -m pip install -q --no-build-isolation --no-deps --no-index "$WORK/tree/clients/python") &&
	{ ! has node || { (cd "$WORK/tree/clients/node" && npm ci --no-audit --no-fund --loglevel=error) &&
		(cd "$WORK/tree/bench/clients" && npm install --no-audit --no-fund --loglevel=error); }; }; } >"$WORK/install.log" 2>&1 ||
	{ cat "$WORK/install.log"; exit 1; }
chown -R postgres: "$WORK"

PGQ_EXTRA_CONF="fsync = on
shared_buffers = 256MB
pgqueue.naptime = '1s'
pgqueue.batch_size = 1000"
cluster_init "$WORK" || exit 1
log "server on port $PGQ_PORT"
DSN="host=$PGQ_SOCK port=$PGQ_PORT dbname=$PGQ_DB user=app"
CLIENTS_DIR=$WORK/tree/bench/clients

# The server's CPU ticks so far, once no backend of app or postgres is left.
server_ticks() {
	/usr/bin/python3 "$CLIENTS_DIR/procstat.py" server "$PGQ_DATA" --wait-for app,postgres
}

# CT: utime + stime of the children this shell has waited for (cutime + cstime).
children_ticks() {
	local s f
	read -r s <"/proc/$BASHPID/stat"
	read -ra f <<<"${s##*) }"
	CT=$((f[13] + f[14]))
}

# A backlog of $JOBS jobs in queue $1, all scheduled, then VACUUM ANALYZE.
backlog() {
	local sql="" left i
	for ((left = JOBS; left > 0; left -= 10000)); do # pgq_push_batch takes 10,000 at most
		sql+="SELECT count(*) FROM pgq_push_batch('$1', array_fill('{}'::jsonb, ARRAY[$((left < 10000 ? left : 10000))]));"
	done
	psql_admin -d "$PGQ_DB" -c "$sql" >/dev/null || return 1
	for i in $(seq 1 1200); do
		[ "$(psql_admin -d "$PGQ_DB" -Atc "SELECT count(*) FROM pgqueue.queue WHERE queue = '$1' AND state <> 'scheduled'")" = 0 ] && break
		[ "$i" = 1200 ] && { log "the backlog of $1 was not scheduled in 120 s"; return 1; }
		sleep 0.1
	done
	psql_admin -d "$PGQ_DB" -c "VACUUM ANALYZE pgqueue.queue, pgqueue.work_queue" >/dev/null
}

# pgbench drains the backlog of queue $5 with script $2 at concurrency $3,
# $4 jobs per transaction at most; prints the run's JSON as client $1.  Each
# client runs a fixed number of transactions; above concurrency 1, 5 % (and
# 2) more than the backlog needs, since a claim may get fewer jobs than it
# asks while others claim: the last ones find nothing (a fast, empty claim,
# well under 1 % of the run).  A claim may also find nothing while jobs are
# left (their rows locked for a moment, as when the scheduler moves them to
# another slot: SKIP LOCKED passes them by; 15 of 20,000 at concurrency 1
# once): pgbench then runs again for what is left, up to 5 times, and the
# runs' transactions and times are added.  jobs/s = jobs / the sum of
# (transactions / tps), tps being pgbench's (without connection time).
pgbench_drain() {
	local client=$1 script=$2 c=$3 per=$4 q=$5 t out tps ct0 left=$JOBS runs=0 x=0 secs=0
	children_ticks
	ct0=$CT
	while [ "$left" -gt 0 ] && [ "$runs" -lt 5 ]; do
		t=$(((left + per * c - 1) / (per * c)))
		[ "$c" = 1 ] || t=$((t + t / 20 + 2))
		out=$(cd "$WORK" && as_pg "$PGQ_BIN/pgbench" -n -M prepared -h "$PGQ_SOCK" -p "$PGQ_PORT" -U app \
			-D batch="$per" -f "$WORK/tree/bench/sql/$script" -c "$c" -j "$((c < 2 ? c : 2))" -t "$t" "$PGQ_DB" 2>&1)
		tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' <<<"$out" | tail -n 1)
		[ -n "$tps" ] || { echo "$out" >&2; return 1; }
		x=$((x + c * t))
		secs=$(awk -v s="$secs" -v tps="$tps" -v n="$((c * t))" 'BEGIN { printf "%.6f", s + n / tps }')
		left=$(psql_admin -d "$PGQ_DB" -Atc "SELECT count(*) FROM pgqueue.queue WHERE queue = '$q'")
		runs=$((runs + 1))
	done
	children_ticks
	printf '{"client": "%s", "concurrency": %s, "jobs": %s, "transactions": %s, "runs": %s, "seconds": %s, "jobs_per_s": %s, "client_ticks": %s}\n' \
		"$client" "$c" "$JOBS" "$x" "$runs" "$secs" "$(awk -v s="$secs" -v j="$JOBS" 'BEGIN { printf "%.1f", j / s }')" \
		"$((CT - ct0))"
}

# Nothing may be left in queue $1: every job claimed and acked exactly once.
all_acked() {
	local left
	left=$(psql_admin -d "$PGQ_DB" -Atc "SELECT count(*) FROM pgqueue.queue WHERE queue = '$1'")
	[ "$left" = 0 ] || { log "$2: $left jobs left in $1"; return 1; }
}

# $1 (a JSON object on one line) with the round, the server's CPU ticks
# ($2 - $3) and the load averages ($4, $5) added.
annotate() {
	printf '%s, "round": %s, "server_ticks": %s, "load_start": "%s", "load_end": "%s"}\n' \
		"${1%\}}" "$ROUND" "$(($3 - $2))" "$4" "$5"
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# One drain: client $1 (pgbench, pgbatch, python, node) at concurrency $2.
measure() {
	local client=$1 c=$2 q="b_${1}_${2}_$RANDOM" out s0 s1 l0 l1
	backlog "$q" || return 1
	l0=$(loadavg)
	s0=$(server_ticks)
	case $client in
	pgbench) out=$(pgbench_drain pgbench sys4_consume.sql "$c" 1 "$q") ;;
	pgbatch) out=$(pgbench_drain pgbatch sys4_claim_ack_batch.sql "$c" "$BATCH" "$q") ;;
	python) out=$(cd "$WORK" && as_pg "$WORK/venv/bin/python" "$CLIENTS_DIR/drain.py" "$DSN" "$q" "$JOBS" "$c") ;;
	node) out=$(cd "$CLIENTS_DIR" && as_pg node drain.mjs "$PGQ_SOCK" "$PGQ_PORT" app "$PGQ_DB" "$q" "$JOBS" "$c") ;;
	esac || { log "$client at concurrency $c failed"; return 1; }
	s1=$(server_ticks)
	l1=$(loadavg)
	all_acked "$q" "$client c=$c" || return 1
	out=$(printf '{"mode": "drain", %s' "${out#*\{}")
	annotate "$out" "$s0" "$s1" "$l0" "$l1"
}

# One steady load with worker library $1 (python, node).
steady() {
	local client=$1 q="s_${1}_$RANDOM" rec="$WORK/steady-$1-$RANDOM.rec" out l0 l1 cmd
	case $client in
	python) cmd=("$WORK/venv/bin/python" steady_worker.py "$DSN" "$q" "$STEADY_CONCURRENCY" "$rec") ;;
	node) cmd=(node steady_worker.mjs "$PGQ_SOCK" "$PGQ_PORT" app "$PGQ_DB" "$q" "$STEADY_CONCURRENCY" "$rec") ;;
	esac
	l0=$(loadavg)
	out=$(cd "$WORK" && as_pg "$WORK/venv/bin/python" "$CLIENTS_DIR/steady.py" --dsn "$DSN" --queue "$q" \
		--datadir "$PGQ_DATA" --rate "$RATE" --producers "$PRODUCERS" --seconds "$STEADY" --warmup "$WARMUP" \
		--name "$client" -- "${cmd[@]}") || { log "steady load with $client failed"; return 1; }
	l1=$(loadavg)
	all_acked "$q" "steady $client" || return 1
	out=$(printf '{"concurrency": %s, %s' "$STEADY_CONCURRENCY" "${out#*\{}")
	# the server's ticks are steady.py's own window: keep them, add the rest
	printf '%s, "round": %s, "load_start": "%s", "load_end": "%s"}\n' "${out%\}}" "$ROUND" "$l0" "$l1"
}

RAW=$WORK/raw.jsonl
LOAD_START=$(loadavg)
STARTED=$(date -u '+%Y-%m-%d %H:%M UTC')
for ROUND in $(seq 1 "$ROUNDS"); do
	for c in 8 1; do
		for client in $CLIENTS; do
			[ "$client" = pgbatch ] && [ "$c" != 8 ] && continue
			log "round $ROUND: $client, concurrency $c"
			measure "$client" "$c" | tee -a "$RAW" >&2
			[ "${PIPESTATUS[0]}" = 0 ] || exit 1
		done
	done
	[ "$STEADY" = 0 ] && continue
	for client in python node; do
		has "$client" || continue
		log "round $ROUND: steady load, $client"
		steady "$client" | tee -a "$RAW" >&2
		[ "${PIPESTATUS[0]}" = 0 ] || exit 1
	done
done
LOAD_END=$(loadavg)

log "writing $OUT"
# what the report names: the machine, the versions, the settings
export RAW OUT JOBS ROUNDS CLIENTS BATCH RATE PRODUCERS STEADY WARMUP STEADY_CONCURRENCY COMMAND \
	LOAD_START LOAD_END STARTED
export V_PG V_PGQ V_SO V_TREE V_PSYCOPG V_PYLIB V_NODE V_NODEPG V_NODELIB V_PGBENCH SETTINGS
V_PG=$("$PG_CONFIG" --version)
V_PGQ=$(psql_admin -d "$PGQ_DB" -Atc "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'")
V_SO=$(date -u -r "$("$PG_CONFIG" --pkglibdir)/pgqueue.so" '+%Y-%m-%d %H:%M UTC')
V_TREE=$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')
[ -n "$(git -C "$SRC" status --porcelain -- clients bench 2>/dev/null)" ] && V_TREE+=" with local changes in clients/ or bench/"
V_PSYCOPG=$(/usr/bin/python3 -c 'import psycopg; print(psycopg.__version__)')
V_PYLIB=$("$WORK/venv/bin/python" -c 'import pgqueue; print(pgqueue.__version__)')
V_NODE=$(node --version 2>/dev/null || echo '(none)')
V_NODEPG=$(cd "$WORK/tree/clients/node" && node -p 'require("pg/package.json").version' 2>/dev/null || echo "(not run)")
V_NODELIB=$(cd "$WORK/tree/clients/node" && node -p 'require("./package.json").version' 2>/dev/null || echo "?")
V_PGBENCH=$("$PGQ_BIN/pgbench" --version)
SETTINGS=$(psql_admin -d "$PGQ_DB" -Atc "SELECT string_agg(name || ' = ' || current_setting(name), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', 'max_connections',
	'pgqueue.naptime', 'pgqueue.batch_size', 'wal_level', 'checkpoint_timeout', 'max_wal_size')")
/usr/bin/python3 - <<'PY'
import datetime, json, os, platform, statistics, subprocess

E = os.environ
rows = [json.loads(l) for l in open(E["RAW"])]
rounds, jobs, batch = int(E["ROUNDS"]), int(E["JOBS"]), int(E["BATCH"])
clients = E["CLIENTS"].split()
libs = [c for c in ("python", "node") if c in clients]
TICK = os.sysconf("SC_CLK_TCK")
NAME = {"pgbench": "raw single-call SQL (pgbench)", "pgbatch": f"pgbench batch loop ({batch} per claim)",
        "python": "Python worker", "node": "Node worker"}
LIB = {"python": "Python", "node": "Node"}


def us(r, key):
    """CPU µs per job of a run, from its ticks."""
    return r[key] / TICK * 1e6 / r["jobs"]


def f_us(x):
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def runs(client, c, mode="drain"):
    return [r for r in rows if r["client"] == client and r["concurrency"] == c and r["mode"] == mode]


def med(values):
    return statistics.median(values) if values else None


def ratios(client, base, c):
    """The client's jobs/s over base's of the same round, one per round."""
    b = {r["round"]: r["jobs_per_s"] for r in runs(base, c)}
    return sorted(r["jobs_per_s"] / b[r["round"]] for r in runs(client, c) if r["round"] in b)


def spread(q, fmt):
    return f"{fmt(med(q))} ({fmt(q[0])}-{fmt(q[-1])})" if len(q) > 1 else fmt(q[0])


def cpu_cell(rs):
    """Median CPU µs/job of runs: client / server."""
    return (f"{f_us(med([us(r, 'client_ticks') for r in rs]))}"
            f" / {f_us(med([us(r, 'server_ticks') for r in rs]))}")


SHORT = {"pgbench": "pgbench", "pgbatch": "batch loop", "python": "Python", "node": "Node"}
targets = []   # (what, figure, target, met, CPU)
for c, base, want in ((8, "pgbench", 4.0), (8, "pgbatch", 0.5), (1, "pgbench", 1.0)):
    if base not in clients:
        continue
    for lib in libs:
        q = ratios(lib, base, c)
        if q:
            targets.append((f"{LIB[lib]} worker / {NAME[base]}, concurrency {c}",
                            spread(q, lambda x: f"{x:.2f}x"), f">= {want:g}x", med(q) >= want,
                            f"{LIB[lib]} {cpu_cell(runs(lib, c))}; {SHORT[base]} {cpu_cell(runs(base, c))}"))
for lib in libs:
    st = runs(lib, int(E["STEADY_CONCURRENCY"]), "steady")
    for p, want in (("p50", 5), ("p99", 20)):
        q = sorted(r[f"{p}_ms"] for r in st if f"{p}_ms" in r)
        lost = sum(r["missing"] for r in st)   # pushed, never started: no latency is right then
        if q:
            targets.append((f"{LIB[lib]} worker, steady load, commit -> handler start, {p}",
                            spread(q, lambda x: f"{x:.1f} ms")
                            + (f", {lost} jobs never started" if lost else ""),
                            f"<= {want} ms", med(q) <= want and not lost, f"{LIB[lib]} {cpu_cell(st)}"))

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cores = os.cpu_count()
mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
lines = [
    "# Worker libraries against their targets",
    "",
    f"Written by `{E['COMMAND']}`, started {E['STARTED']}: {rounds} round{'s' if rounds > 1 else ''}, the clients interleaved in"
    f" each round; figures are medians over the rounds (in parentheses: the lowest and highest round).",
    "",
    "## Against the targets",
    "",
    "| measure | figure | target | | CPU µs/job, client / server |",
    "|---|---|---|---|---|",
]
lines += [f"| {w} | {f} | {t} | {'met' if m else '**not met**'} | {u} |" for w, f, t, m, u in targets]
if rounds < 5:
    lines += ["", f"Only {rounds} round{'s' if rounds > 1 else ''}: not the targets' measure (5 or more"
              " rounds), a check that the bench runs."]
lines += [
    "",
    "A ratio is the median over the rounds of the library's jobs/s over the jobs/s of the pgbench"
    " run of the same round and concurrency (run just before it). CPU: medians over the rounds,"
    " of the client process (the worker, or pgbench) and of the whole server, per job; for the"
    " steady load the server's includes the pushes.",
    "",
    f"## Throughput: drains of {jobs:,} jobs",
    "",
    "| concurrency | client | jobs/s | client CPU µs/job | server CPU µs/job |",
    "|---|---|---|---|---|",
]
for c in (8, 1):
    for client in clients:
        rs = runs(client, c)
        if rs:
            lines.append(f"| {c} | {NAME[client]} | {med([r['jobs_per_s'] for r in rs]):,.0f}"
                         f" | {f_us(med([us(r, 'client_ticks') for r in rs]))}"
                         f" | {f_us(med([us(r, 'server_ticks') for r in rs]))} |")
st_rows = [r for r in rows if r["mode"] == "steady"]
if st_rows:
    lines += [
        "",
        f"## Latency: steady load, {E['PRODUCERS']} producers at {float(E['RATE']):g} jobs/s in all,"
        f" one worker at concurrency {E['STEADY_CONCURRENCY']}",
        "",
        "| worker | p50 ms | p90 ms | p99 ms | max ms | jobs/s pushed | push p99 ms | worker CPU µs/job | server CPU µs/job |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lib in libs:
        rs = [r for r in st_rows if r["client"] == lib]
        if rs:
            cells = [f"{med([r[k] for r in rs if k in r]):.2f}" if any(k in r for r in rs) else "-"
                     for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
            lines.append(f"| {LIB[lib]} | " + " | ".join(cells)
                         + f" | {med([r['pushed_per_s'] for r in rs]):,.0f}"
                         f" | {med([r['due_to_commit_p99_ms'] for r in rs]):.1f}"
                         f" | {f_us(med([us(r, 'client_ticks') for r in rs]))}"
                         f" | {f_us(med([us(r, 'server_ticks') for r in rs]))} |")
    lines += ["", f"Per run: {E['STEADY']} s of pushes, the first {E['WARMUP']} s left out of the"
              " latencies; jobs measured, missing (pushed, no handler start recorded) and below 0"
              " (the handler started before the producer read its clock after the commit) are in"
              " the table of every run. Push p99: from a push's due time to its commit's return"
              " (the push itself, and how late it started)."]
    slow = [r for r in st_rows if r["pushed_per_s"] < 0.95 * float(E["RATE"])]
    if slow:
        lines += ["", f"**The producers fell short of the rate in {len(slow)} run(s)** (below 95 % of"
                  f" {float(E['RATE']):g} jobs/s): the load was not the one asked for; lower --rate."]

lines += [
    "",
    "## Machine, versions, settings",
    "",
    f"- Machine: {cores} cores ({cpu}), {int(mem) // 1024:,} MiB, Linux {platform.release()};"
    f" load average (1, 5, 15 min) {E['LOAD_START']} at the start, {E['LOAD_END']} at the end"
    " (each run's below).",
    f"- {E['V_PG']}, {E['V_PGBENCH']}; pgqueue {E['V_PGQ']} (pgqueue.so of {E['V_SO']});"
    f" the libraries from the tree at {E['V_TREE']}.",
    f"- Python {platform.python_version()}, psycopg {E['V_PSYCOPG']}, pgqueue {E['V_PYLIB']};"
    f" Node {E['V_NODE']}, pg {E['V_NODEPG']}, pgqueue {E['V_NODELIB']}.",
    f"- Server (test/clients/cluster.sh, unix socket): {E['SETTINGS']}.",
    "",
    "## Method",
    "",
    f"- Drains: a backlog of {jobs:,} jobs, all scheduled and then VACUUM ANALYZE before each run; the run"
    " ends when every job was acked (checked: none left). The workers (clients/drain.py, drain.mjs)"
    " use each library's public API with its defaults but for the concurrency (claims for all free"
    " handlers in one `pgq_claim`, acks in `pgq_ack_batch` every 5 ms or 100 jobs; see their module"
    " docs), handlers that do nothing; timed from just before `start()` to the end of `stop()`."
    " pgbench: `-M prepared -c C -j min(C, 2)`, a fixed number of transactions per client"
    " (above concurrency 1, 5 % more than the backlog needs: the last find nothing), run again for"
    " what is left when a claim found nothing while jobs were left (rows locked for a moment: SKIP"
    " LOCKED); jobs/s = jobs / the sum over the runs of (transactions / tps)."
    " `sql/sys4_consume.sql` claims one job and acks it, two transactions per job;"
    f" `sql/sys4_claim_ack_batch.sql` claims up to {batch} and acks them with one `pgq_ack_batch` in the"
    " same statement: one round trip and one transaction per loop.",
    "- Steady load (clients/steady.py): producer processes, one connection each in autocommit,"
    " push with the Python library's `pgqueue.push` on an open-loop schedule; right after a push"
    " returns (its commit done) the producer reads CLOCK_MONOTONIC and keeps it with the job's id;"
    " the worker's handler reads the same clock first thing (time.monotonic_ns(),"
    " process.hrtime.bigint()) and the worker writes id and time to a file at its end; the two are"
    " joined by job id. The latency includes the scheduler's pass (woken by the commit) and the claim.",
    "- CPU: client = the worker's process (all threads) or pgbench (with runuser), utime + stime"
    " from /proc over the timed window; server = the postmaster's utime + stime + cutime + cstime"
    " plus every live child's, read when no backend of the clients is left, so backends that ended"
    " count (clients/procstat.py); it includes the scheduler, the checkpointer, the WAL writer and"
    " autovacuum. Per job of the run. Clock ticks of 1/%d s." % TICK,
    "",
    "## Every run",
    "",
    "| round | mode | client | concurrency | jobs | jobs/s | p50 / p99 ms | measured / missing / below 0"
    " | client µs/job | server µs/job | load at start | load at end |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    if r["mode"] == "steady":
        lat = f"{r.get('p50_ms', float('nan')):.2f} / {r.get('p99_ms', float('nan')):.2f}"
        cnt = f"{r['measured']} / {r['missing']} / {r['below_zero']}"
        rate = f"{r['pushed_per_s']:,.0f} pushed"
    else:
        lat, cnt, rate = "", "", f"{r['jobs_per_s']:,.0f}"
    lines.append(f"| {r['round']} | {r['mode']} | {r['client']} | {r['concurrency']} | {r['jobs']:,} | {rate}"
                 f" | {lat} | {cnt} | {f_us(us(r, 'client_ticks'))} | {f_us(us(r, 'server_ticks'))}"
                 f" | {r['load_start']} | {r['load_end']} |")
open(E["OUT"], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
