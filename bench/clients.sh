#!/usr/bin/env bash
# The worker libraries' overhead: jobs/s of a Python worker and a Node worker
# with trivial handlers (concurrency 1 and 8), against the same claim + ack
# as raw SQL from pgbench (sql/sys4_consume.sql), on one throwaway server.
#
#   sudo bash bench/clients.sh                 # writes bench/CLIENTS.md
#   sudo bash bench/clients.sh --jobs 10000 --rounds 5 --out /tmp/clients.md
#   sudo bash bench/clients.sh --clients "pgbench python" --out /tmp/py.md   # some of them
#
# Each measurement drains a backlog of --jobs jobs (default 2,000), fully
# scheduled beforehand.  pgbench and the Node worker take one job per claim,
# claim and ack each in their own transaction; the Python worker claims for
# all its free slots at once and acks in batches (its defaults).  Rounds
# interleave the clients (--clients: which of pgbench, python, node; the
# ratios need pgbench); the
# report takes each one's median, and the median of the per-round ratios
# (a library against the pgbench run right before it, which cancels slow
# drift of a shared machine).  The server is the test suite's
# (test/clients/cluster.sh) with fsync on, shared_buffers 256MB; it is
# stopped and removed at the end.  PG_CONFIG picks the installation (pgqueue
# must be installed there: make install).
set -uo pipefail

if [ "$(id -u)" != 0 ]; then
	exec sudo -E bash "$0" "$@"
fi
SRC=$(cd "$(dirname "$0")/.." && pwd)
JOBS=2000
ROUNDS=7
OUT=$SRC/bench/CLIENTS.md
CLIENTS="pgbench python node"
while [ $# -gt 0 ]; do
	case $1 in
	--jobs) JOBS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--clients) CLIENTS=$2; shift 2 ;;
	*) echo "usage: $0 [--jobs N] [--rounds N] [--out FILE] [--clients \"pgbench python node\"]"; exit 2 ;;
	esac
done
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
log() { printf '==> %s\n' "$*" >&2; }

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
	-cf - clients bench/clients bench/sql/sys4_consume.sql | tar -C "$WORK/tree" -xf -
{ /usr/bin/python3 -m venv --system-site-packages "$WORK/venv" &&
	(cd "$WORK" && "$WORK/venv/bin/python" -m pip install -q --no-build-isolation --no-deps --no-index "$WORK/tree/clients/python") &&
	{ [[ " $CLIENTS " != *" node "* ]] || { (cd "$WORK/tree/clients/node" && npm ci --no-audit --no-fund --loglevel=error) &&
		(cd "$WORK/tree/bench/clients" && npm install --no-audit --no-fund --loglevel=error); }; }; } >"$WORK/install.log" 2>&1 ||
	{ cat "$WORK/install.log"; exit 1; }
chown -R postgres: "$WORK"

PGQ_EXTRA_CONF="fsync = on
shared_buffers = 256MB
pgqueue.batch_size = 1000"
cluster_init "$WORK" || exit 1
log "server on port $PGQ_PORT"
DSN="host=$PGQ_SOCK port=$PGQ_PORT dbname=$PGQ_DB user=app"

# A backlog of $JOBS jobs in queue $1, all scheduled, then VACUUM ANALYZE.
backlog() {
	psql_admin -d "$PGQ_DB" -c "SELECT count(*) FROM pgq_push_batch('$1', array_fill('{}'::jsonb, ARRAY[$JOBS]))" >/dev/null
	local i
	for i in $(seq 1 600); do
		[ "$(psql_admin -d "$PGQ_DB" -Atc "SELECT count(*) FROM pgqueue.queue WHERE queue = '$1' AND state <> 'scheduled'")" = 0 ] && break
		sleep 0.1
	done
	psql_admin -d "$PGQ_DB" -c "VACUUM ANALYZE pgqueue.queue, pgqueue.work_queue" >/dev/null
}

# One measurement: prints {"client":..., "concurrency":..., "jobs_per_s":...}
measure() { # $1 = client (pgbench, python, node), $2 = concurrency
	local client=$1 c=$2 q="b_${1}_${2}_$RANDOM" out
	backlog "$q"
	case $client in
	pgbench)
		out=$(cd "$WORK" && as_pg "$PGQ_BIN/pgbench" -n -M prepared -h "$PGQ_SOCK" -p "$PGQ_PORT" -U app \
			-f "$WORK/tree/bench/sql/sys4_consume.sql" -c "$c" -j "$((c < 2 ? c : 2))" -t "$((JOBS / c))" "$PGQ_DB" 2>&1)
		local tps
		tps=$(sed -nE 's/^tps = ([0-9.]+) .*/\1/p' <<<"$out" | tail -n 1)
		[ -n "$tps" ] || { echo "$out" >&2; return 1; }
		printf '{"client": "pgbench", "concurrency": %s, "jobs": %s, "jobs_per_s": %s}\n' "$c" "$JOBS" "$tps"
		;;
	python)
		as_pg "$WORK/venv/bin/python" "$WORK/tree/bench/clients/drain.py" "$DSN" "$q" "$JOBS" "$c"
		;;
	node)
		(cd "$WORK/tree/bench/clients" && as_pg node drain.mjs "$PGQ_SOCK" "$PGQ_PORT" app "$PGQ_DB" "$q" "$JOBS" "$c")
		;;
	esac
	# nothing may be left: every job claimed and acked exactly once
	local left
	left=$(psql_admin -d "$PGQ_DB" -Atc "SELECT count(*) FROM pgqueue.queue WHERE queue = '$q'")
	[ "$left" = 0 ] || { log "$client c=$c left $left jobs"; return 1; }
}

