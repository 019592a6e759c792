#!/usr/bin/env bash
# pgqueue benchmark harness: installs what it needs, starts its own throwaway
# PostgreSQL 15 server, runs the workloads against each system, writes
# bench/RESULTS.md and prints it.  See bench/README.md.
#
#   bash bench/run.sh [--quick] [--only a,b,c,d,e,f,g] [--systems 1,2,3,4]
#                     [--wl-systems 'c=4 d=4 f=1,4'] [--out FILE] [--keep]
#                     [--mock-pgqueue] [--no-install] [--rounds N]
#
# Environment: BENCH_DIR (parent of the throwaway directory, default /tmp),
#              BENCH_PORT (default 55433), PG_CONFIG (the server installation
#              to use, default Debian's /usr/lib/postgresql/15/bin/pg_config;
#              pgqueue is built and installed there with make install
#              PG_CONFIG=... first, unless --no-install).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# the major: the one of PG_CONFIG's path (Debian's /usr/lib/postgresql/NN/...),
# else 15; its postgresql-NN is installed below when the server is missing
PGVER=15
[[ ${PG_CONFIG:-} =~ /postgresql/([0-9]+)/bin/pg_config$ ]] && PGVER=${BASH_REMATCH[1]}
PGBIN=$(dirname "${PG_CONFIG:-/usr/lib/postgresql/$PGVER/bin/pg_config}")
export PGBENCH=$PGBIN/pgbench
PY=/usr/bin/python3          # Debian's python3-psycopg is installed for this one
PORT=${BENCH_PORT:-55433}
BASE=${BENCH_DIR:-/tmp}
QUICK=""
ONLY="a,b,c,d,e,f,g"
SYSTEMS="1,2,3,4"
WL_SYSTEMS=""
INSTALL=1
OUT="$HERE/RESULTS.md"
KEEP=0
MOCK=""
ROUNDS=""
COMMAND="bash bench/run.sh $*"

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK="--quick" ;;
        --only) ONLY="$2"; shift ;;
        --only=*) ONLY="${1#*=}" ;;
        --systems) SYSTEMS="$2"; shift ;;
        --systems=*) SYSTEMS="${1#*=}" ;;
        --wl-systems) WL_SYSTEMS="$2"; shift ;;
        --wl-systems=*) WL_SYSTEMS="${1#*=}" ;;
        --no-install) INSTALL=0 ;;
        --out) OUT="$2"; shift ;;
        --out=*) OUT="${1#*=}" ;;
        --keep) KEEP=1 ;;
        --rounds) ROUNDS="$2"; shift ;;
        --rounds=*) ROUNDS="${1#*=}" ;;
        --mock-pgqueue) MOCK="--mock-pgqueue" ;;
        -h|--help) usage 0 ;;
        *) echo "run.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done

log() { echo "[$(date +%H:%M:%S)] $*"; }

