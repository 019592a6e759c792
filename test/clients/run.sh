#!/usr/bin/env bash
# The client tests: the Python and Node worker libraries (clients/), the
# Prometheus query file (contrib/prometheus/) and the examples (examples/),
# against a real server with pgqueue preloaded, then a second time through
# PgBouncer in transaction pooling.
#
#   bash test/clients/run.sh          # pgqueue must be installed for PG_CONFIG
#   bash scripts/test.sh clients      # builds and installs it first
#
# Runs as root; another user's run goes through sudo (scripts/as-root.sh).
# Installs what it needs (Debian's python3-psycopg, python3-pytest,
# python3-venv, python3-wheel, pgbouncer, prometheus-postgres-exporter,
# nodejs and npm when node is missing; pg from npm), copies the tree to a
# postgres-owned scratch directory, installs the Python package there with
# pip (offline) and the Node package's dependency with npm, starts its own
# server and PgBouncer on free ports of PGQ_PORTS (default 5600-5649) and
# stops them at the end.  Last, the documented Node install line
# (docs/clients.md, "Install") is run as written in an empty directory under
# /tmp (pg from npm, or npm's cache).
# Ends with "N passed, N failed".
set -uo pipefail

# shellcheck source=../../scripts/as-root.sh
source "$(dirname "$0")/../../scripts/as-root.sh"
as_root "$0" "$@"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
export DEBIAN_FRONTEND=noninteractive
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
log() { printf '==> %s\n' "$*"; }
fail_setup() {
	echo "clients: $*"
	echo "0 passed, 1 failed"
	exit 1
}

# --- packages ------------------------------------------------------------------
need=()
/usr/bin/python3 -c 'import psycopg' 2>/dev/null || need+=(python3-psycopg)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
# setuptools 66 (Debian 12) builds the package's wheel with the wheel package
/usr/bin/python3 -c 'import wheel' 2>/dev/null || need+=(python3-wheel)
command -v pgbouncer >/dev/null || need+=(pgbouncer)
command -v prometheus-postgres-exporter >/dev/null || need+=(prometheus-postgres-exporter)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v ss >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null ||
		fail_setup "apt-get install ${need[*]} failed"
fi
# Debian's pgbouncer and prometheus-postgres-exporter start system services
# when installed (the exporter on *:9187).  This script runs instances of its
# own on loopback: stop and disable the services it just caused to start.
if [ -d /run/systemd/system ]; then
	for svc in pgbouncer prometheus-postgres-exporter; do
		if [[ " ${need[*]} " == *" $svc "* ]] && systemctl is-enabled -q "$svc" 2>/dev/null; then
			log "disabling the $svc service that installing the package started"
			systemctl disable --now -q "$svc" || true
		fi
	done
fi
[ -f "$("$PG_CONFIG" --pkglibdir)/pgqueue.so" ] ||
	fail_setup "pgqueue is not installed for $PG_CONFIG: run 'make install' (scripts/test.sh clients does)"

