#!/usr/bin/env bash
# The dashboard's browser tests: a private PostgreSQL with pgqueue (started
# here as the postgres user, stopped again), the dashboard, and headless
# Chromium driven by playwright-core.  Ends with "N passed, N failed".
#
#   bash dashboard/test/run.sh     # as root, or through sudo
#
# Expects pgqueue built and installed for $PG_CONFIG (scripts/test.sh does
# that: `bash scripts/test.sh dashboard`).  Installs what else it needs:
# Debian's chromium and nodejs/npm, and the npm packages of dashboard/.
#
#   DASHBOARD_TEST_PORT  first of four ports it uses (default 5910)
#   DASHBOARD_TEST_PARENT where its directory (data, socket) is made (default /tmp)
#   DASHBOARD_BIG_JOBS   jobs in the queue whose page load is measured
#                        (default 1000000)
#   DASHBOARD_SCREENSHOT where to copy the screenshot it takes (docs/operations.md's is
#                        dashboard/screenshot.png)
set -uo pipefail

# shellcheck source=../../scripts/as-root.sh
source "$(dirname "$0")/../../scripts/as-root.sh"
as_root "$0" "$@"

DASH=$(cd "$(dirname "$0")/.." && pwd)
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PORT=${DASHBOARD_TEST_PORT:-5910}
export DEBIAN_FRONTEND=noninteractive
log() { printf '==> %s\n' "$*"; }
fail() { echo "$*"; echo "0 passed, 1 failed"; exit 1; }

# --- dependencies --------------------------------------------------------------
need=()
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	{ apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; } || fail "apt-get install failed"
fi
log "npm ci ($(node --version))"
(cd "$DASH" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || fail "npm ci failed"

# --- a private server ----------------------------------------------------------
BIN=$("$PG_CONFIG" --bindir)
[ -x "$BIN/postgres" ] || fail "no postgres in $BIN"
TMP=$(mktemp -d "${DASHBOARD_TEST_PARENT:-/tmp}/pgq-dashboard-test.XXXXXX")
chmod 755 "$TMP"
chown postgres: "$TMP"
stop() {
	[ -f "$TMP/data/postmaster.pid" ] &&
		runuser -u postgres -- "$BIN/pg_ctl" -D "$TMP/data" -m immediate -w stop >/dev/null 2>&1
	rm -rf "$TMP"
}
trap stop EXIT
(cd "$TMP" && runuser -u postgres -- "$BIN/initdb" -D "$TMP/data" -A trust -U postgres -E UTF8 >"$TMP/initdb.log" 2>&1) ||
	{ cat "$TMP/initdb.log"; fail "initdb failed"; }
cat >>"$TMP/data/postgresql.conf" <<EOF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$TMP'
shared_preload_libraries = 'pgqueue'
pgqueue.database = 'dash'
# the test schedules by itself (pgq_schedule), so that every count is known
pgqueue.enabled = off
shared_buffers = 256MB
max_wal_size = 4GB
fsync = off
synchronous_commit = off
full_page_writes = off
autovacuum = off
EOF
runuser -u postgres -- "$BIN/pg_ctl" -D "$TMP/data" -l "$TMP/server.log" -w start >/dev/null ||
	{ tail -n 30 "$TMP/server.log"; fail "server did not start"; }
runuser -u postgres -- "$BIN/psql" -h "$TMP" -p "$PORT" -qAt -d postgres \
	-c "CREATE DATABASE dash" >/dev/null || fail "createdb failed"

log "browser tests"
PGHOST=$TMP PGPORT=$PORT PGUSER=postgres PGDATABASE=dash DASHBOARD_PORT=$((PORT + 1)) \
	DASHBOARD_TEST_TMP=$TMP node "$DASH/test/test.js"
rc=$?
if [ "$rc" != 0 ]; then
	log "server log (tail)"
	tail -n 20 "$TMP/server.log"
fi
exit $rc
