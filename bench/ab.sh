#!/usr/bin/env bash
# Two builds of pgqueue side by side in one run (bench/README.md, "Two builds
# side by side"): each commit is built into its own copy of PostgreSQL 15,
# and every round runs each workload once on build A and once on build B
# (A B, then B A, ...), each on a fresh server, plus system 1 once as a
# control.  Writes a report of A, B and B / A per round, medians and spread.
#
#   bash bench/ab.sh --base COMMIT [--head COMMIT] [--only a,b,f] [--rounds N]
#                    [--quick] [--out bench/results/ab-<base>-<head>.md]
#
# --head defaults to HEAD, --only to a,b,f, --rounds to 5 (--quick: 2).
# Environment: AB_DIR (parent of the temporary directory, default /tmp),
#              AB_PORT (ports AB_PORT, +1, +2 for A, B, control; default 55471).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PGVER=15
PY=/usr/bin/python3
BASE_REV=""
HEAD_REV="HEAD"
ONLY="a,b,f"
ROUNDS=""
QUICK=""
OUT=""
PORT0=${AB_PORT:-55471}
COMMAND="bash bench/ab.sh $*"

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE_REV="$2"; shift ;;
        --base=*) BASE_REV="${1#*=}" ;;
        --head) HEAD_REV="$2"; shift ;;
        --head=*) HEAD_REV="${1#*=}" ;;
        --only) ONLY="$2"; shift ;;
        --only=*) ONLY="${1#*=}" ;;
        --rounds) ROUNDS="$2"; shift ;;
        --rounds=*) ROUNDS="${1#*=}" ;;
        --quick) QUICK="--quick" ;;
        --out) OUT="$2"; shift ;;
        --out=*) OUT="${1#*=}" ;;
        -h|--help) usage 0 ;;
        *) echo "ab.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done

log() { echo "[$(date +%H:%M:%S)] $*"; }
die() { echo "ab.sh: $*" >&2; exit 2; }

[ -n "$BASE_REV" ] || die "--base COMMIT is required"
[[ $ONLY =~ ^[a-g](,[a-g])*$ ]] || die "--only takes workloads a-g, e.g. a,b,f"
[ -n "$ROUNDS" ] || { [ -n "$QUICK" ] && ROUNDS=2 || ROUNDS=5; }
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "--rounds takes a number of rounds"
[ "$(id -u)" = 0 ] || die "run as root (the servers run as postgres, through runuser, as bench/run.sh does)"

resolve() {
    git -C "$REPO" rev-parse --verify --quiet "$1^{commit}" || die "not a commit: $1"
}
A_ID=$(resolve "$BASE_REV")
B_ID=$(resolve "$HEAD_REV")
A_SHORT=$(git -C "$REPO" rev-parse --short "$A_ID")
B_SHORT=$(git -C "$REPO" rev-parse --short "$B_ID")
if [ -z "$OUT" ]; then
    OUT="$HERE/results/ab-$A_SHORT-$B_SHORT${QUICK:+-quick}.md"
fi
case "$OUT" in *.md) ;; *) die "--out must end in .md (the raw results go beside it, .jsonl)" ;; esac
mkdir -p "$(dirname "$OUT")" || die "cannot create the directory of $OUT"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
RAW="${OUT%.md}.jsonl"

# The order the driver runs workloads in (driver.py WORKLOAD_ORDER), (f) last.
WORKLOADS=()
for w in a b c d e g f; do
    [[ ",$ONLY," == *",$w,"* ]] && WORKLOADS+=("$w")
done

# The PostgreSQL installation that is copied once per build.
SYS_LIB=/usr/lib/postgresql/$PGVER
SYS_SHARE=/usr/share/postgresql/$PGVER
SYS_INCLUDE=/usr/include/postgresql
for d in "$SYS_LIB/bin" "$SYS_SHARE" "$SYS_INCLUDE/$PGVER/server"; do
    [ -d "$d" ] || die "$d is missing: install postgresql-$PGVER and postgresql-server-dev-$PGVER"
done
"$PY" -c 'import psycopg' 2>/dev/null || die "python3-psycopg is missing (apt-get install python3-psycopg)"

# ---------------------------------------------------------------- cleanup
# Everything goes under one temporary directory: the two builds (sources
# and installations) and the runs' servers (BENCH_DIR of bench/run.sh).
# Each run is a process group of its own (setsid), so that it can be
# stopped as a whole; bench/run.sh stops its server and removes its
# directory on exit, and any server still running under $TMP after that
# is stopped here before the directory goes.
mkdir -p "${AB_DIR:-/tmp}"
TMP=$(mktemp -d "${AB_DIR:-/tmp}/pgqueue-ab.XXXXXX")
chmod 755 "$TMP"       # the servers run as postgres, from the builds' roots
mkdir -p "$TMP/runs" "$TMP/out"
CHILD=""

