#!/usr/bin/env bash
# The fuzz kind of scripts/test.sh, and the long fuzzing runs by hand.
#
# Starts a private server (Unix socket only, in the run's directory) that
# preloads pgqueue with its schedulers running in two databases, seeds both
# with jobs in every state (test/fuzz/seed.sql), then runs, at the same time:
#   - test/fuzz/apifuzz.py against database "fuzz": every pgqueue function
#     with hostile values from several sessions, random transactions (commit,
#     rollback, savepoints, PREPARE TRANSACTION), the consistency checks
#     after each transaction (test/fuzz/invariants.sql);
#   - sqlsmith against database "smith" (random queries over the catalog's
#     functions, pgqueue's among them, and pgqueue's tables);
# then stops the server and classifies every line of its log
# (test/fuzz/logcheck.py).  Prints "ok"/"not ok" lines and ends with
# "N passed, N failed"; exits non-zero on a failure.
#
#   bash test/fuzz/run.sh                       # 120 s of each, as in the suite
#   FUZZ_SECONDS=1800 bash test/fuzz/run.sh     # 30 minutes of each
#   API_SECONDS=600 SMITH_SECONDS=0 bash test/fuzz/run.sh   # only the API fuzzer
#   FUZZ_SEED=1234 bash test/fuzz/run.sh        # replay (seeds are printed)
#   FUZZ_DIR=/var/tmp/x KEEP=1 ...              # where the server lives; keep it
#
# Needs PG_CONFIG (or pg_config on PATH), sqlsmith, /usr/bin/python3 with
# psycopg 3 (Debian: python3-psycopg).  Run as root (it switches to the
# postgres user) or as the postgres user.  SERVER_WRAPPER (e.g. "valgrind
# ...") and SERVER_ENV (e.g. "LD_PRELOAD=... ASAN_OPTIONS=...") run the
# server under a tool.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd /   # psql as postgres from a directory it may not enter would print a warning
PG_CONFIG=${PG_CONFIG:-pg_config}
if [ "$(id -u)" = 0 ]; then
	[ -z "${FUZZ_DIR:-}" ] && export FUZZ_OWN_DIR=1
	d=${FUZZ_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pgqueue-fuzz.XXXXXX")}
	mkdir -p "$d" && chown postgres: "$d"
	exec runuser -u postgres -- env PATH="$PATH" PG_CONFIG="$PG_CONFIG" FUZZ_DIR="$d" \
		FUZZ_SECONDS="${FUZZ_SECONDS:-}" API_SECONDS="${API_SECONDS:-}" SMITH_SECONDS="${SMITH_SECONDS:-}" \
		FUZZ_SEED="${FUZZ_SEED:-}" FUZZ_PROCS="${FUZZ_PROCS:-}" KEEP="${KEEP:-}" FUZZ_OWN_DIR="${FUZZ_OWN_DIR:-}" \
		SERVER_ENV="${SERVER_ENV:-}" SERVER_WRAPPER="${SERVER_WRAPPER:-}" \
		bash "$HERE/run.sh" "$@"
fi
BIN=$("$PG_CONFIG" --bindir)
[ -z "${FUZZ_DIR:-}" ] && FUZZ_OWN_DIR=1
DIR=${FUZZ_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pgqueue-fuzz.XXXXXX")}
API_SECONDS=${API_SECONDS:-${FUZZ_SECONDS:-120}}
SMITH_SECONDS=${SMITH_SECONDS:-${FUZZ_SECONDS:-120}}
mkdir -p "$DIR" || exit 1
SEED=${FUZZ_SEED:-$(( (RANDOM << 15) | RANDOM ))}
PROCS=${FUZZ_PROCS:-4}
PORT=5432   # the socket lives in $DIR: no other server can clash with it
PY=/usr/bin/python3
passed=0 failed=0 n=0
result() {	# result ok|notok description
	n=$((n + 1))
	if [ "$1" = ok ]; then passed=$((passed + 1)); echo "ok $n - $2"
	else failed=$((failed + 1)); echo "not ok $n - $2"; fi
}
finish() {
	echo "$passed passed, $failed failed"
	[ "$failed" = 0 ]
	exit
}
echo "# fuzz: dir $DIR, seed $SEED, API fuzzer ${API_SECONDS}s x $PROCS sessions, sqlsmith ${SMITH_SECONDS}s"
PSQL=("$BIN/psql" -X -q -h "$DIR" -p $PORT -v ON_ERROR_STOP=1)

# the log check must judge known logs right before it judges this run's
if "$PY" "$HERE/logcheck_selftest.py" >"$DIR/logcheck-selftest.out" 2>&1; then
	result ok "log check judges its self-test logs right ($(tail -n 1 "$DIR/logcheck-selftest.out"))"
else
	sed 's/^/# /' "$DIR/logcheck-selftest.out"; result notok "log check self-test"
fi
rm -rf "$DIR/data" "$DIR/server.log"
"$BIN/initdb" -D "$DIR/data" -A trust -U postgres >"$DIR/initdb.log" 2>&1 ||
	{ cat "$DIR/initdb.log"; result notok "initdb"; finish; }
cat >>"$DIR/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$DIR'
port = $PORT
shared_preload_libraries = 'pgqueue'
pgqueue.database = 'fuzz,smith'
pgqueue.naptime = 50
max_prepared_transactions = 20
max_connections = 40
fsync = off
log_line_prefix = '%m [%p] %b %d %e '
log_min_messages = warning
log_error_verbosity = verbose   # LOCATION lines: whose code raised an error
CONF
stop_server() {
	"$BIN/pg_ctl" -D "$DIR/data" -m fast -w -t 120 stop >/dev/null 2>&1 ||
		"$BIN/pg_ctl" -D "$DIR/data" -m immediate -w stop >/dev/null 2>&1
}
if [ -n "${SERVER_WRAPPER:-}" ]; then
	# pg_ctl -p: the postgres binary to run; a wrapper script execs the tool
	cat >"$DIR/postgres-wrapped" <<W
#!/bin/sh
exec ${SERVER_WRAPPER} "$BIN/postgres" "\$@"
W
	chmod +x "$DIR/postgres-wrapped"
	PGCTL_P=(-p "$DIR/postgres-wrapped")
else
	PGCTL_P=()
fi
env ${SERVER_ENV:-} "$BIN/pg_ctl" -D "$DIR/data" "${PGCTL_P[@]}" -l "$DIR/server.log" -w -t 300 start >/dev/null ||
	{ tail -n 30 "$DIR/server.log"; result notok "server start"; finish; }
trap 'stop_server' EXIT

setup_ok=1
for db in fuzz smith; do
	"${PSQL[@]}" -d postgres -c "CREATE DATABASE $db" &&
		"${PSQL[@]}" -d $db -c "CREATE EXTENSION pgqueue" &&
		"${PSQL[@]}" -d $db -f "$HERE/seed.sql" >"$DIR/seed-$db.out" 2>&1 ||
		{ setup_ok=0; cat "$DIR/seed-$db.out" 2>/dev/null; }
done
"${PSQL[@]}" -d smith -f "$HERE/smith.sql" >"$DIR/smith-setup.out" 2>&1 ||
	{ setup_ok=0; cat "$DIR/smith-setup.out"; }
# sqlsmith's queries can run for ever (cross joins of generate_series):
# every statement in its database is bounded
"${PSQL[@]}" -d postgres -c "ALTER DATABASE smith SET statement_timeout = '1s'" \
	-c "ALTER DATABASE smith SET lock_timeout = '500ms'" || setup_ok=0
if [ $setup_ok = 1 ]; then result ok "setup: two databases seeded with jobs in every state"
else result notok "setup"; finish; fi
grep -A12 'state | count' "$DIR/seed-fuzz.out" | sed 's/^/# /'

pids=()
if [ "$API_SECONDS" -gt 0 ]; then
	"$PY" "$HERE/apifuzz.py" --dsn "host=$DIR port=$PORT dbname=fuzz user=postgres" \
		--seconds "$API_SECONDS" --procs "$PROCS" --seed "$SEED" \
		--invariants "$HERE/invariants.sql" >"$DIR/apifuzz.out" 2>&1 &
	pids+=($!)
fi
if [ "$SMITH_SECONDS" -gt 0 ]; then
	# --max-queries as a backstop; the run is bounded by time
	timeout -s INT "$SMITH_SECONDS" sqlsmith --seed="$SEED" --exclude-catalog --verbose \
		--target="host=$DIR port=$PORT dbname=smith user=postgres" \
		>"$DIR/sqlsmith.out" 2>"$DIR/sqlsmith.err" &
	pids+=($!)
fi
api_rc=0 smith_rc=0
if [ "$API_SECONDS" -gt 0 ]; then wait "${pids[0]}"; api_rc=$?; fi
if [ "$SMITH_SECONDS" -gt 0 ]; then wait "${pids[-1]}"; smith_rc=$?; fi

if [ "$API_SECONDS" -gt 0 ]; then
	grep -A10 '^deadlock (40P01)' "$DIR/apifuzz.out" | sed 's/^/# /' | head -n 60
	grep -v '^deadlock (40P01)' "$DIR/apifuzz.out" | sed 's/^/# /' | tail -n 45
	if [ $api_rc = 0 ]; then result ok "API fuzzer (seed $SEED)"
	else result notok "API fuzzer (seed $SEED, exit $api_rc)"; fi
fi
if [ "$SMITH_SECONDS" -gt 0 ]; then
	# sqlsmith prints a summary of errors it met on SIGINT; it exits
	# non-zero when it loses its connection (a crash)
	tail -c 3000 "$DIR/sqlsmith.err" | tr '\r' '\n' | grep -v '^$' | tail -n 25 | sed 's/^/# /'
	queries=$(tr '\r' '\n' <"$DIR/sqlsmith.err" | grep -oE 'queries: [0-9]+' | tail -n 1 | grep -oE '[0-9]+')
	echo "# sqlsmith: ${queries:-?} queries, seed $SEED"
	if grep -qiE 'connection|server closed|terminat|crash' "$DIR/sqlsmith.err" && [ $smith_rc != 130 ] && [ $smith_rc != 124 ] && [ $smith_rc != 0 ]; then
		result notok "sqlsmith (seed $SEED): lost its connection, exit $smith_rc"
	else
		result ok "sqlsmith (seed $SEED): ${queries:-?} queries, exit $smith_rc"
	fi
fi

"${PSQL[@]}" -d fuzz -At -f "$HERE/invariants.sql" >"$DIR/final-invariants.out" 2>&1
if [ -s "$DIR/final-invariants.out" ]; then
	result notok "invariants after the run"; sed 's/^/# /' "$DIR/final-invariants.out"
else result ok "invariants after the run"; fi

stop_server
trap - EXIT
if "$PY" "$HERE/logcheck.py" "$DIR/server.log" >"$DIR/logcheck.out" 2>&1; then
	result ok "server log: no crash, no assertion, only ordinary errors"
else
	result notok "server log"
fi
sed 's/^/# /' "$DIR/logcheck.out" | head -n 80
if [ "${KEEP:-0}" != 1 ] && [ $failed = 0 ] && [ "${FUZZ_OWN_DIR:-}" = 1 ]; then rm -rf "$DIR"; fi
finish