# --- a postgres-owned copy of what the tests use -------------------------------
WORK=$(mktemp -d "${PGQ_TMP_PREFIX:-/tmp/pgq14-clients}.XXXXXX")
chmod 755 "$WORK"
# shellcheck source=cluster.sh
source "$SRC/test/clients/cluster.sh"
cleanup() {
	cluster_stop
	if [ "${KEEP_TEST_DIR:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/tree"
tar -C "$SRC" --exclude=.git --exclude=node_modules --exclude=build --exclude='*.egg-info' \
	--exclude=__pycache__ -cf - clients contrib examples test/clients | tar -C "$WORK/tree" -xf -

log "installing the Python package (pip, offline) into a venv"
/usr/bin/python3 -m venv --system-site-packages "$WORK/venv" >"$WORK/pip.log" 2>&1 &&
	(cd "$WORK" && "$WORK/venv/bin/python" -m pip install --no-build-isolation --no-deps \
		--no-index "$WORK/tree/clients/python") >>"$WORK/pip.log" 2>&1 ||
	{ cat "$WORK/pip.log"; fail_setup "pip install clients/python failed"; }
log "installing the Node package's dependencies (npm)"
# examples/ first, while clients/node has no node_modules/ (as in a fresh
# checkout): its copy of pgqueue must find pg in examples/node_modules/
(cd "$WORK/tree/examples" && npm ci --no-audit --no-fund --loglevel=error &&
	cd "$WORK/tree/clients/node" && npm ci --no-audit --no-fund --loglevel=error) >"$WORK/npm.log" 2>&1 ||
	{ cat "$WORK/npm.log"; fail_setup "npm ci in examples or clients/node failed"; }
chown -R postgres: "$WORK"

log "starting PostgreSQL ($("$PG_CONFIG" --version)) and PgBouncer"
cluster_init "$WORK" || fail_setup "the server did not start"
bouncer_start || fail_setup "PgBouncer did not start"
log "server on port $PGQ_PORT, PgBouncer on $PGQ_BOUNCER_PORT"

passed=0
failed=0
skipped=0
# Adds the counts of one suite; a suite that failed without a failed test
# (crashed, did not start) counts as one failure.
count() {
	local name=$1 rc=$2 ok=$3 bad=$4 skip=$5
	if [ "$rc" != 0 ] && [ "$bad" = 0 ]; then bad=1; fi
	log "$name: $ok passed, $bad failed, $skip skipped"
	passed=$((passed + ok))
	failed=$((failed + bad))
	skipped=$((skipped + skip))
}

DIRECT="host=$PGQ_SOCK port=$PGQ_PORT dbname=$PGQ_DB"
BOUNCER="host=127.0.0.1 port=$PGQ_BOUNCER_PORT dbname=$PGQ_DB"
# The environment of the test processes: where workers connect ($1 is
# direct or pgbouncer), a superuser connection straight to the server, and
# how to restart it.
test_env() {
	local dsn=$DIRECT
	[ "$1" = pgbouncer ] && dsn=$BOUNCER
	TEST_ENV=(PGQ_PASS="$1" "PGQ_DSN=$dsn user=app" "PGQ_ADMIN_DSN=$DIRECT user=postgres"
		PGQ_DATA="$PGQ_DATA" PGQ_BIN="$PGQ_BIN" PGQ_REPO="$WORK/tree" PATH="$PATH" HOME="$WORK"
		PGQ_PORTS="${PGQ_PORTS:-5600-5649}" "PGQ_TAKEN_PORTS=$PGQ_TAKEN_PORTS")
}
as_test() { # $1 = pass, then the command
	test_env "$1"
	shift
	runuser -u postgres -- env "${TEST_ENV[@]}" "$@"
}

# pytest's last line: "== 17 passed, 2 skipped, 1 deselected in 22.84s =="
pytest_counts() {
	local line ok bad skip n
	line=$(grep -E '^=+ .* in [0-9.]+s' "$1" | tail -n 1)
	ok=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
	bad=0
	for n in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | grep -oE '[0-9]+'); do
		bad=$((bad + n))
	done
	skip=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+')
	echo "${ok:-0} $bad ${skip:-0}"
}

for pass in direct pgbouncer; do
	out="$WORK/pytest-$pass.out"
	log "Python tests ($pass)"
	marks=()
	[ "$pass" = pgbouncer ] && marks=(-m "not direct_only")
	(cd "$WORK/tree/clients/python/tests" && as_test "$pass" \
		"$WORK/venv/bin/python" -m pytest -p no:cacheprovider -rs -v "${marks[@]}") >"$out" 2>&1
	rc=$?
	cat "$out"
	read -r ok bad skip < <(pytest_counts "$out")
	count "python ($pass)" "$rc" "$ok" "$bad" "$skip"
done

# node --test's summary: "# pass 14" / "# fail 0" (TAP) or "ℹ pass 14" (spec)
node_counts() {
	local ok bad skip
	ok=$(grep -E '^(#|ℹ) pass [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+')
	bad=$(grep -E '^(#|ℹ) fail [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+')
	skip=$(grep -E '^(#|ℹ) skipped [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+')
	echo "${ok:-0} ${bad:-0} ${skip:-0}"
}

for pass in direct pgbouncer; do
	out="$WORK/node-$pass.out"
	log "Node tests ($pass)"
	(cd "$WORK/tree/clients/node" && as_test "$pass" node --test test/*.test.mjs) >"$out" 2>&1
	rc=$?
	grep -vE '^ +(duration_ms|type):|^ +(\.\.\.|---)$' "$out"
	read -r ok bad skip < <(node_counts "$out")
	count "node ($pass)" "$rc" "$ok" "$bad" "$skip"
done

# The Node install line(s) of docs/clients.md ("Install"), as written, in an
# empty directory outside the repository, with /path/to/pgqueue a copy of
# clients/node without node_modules/, as a user's checkout has it; then the
# package must import, also after a plain `npm install` there.
readme_npm_install() {
	local pristine=$WORK/pristine app lines
	lines=$(awk -v heading='^## Install$' -f "$SRC/scripts/sh-block.awk" "$SRC/docs/clients.md" |
		grep -E '^npm ' | sed -e "s|/path/to/pgqueue/|$pristine/|g")
	[ -n "$lines" ] || { echo "no npm line in the Install section of docs/clients.md"; return 1; }
	mkdir -p "$pristine" && tar -C "$SRC" --exclude=node_modules -cf - clients/node | tar -C "$pristine" -xf - ||
		return 1
	app=$(mktemp -d /tmp/pgq-readme-app.XXXXXX) || return 1
	(
		cd "$app" || exit 1
		check='const m = await import("pgqueue");
			if (typeof m.Worker !== "function") throw new Error("no Worker");
			console.log("pgqueue imports:", Object.keys(m).join(" "))'
		printf '$ %s\n' "$lines" && bash -ec "$lines" &&
			node --input-type=module -e "$check" &&
			echo '$ npm install' && npm install --no-audit --no-fund &&
			node --input-type=module -e "$check"
	)
	local rc=$?
	rm -rf "$app"
	return $rc
}
log "the documented Node install line, in an empty directory"
readme_npm_install >"$WORK/readme-npm.out" 2>&1
rc=$?
cat "$WORK/readme-npm.out"
count "the documented Node install line" "$rc" "$((rc == 0))" "$((rc != 0))" 0

if [ "$failed" != 0 ]; then
	log "server log (tail)"
	tail -n 40 "$WORK/server.log"
fi
# skipped: the CLI tests of pgqueue 1.1 objects on a 1.0 server, and the
# tests that only make sense without PgBouncer
log "$skipped skipped (the reasons are in the SKIP lines above)"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