stop_child() {
    [ -n "$CHILD" ] || return 0
    if kill -0 "$CHILD" 2>/dev/null; then
        log "stopping run (process group $CHILD)"
        kill -TERM -- "-$CHILD" 2>/dev/null || true
        local i
        for i in $(seq 1 900); do            # run.sh stops its server: up to 90 s
            kill -0 "$CHILD" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$CHILD" 2>/dev/null || true
    fi
    wait "$CHILD" 2>/dev/null || true
    CHILD=""
}

# A server that a run left behind (a run killed before its own cleanup).
sweep_runs() {
    local pidfile data
    for pidfile in "$TMP"/runs/*/data/postmaster.pid; do
        [ -f "$pidfile" ] || continue
        data=$(dirname "$pidfile")
        log "stopping the server left in $data"
        (cd / && runuser -u postgres -- "$SYS_LIB/bin/pg_ctl" -D "$data" -m immediate -w -t 30 stop) \
            >/dev/null 2>&1 || kill -QUIT "$(head -n 1 "$pidfile")" 2>/dev/null || true
    done
    rm -rf "$TMP"/runs/*
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    stop_child
    sweep_runs
    rm -rf "$TMP"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Runs "$@" in a process group of its own, output to $LOGFILE; returns its
# exit status.  Waiting with the wait builtin lets a signal to this script
# interrupt it at once (the trap then stops the group).
LOGFILE=/dev/null
in_group() {
    setsid "$@" >"$LOGFILE" 2>&1 </dev/null &
    CHILD=$!
    local rc=0
    wait "$CHILD" || rc=$?
    CHILD=""
    return $rc
}

# ---------------------------------------------------------------- builds
# One root per build: a copy of Debian's PostgreSQL 15 (bindir, pkglibdir,
# sharedir, headers), where pg_config reports paths inside the root and
# the server loads its libraries and extension files from it.  The commit
# is exported with git archive (the caller's checkout is not touched) and
# installed there with make install.
build() {   # $1 = A or B, $2 = commit id
    local tag=$1 commit=$2 root="$TMP/$1/root" src="$TMP/$1/src"
    log "build $tag: $(git -C "$REPO" log -1 --format='%h %s' "$commit" | cut -c1-100)"
    mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql" "$root/usr/include" "$src"
    cp -a "$SYS_LIB" "$root/usr/lib/postgresql/"
    cp -a "$SYS_SHARE" "$root/usr/share/postgresql/"
    cp -a "$SYS_INCLUDE" "$root/usr/include/"
    # Whatever pgqueue the system installation holds must not stand in for the build.
    rm -f "$root$SYS_LIB"/lib/pgqueue.so "$root$SYS_SHARE"/extension/pgqueue[-.]*
    rm -rf "$root$SYS_LIB"/lib/bitcode/pgqueue "$root$SYS_LIB"/lib/bitcode/pgqueue.index.bc
    git -C "$REPO" archive --format=tar "$commit" | tar -x -C "$src"
    local pgc="$root$SYS_LIB/bin/pg_config"
    [ "$("$pgc" --pkglibdir)" = "$root$SYS_LIB/lib" ] \
        || die "the copy's pg_config reports $("$pgc" --pkglibdir), not a path inside $root"
    LOGFILE="$TMP/$tag/build.log"
    # The build's own paths are mapped away (__FILE__ of the server's headers,
    # debug info), so that one commit built twice gives the same pgqueue.so.
    local flags="-ffile-prefix-map=$root= -ffile-prefix-map=$src=."
    if ! in_group bash -c 'make -C "$1" -j2 PG_CONFIG="$2" PG_CFLAGS="$3" &&
                           make -C "$1" install PG_CONFIG="$2" PG_CFLAGS="$3"' _ "$src" "$pgc" "$flags"; then
        tail -n 30 "$TMP/$tag/build.log" >&2
        die "build $tag ($commit) failed"
    fi
    [ -f "$root$SYS_LIB/lib/pgqueue.so" ] && [ -f "$root$SYS_SHARE/extension/pgqueue.control" ] \
        || die "build $tag: make install left no pgqueue.so or pgqueue.control in $root"
    md5sum "$root$SYS_LIB/lib/pgqueue.so" | cut -d' ' -f1 >"$TMP/$tag/so.md5"
}

START=$(date +%s)
build A "$A_ID"
build B "$B_ID"
log "builds took $(( $(date +%s) - START )) s"

HARNESS_ID=$(git -C "$REPO" rev-parse HEAD)
HARNESS_DIRTY=$(git -C "$REPO" status --porcelain --untracked-files=no -- bench | wc -l)
"$PY" "$HERE/ab_report.py" init "$RAW" --command "$COMMAND" --mode "${QUICK:+quick}" \
    --rounds "$ROUNDS" --only "${WORKLOADS[*]}" \
    --base "$A_ID" "$(git -C "$REPO" log -1 --format=%s "$A_ID")" "$(cat "$TMP/A/so.md5")" \
    --head "$B_ID" "$(git -C "$REPO" log -1 --format=%s "$B_ID")" "$(cat "$TMP/B/so.md5")" \
    --harness "$HARNESS_ID" "$HARNESS_DIRTY"

# ---------------------------------------------------------------- runs
# Per round, per workload: the pair A B (odd rounds) or B A (even rounds),
# then system 1 on build A's server as the control.  Every run is one
# bench/run.sh --no-install --rounds 1 of one workload and one system, on a
# fresh server of that build (initdb, start, preload pgqueue) on its own port.
TOTAL=$(( ROUNDS * ${#WORKLOADS[@]} * 3 ))
N=0
FAILED=0
log "rounds: $ROUNDS; workloads: ${WORKLOADS[*]}${QUICK:+ (quick)}; $TOTAL runs; report: $OUT"
one_run() {   # $1 round, $2 workload, $3 A|B|control
    local rnd=$1 w=$2 who=$3 root sys port
    case $who in
        A) root="$TMP/A/root"; sys=4; port=$PORT0 ;;
        B) root="$TMP/B/root"; sys=4; port=$((PORT0 + 1)) ;;
        control) root="$TMP/A/root"; sys=1; port=$((PORT0 + 2)) ;;
    esac
    N=$((N + 1))
    local tag
    tag=$(printf 'run-%03d' "$N")
    local la0 la1 t0 t1 s0 rc=0
    la0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%H:%M:%S); s0=$(date +%s)
    log "run $N/$TOTAL: round $rnd, ($w), $who, loadavg $la0"
    LOGFILE="$TMP/out/$tag.log"
    PG_CONFIG="$root$SYS_LIB/bin/pg_config" BENCH_PORT=$port BENCH_DIR="$TMP/runs" \
        in_group bash "$HERE/run.sh" --no-install --only "$w" --systems "$sys" --rounds 1 $QUICK \
        --out "$TMP/out/$tag.md" || rc=$?
    la1=$(cut -d' ' -f1-3 /proc/loadavg); t1=$(date +%H:%M:%S)
    if [ $rc -ne 0 ]; then
        FAILED=$((FAILED + 1))
        log "run $N FAILED (exit $rc); last lines of its log:"
        tail -n 15 "$TMP/out/$tag.log" | sed 's/^/    /'
    fi
    grep -h "^\[..:..:..\]   sys" "$TMP/out/$tag.log" | sed 's/^/    /' || true
    "$PY" "$HERE/ab_report.py" add "$RAW" --run "$N" --round "$rnd" --workload "$w" --build "$who" \
        --port "$port" --rc "$rc" --start "$t0" --end "$t1" --loadavg "$la0" "$la1" \
        --seconds $(( $(date +%s) - s0 )) --results "$TMP/out/$tag.jsonl" --log "$TMP/out/$tag.log"
    "$PY" "$HERE/ab_report.py" render "$RAW" "$OUT" >/dev/null
    rm -f "$TMP/out/$tag".*
    sweep_runs            # a failed run.sh keeps its directory: not here
    if [ $FAILED -ge 3 ]; then
        log "3 runs failed: stopping (the report keeps what was measured)"
        exit 1
    fi
}

for rnd in $(seq 1 "$ROUNDS"); do
    if [ $((rnd % 2)) = 1 ]; then pair=(A B); else pair=(B A); fi
    for w in "${WORKLOADS[@]}"; do
        one_run "$rnd" "$w" "${pair[0]}"
        one_run "$rnd" "$w" "${pair[1]}"
        one_run "$rnd" "$w" control
    done
done

"$PY" "$HERE/ab_report.py" finish "$RAW"
"$PY" "$HERE/ab_report.py" render "$RAW" "$OUT" >/dev/null
log "took $(( $(date +%s) - START )) s; wrote $OUT and $RAW"
echo
cat "$OUT"