[[ $ONLY =~ ^[a-g](,[a-g])*$ ]] || { echo "run.sh: --only takes workloads a-g, e.g. a,c" >&2; exit 2; }
[[ $SYSTEMS =~ ^(sys)?[1-6](,(sys)?[1-6])*$ ]] || { echo "run.sh: --systems takes 1-6, e.g. 1,2,4" >&2; exit 2; }
[ -z "$ROUNDS" ] || [[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds takes a number of rounds" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")" || { echo "run.sh: cannot create the directory of $OUT" >&2; exit 2; }

# ---------------------------------------------------------------- packages
need=()
[ -x "$PGBIN/postgres" ] && [ -x "$PGBIN/pgbench" ] || need+=("postgresql-$PGVER")
"$PY" -c 'import psycopg' 2>/dev/null || need+=(python3-psycopg)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
    # postgresql-contrib-$PGVER is only a name that postgresql-$PGVER provides
    # on Debian 12: nothing more to install for it (and no contrib module is used).
fi
id postgres >/dev/null 2>&1 || { echo "run.sh: no postgres user after installing postgresql-$PGVER" >&2; exit 1; }

# ---------------------------------------------------------------- pgqueue?
# Build this checkout and install it into the server installation of
# PG_CONFIG, so that the figures are those of the code beside this script.
if [ $INSTALL = 1 ] && [ -z "$MOCK" ]; then
    log "building pgqueue and installing it for $PGBIN/pg_config"
    make -s -C "$HERE/.." -j2 PG_CONFIG="$PGBIN/pg_config" >/dev/null
    make -s -C "$HERE/.." install PG_CONFIG="$PGBIN/pg_config" >/dev/null
fi
PKGLIBDIR=$("$PGBIN/pg_config" --pkglibdir 2>/dev/null || pg_config --pkglibdir)
SHAREDIR=$("$PGBIN/pg_config" --sharedir 2>/dev/null || pg_config --sharedir)
PGQ_STATUS=absent
PGQ_REASON="pgqueue is not installed ($PKGLIBDIR/pgqueue.so not found)"
if [ -f "$PKGLIBDIR/pgqueue.so" ]; then
    if [ -f "$SHAREDIR/extension/pgqueue.control" ]; then
        PGQ_STATUS=preloaded
    else
        PGQ_REASON="$PKGLIBDIR/pgqueue.so exists but $SHAREDIR/extension/pgqueue.control does not"
    fi
fi

# ---------------------------------------------------------------- server
mkdir -p "$BASE"
WORK=$(mktemp -d "$BASE/pgqueue-bench.XXXXXX")
DATA="$WORK/data"
SOCK="$WORK/sock"
SERVERLOG="$WORK/server.log"
mkdir -p "$SOCK"
chown -R postgres: "$WORK"
chmod 755 "$WORK"

as_pg() { runuser -u postgres -- "$@"; }
server_running() { [ -f "$DATA/postmaster.pid" ]; }
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if server_running; then
        log "stopping the benchmark server"
        as_pg "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 2>&1 \
            || as_pg "$PGBIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ $rc -ne 0 ] && [ -f "$SERVERLOG" ]; then
        echo "---- last lines of $SERVERLOG ----" >&2
        tail -n 30 "$SERVERLOG" >&2 || true
    fi
    if [ $KEEP = 1 ] || [ $rc -ne 0 ]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "initdb in $DATA"
as_pg "$PGBIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 \
    || { cat "$WORK/initdb.log" >&2; exit 1; }

write_settings() {   # $1 = 1 to preload pgqueue
    {
        echo "# pgqueue benchmark server settings (bench/run.sh)"
        echo "port = $PORT"
        echo "listen_addresses = ''                  # unix socket only"
        echo "unix_socket_directories = '$SOCK'"
        echo "max_connections = 100"
        echo "shared_buffers = 256MB"
        echo "fsync = on                             # default"
        echo "synchronous_commit = on                # default"
        if [ "$1" = 1 ]; then
            echo "shared_preload_libraries = 'pgqueue'"
            echo "pgqueue.database = 'bench'"
        fi
    } >"$DATA/bench.conf"
    chown postgres: "$DATA/bench.conf"
}
grep -q "^include = 'bench.conf'" "$DATA/postgresql.conf" || echo "include = 'bench.conf'" >>"$DATA/postgresql.conf"

start_server() {
    as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$SERVERLOG" -w -t 60 start >/dev/null
}

if [ $PGQ_STATUS = preloaded ] && [ -z "$MOCK" ]; then
    write_settings 1
    if ! start_server; then
        log "the server did not start with pgqueue preloaded; starting it without"
        tail -n 20 "$SERVERLOG" || true
        PGQ_STATUS="start-failed"
        PGQ_REASON="the server failed to start with shared_preload_libraries = 'pgqueue' (see its log)"
        write_settings 0
        start_server
    fi
else
    write_settings 0
    start_server
fi
log "server up: $("$PGBIN/psql" -h "$SOCK" -p "$PORT" -U postgres -d postgres -XAtc 'SELECT version()')"

psql_admin() { "$PGBIN/psql" -h "$SOCK" -p "$PORT" -U postgres -d postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
psql_admin -c "CREATE DATABASE bench"
if [ $PGQ_STATUS = preloaded ] && [ -z "$MOCK" ]; then
    # Restart so that the scheduler finds the bench database at start.
    as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$SERVERLOG" -m fast -w -t 60 restart >/dev/null
fi

# ---------------------------------------------------------------- workloads
start=$(date +%s)
"$PY" "$HERE/driver.py" --host "$SOCK" --port "$PORT" --user postgres --dbname bench \
    $QUICK $MOCK ${ROUNDS:+--rounds "$ROUNDS"} --only "$ONLY" --systems "$SYSTEMS" --wl-systems "$WL_SYSTEMS" --workdir "$WORK" \
    --settings "$DATA/bench.conf" --out "$OUT" --raw "${OUT%.md}.jsonl" \
    --command "$COMMAND" --pgqueue-status "$PGQ_STATUS" --pgqueue-reason "$PGQ_REASON"
log "workloads took $(( $(date +%s) - start )) s"
echo
cat "$OUT"