RAW=$WORK/raw.jsonl
for r in $(seq 1 "$ROUNDS"); do
	for c in 1 8; do
		for client in $CLIENTS; do
			log "round $r: $client, concurrency $c"
			measure "$client" "$c" | tee -a "$RAW" >&2 || exit 1
		done
	done
done

log "writing $OUT"
PSYCOPG=$(/usr/bin/python3 -c 'import psycopg; print(psycopg.__version__)')
NODEPG=$(cd "$WORK/tree/clients/node" && node -p 'require("pg/package.json").version' 2>/dev/null || echo "(not run)")
/usr/bin/python3 - "$RAW" "$OUT" "$JOBS" "$ROUNDS" "$CLIENTS" <<PY
import json, statistics, sys, platform, subprocess, datetime
raw, out, jobs, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
clients = sys.argv[5].split()
libs = [c for c in ("python", "node") if c in clients]
names = {"pgbench": "raw SQL (pgbench)", "python": "Python worker", "node": "Node worker"}
rows = [json.loads(l) for l in open(raw)]
med = {}
for c in (1, 8):
    for client in clients:
        med[(client, c)] = statistics.median(r["jobs_per_s"] for r in rows
                                             if r["client"] == client and r["concurrency"] == c)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
pgv = subprocess.run(["$PG_CONFIG", "--version"], capture_output=True, text=True).stdout.strip()
nodev = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
lines = [
    "# Worker library overhead",
    "",
    f"Written by \`bash bench/clients.sh\` on {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}"
    f" (--jobs {jobs} --rounds {rounds}): median jobs/s of {rounds} rounds, the clients interleaved.",
    "",
    f"Machine: {cores} cores ({cpu}), shared with other work. {pgv}; Python {platform.python_version()}"
    f" with psycopg $PSYCOPG; Node {nodev} with pg $NODEPG.",
    "Server: fsync and synchronous_commit on, shared_buffers 256MB, pgqueue.batch_size 1000,"
    " unix socket. Each run drains a backlog of"
    f" {jobs:,} jobs, all scheduled before it starts. pgbench and the Node worker take one job per claim"
    " (\`pgq_claim(key, 1, '30 seconds')\`), claim and ack each in their own transaction; the Python"
    " worker claims for all its free slots in one call and acks in batches (\`pgq_ack_batch\`, its"
    " defaults: 5 ms or 100 jobs). The libraries' handlers do nothing; the Python"
    " worker also runs its heartbeat thread, both pass \`wait\` (5 s) to their claims. pgbench runs"
    " \`bench/sql/sys4_consume.sql\` (the same claim and ack as SQL, no wait) with -M prepared -c C -j min(C, 2).",
    f"Clients run: {', '.join(clients)}.",
    "",
    "| concurrency | " + " | ".join(names[c] for c in clients) + "".join(
        f" | {names[l].split()[0]} / raw" for l in libs if "pgbench" in clients) + " |",
    "|---" * (1 + len(clients) + (len(libs) if "pgbench" in clients else 0)) + "|",
]
def ratio(client, c):
    """Median over rounds of the client's jobs/s over the same round's pgbench."""
    base = [r["jobs_per_s"] for r in rows if r["client"] == "pgbench" and r["concurrency"] == c]
    mine = [r["jobs_per_s"] for r in rows if r["client"] == client and r["concurrency"] == c]
    q = sorted(m / b for m, b in zip(mine, base))
    return statistics.median(q), q[0], q[-1]
for c in (1, 8):
    cells = [f"{med[(client, c)]:,.0f}" for client in clients]
    if "pgbench" in clients:
        for l in libs:
            r = ratio(l, c)
            cells.append(f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})")
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
lines += ["", "jobs/s are medians over the rounds; a ratio is the median over the rounds of the"
          " library's jobs/s over the pgbench run of the same round and concurrency (in"
          " parentheses: the lowest and highest round)."]
lines += ["", "Every run:", "", "| client | concurrency | jobs/s |", "|---|---|---|"]
lines += [f"| {r['client']} | {r['concurrency']} | {r['jobs_per_s']:,.0f} |" for r in rows]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
