#!/usr/bin/env bash
# Run the whole pgqueue test suite: pg_regress, isolation and TAP tests, the
# soak (test/soak/run.sh: 1 minute with faults, then 3 minutes of its ring
# mode), the fuzzers (test/fuzz/run.sh:
# the API fuzzer and sqlsmith, 2 minutes), and the client libraries'
# tests (test/clients/run.sh) and the dashboard's browser tests
# (dashboard/test/run.sh).
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh regress    # one kind: docs, regress, compat, isolation, tap, upgrade, soak, fuzz, clients or dashboard
#       (regress begins with scripts/check-layers.py, the layers of src/: one test of its count)
#   bash scripts/test.sh matrix     # regress, compat, isolation and upgrade on PostgreSQL 15, 17 and 18,
#       each in a Debian root of its own (scripts/matrix.sh: MATRIX_KINDS, MATRIX_MAJORS)
#   SOAK_SECONDS=600 bash scripts/test.sh soak   # a longer soak: each mode 600 s (SOAK_PORTS, SOAK_SEED too)
#   SOAK_MODE=ring SOAK_SECONDS=3600 bash scripts/test.sh soak   # the ring mode alone, 60 minutes
#   KEEP_TEST_DIR=1 bash scripts/test.sh # keep the test copy to read results/
#   TEST_DIR_BASE=/some/dir bash scripts/test.sh  # make the test copy there (default /tmp)
#   PGQ_TEST_ENV="LD_PRELOAD=... ASAN_OPTIONS=..." # environment of the test
#       programs and the servers they start (scripts/sanitize.sh); PG_CFLAGS,
#       PG_LDFLAGS from the environment reach the build (PGXS)
#   PGQ_INSTALLCHECK_ARGS="bindir=/dir"          # more make variables for the
#       pg_regress/isolation/TAP runs (scripts/valgrind.sh: its postgres)
#
# Runs as root; another user's run goes through sudo, the settings above
# passed along (scripts/as-root.sh).
# Installs what it needs (Debian 12 packages, pg_cron among them), builds and installs the
# extension, then runs each kind of test as the postgres user in a copy of
# the tree (initdb refuses root; see ../shared/TESTING.md).  Every server it
# starts is private and stopped again.  Ends with "N passed, N failed".
set -uo pipefail

# shellcheck source=as-root.sh
source "$(dirname "$0")/as-root.sh"
as_root "$0" "$@"

cd "$(dirname "$0")/.."
SRC=$(pwd)
KINDS=${*:-docs regress compat isolation tap soak fuzz clients dashboard}
export DEBIAN_FRONTEND=noninteractive

# matrix: the suites on each supported major, in roots of their own; it
# needs nothing of this machine's PostgreSQL
case " $KINDS " in *" matrix "*)
	if [ "$KINDS" != matrix ]; then
		echo "kind matrix runs alone (MATRIX_KINDS chooses the kinds it runs in each root)"
		echo "0 passed, 1 failed"
		exit 2
	fi
	exec bash scripts/matrix.sh
	;;
esac

log() { printf '==> %s\n' "$*"; }

# PG_CONFIG may point at a relocated copy of the server's installation
# (cp -a of /usr/lib/postgresql/15 and /usr/share/postgresql/15 under one
# root), so that parallel runs of different trees do not overwrite each
# other's installed extension; or at another major's (Debian's
# /usr/lib/postgresql/MAJOR/bin/pg_config): its packages are the ones
# installed below.  15 by default.
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_MAJOR=15
if [ -x "$PG_CONFIG" ]; then
	PG_MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
fi

# --- dependencies ------------------------------------------------------------
need=()
command -v make >/dev/null && command -v gcc >/dev/null || need+=(build-essential)
[ -x "/usr/lib/postgresql/$PG_MAJOR/bin/postgres" ] || need+=("postgresql-$PG_MAJOR")
[ -f "/usr/include/postgresql/$PG_MAJOR/server/postgres.h" ] || need+=("postgresql-server-dev-$PG_MAJOR")
perl -MIPC::Run -e1 2>/dev/null || need+=(libipc-run-perl)
case " $KINDS " in *" fuzz "*)
	command -v sqlsmith >/dev/null || need+=(sqlsmith) ;;
esac
# python3 runs scripts/check-links.py (docs) and scripts/check-layers.py (regress)
case " $KINDS " in *" regress "*|*" docs "*)
	command -v python3 >/dev/null || need+=(python3) ;;
esac
# gdb holds the scheduler in a race window (t/025_ring_wake_after_turn.pl)
case " $KINDS " in *" tap "*)
	command -v gdb >/dev/null || need+=(gdb) ;;
esac
# the soak's and the fuzzer's drivers: Debian's psycopg 3, for /usr/bin/python3
case " $KINDS " in *" soak "*|*" fuzz "*)
	/usr/bin/python3 -c 'import psycopg' 2>/dev/null || need+=(python3-psycopg) ;;
esac
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null ||
		{ echo "apt-get install failed"; echo "0 passed, 1 failed"; exit 1; }
fi
# pg_cron, for t/010_pg_cron.pl: Debian's package installs it into the
# system's tree; a relocated tree gets a copy of its files.
pkglibdir=$("$PG_CONFIG" --pkglibdir)
extdir=$("$PG_CONFIG" --sharedir)/extension
if [ ! -f "$pkglibdir/pg_cron.so" ]; then
	if [ ! -f "/usr/lib/postgresql/$PG_MAJOR/lib/pg_cron.so" ]; then
		log "installing postgresql-$PG_MAJOR-cron"
		apt-get update -qq && apt-get install -y -qq "postgresql-$PG_MAJOR-cron" >/dev/null ||
			{ echo "apt-get install postgresql-$PG_MAJOR-cron failed"; echo "0 passed, 1 failed"; exit 1; }
	fi
	if [ ! -f "$pkglibdir/pg_cron.so" ]; then
		cp "/usr/lib/postgresql/$PG_MAJOR/lib/pg_cron.so" "$pkglibdir/" &&
			cp "/usr/share/postgresql/$PG_MAJOR/extension/"pg_cron* "$extdir/" ||
			{ echo "could not copy pg_cron into $pkglibdir"; echo "0 passed, 1 failed"; exit 1; }
	fi
fi

# --- a postgres-owned copy of the tree, built and installed -------------------
# Building in the copy leaves the checkout untouched (parallel runs are safe).
WORK=$(mktemp -d "${TEST_DIR_BASE:-/tmp}/pgqueue-test.XXXXXX")
chmod 755 "$WORK"
# KEEP_TEST_DIR=1 keeps the copy (results/, output_iso/, tmp_check*/logs)
cleanup() {
	if [ "${KEEP_TEST_DIR:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
mkdir -p "$WORK/tree" "$WORK/tmp"
tar -C "$SRC" --exclude=.git --exclude=node_modules --exclude='tmp_check*' --exclude=results --exclude=output_iso --exclude=output_compat -cf - . |
	tar -C "$WORK/tree" -xf -
log "building"
if ! (cd "$WORK/tree" && make -s clean && make -s && make -s install) >"$WORK/build.log" 2>&1; then
	cat "$WORK/build.log"
	echo "0 passed, 1 failed"
	exit 1
fi
grep -E "warning:" "$WORK/build.log" || true
chown -R postgres: "$WORK"
# every kind runs from the copy: the checkout may be in a directory the
# postgres user cannot enter (/root, a 0700 mktemp), and its psql and
# pg_ctl would say "could not change directory" on stderr
cd "$WORK"

run_as_pg() {
	# shellcheck disable=SC2086
	(cd "$WORK/tree" && runuser -u postgres -- env ${PGQ_TEST_ENV:-} TMPDIR="$WORK/tmp" PATH="$PATH" \
		PG_CONFIG="$PG_CONFIG" make -s installcheck ${PGQ_INSTALLCHECK_ARGS:-} "$@")
}

passed=0
failed=0

# pg_regress and pg_isolation_regress print one line per test:
#   "test name   ... ok   12 ms" or "     name   ... FAILED   12 ms" (15),
#   "ok 1     - name   12 ms" or "not ok 1     - name   12 ms" (TAP, from 16;
#   "+" instead of "-" in a parallel group)
count_pg_regress() {
	local out=$1 ok bad
	ok=$(grep -cE '^(test |     )?[ ]*[A-Za-z0-9_]+ +\.\.\. ok|^ok [0-9]+ +[-+] ' "$out")
	bad=$(grep -cE '\.\.\. (FAILED|failed)|^not ok [0-9]+ +[-+] ' "$out")
	echo "$ok $bad"
}

# The TAP output without background psql's log of each query and its results
# (BackgroundPsql.pm's notes: over 7,000 lines, t/007's the most), for a
# run that passed; a failed one prints it all.
tap_quiet() {
	awk '
		skip == 2 && /^# results query [0-9]+:$/ { skip = 1; n++; next }
		skip && /^#/ { n++; if (skip == 1 && $0 == "# }") skip = 0; next }
		{ skip = 0 }
		/^# connect output:$/ { skip = 1; n++; next }
		/^# issuing query [0-9]+ via background psql: / { skip = 2; n++; next }
		{ print }
		END { if (n) printf "(%d lines of background psql query logs left out: printed when TAP fails)\n", n }
	' "$1"
}

for kind in $KINDS; do
	out="$WORK/$kind.out"
	case $kind in
	docs)
		# the relative links of README.md, CHANGELOG.md, docs/, bench/
		# (scripts/check-links.py): a file or heading that moved; read in
		# the checkout (the copy leaves out results/ directories, and
		# bench/results/ is linked)
		log "docs (relative links of the Markdown pages)"
		(cd "$SRC" && python3 scripts/check-links.py) >"$out" 2>&1
		rc=$?
		if [ "$rc" = 0 ]; then ok=1 bad=0; else ok=0 bad=1; fi
		;;
	regress)
		# first the layers of src/ (src/README): one test, passed or failed
		log "layers of src/ (scripts/check-layers.py)"
		python3 "$WORK/tree/scripts/check-layers.py" --quiet "$WORK/tree/src" 2>&1
		layers_rc=$?
		log "pg_regress"
		run_as_pg ISOLATION= TAP_TESTS= >"$out" 2>&1
		rc=$?
		read -r ok bad < <(count_pg_regress "$out")
		if [ "$layers_rc" = 0 ]; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
		;;
	compat)
		log "pg_regress, the 1.0 suite against a 1.0 install"
		run_as_pg REGRESS='$(COMPAT10)' REGRESS_OPTS='$(COMPAT10_OPTS)' ISOLATION= TAP_TESTS= >"$out" 2>&1
		rc=$?
		read -r ok bad < <(count_pg_regress "$out")
		;;
	isolation)
		log "isolation"
		run_as_pg REGRESS= TAP_TESTS= >"$out" 2>&1
		rc=$?
		read -r ok bad < <(count_pg_regress "$out")
		;;
	tap | upgrade)
		# upgrade: the TAP files of the updates alone (from 1.0: a live
		# update, the schema it leaves against a fresh install's; from
		# 1.1 to 1.2 under load, a 1.1 dump restored into 1.2)
		tests=()
		if [ "$kind" = tap ]; then
			log "TAP"
		else
			log "TAP, the updates (t/006_upgrade.pl, t/033_upgrade_dump.pl, t/035_upgrade_12.pl)"
			tests=("PROVE_TESTS=t/006_upgrade.pl t/033_upgrade_dump.pl t/035_upgrade_12.pl")
		fi
		run_as_pg REGRESS= ISOLATION= PROVE_FLAGS="--timer -v" "${tests[@]}" >"$out" 2>&1
		rc=$?
		ok=$(grep -cE '^[[:space:]]*ok [0-9]+' "$out")
		bad=$(grep -cE '^[[:space:]]*not ok [0-9]+' "$out")
		;;
	soak)
		# test/soak/run.sh, each mode with its own server: the soak with
		# faults (60 s unless SOAK_SECONDS), then the ring mode (90 s
		# unless SOAK_SECONDS: small slots, a standby, dumps and a
		# restore); SOAK_MODE=faults or ring runs one of them.  Each runs
		# the invariant checker over its history.
		: >"$out"
		rc=0
		for mode in ${SOAK_MODE:-faults ring}; do
			case $mode in faults) secs=${SOAK_SECONDS:-60} ;; *) secs=${SOAK_SECONDS:-90} ;; esac
			log "soak, $mode mode ($secs s)"
			runuser -u postgres -- env TMPDIR="$WORK/tmp" PATH="$PATH" PG_CONFIG="$PG_CONFIG" \
				SOAK_DIR="$WORK/soak-$mode" SOAK_MODE="$mode" SOAK_SECONDS="$secs" \
				SOAK_PORTS="${SOAK_PORTS:-}" SOAK_SEED="${SOAK_SEED:-}" SOAK_ARGS="${SOAK_ARGS:-}" \
				SOAK_CONF="${SOAK_CONF:-}" SOAK_SELFTEST="${SOAK_SELFTEST:-}" \
				bash "$WORK/tree/test/soak/run.sh" >>"$out" 2>&1
			mrc=$?
			[ "$mrc" = 0 ] || rc=$mrc
			if [ "$mrc" != 0 ] && [ -f "$WORK/soak-$mode/history.jsonl" ]; then
				# keep the history (and the server's log) for a replay of the checker
				keep=$(mktemp "${TEST_DIR_BASE:-/tmp}/pgqueue-soak-$mode-history.XXXXXX")
				cp "$WORK/soak-$mode/history.jsonl" "$keep" &&
					cp "$WORK/soak-$mode/server.log" "$keep.server.log"
				[ -f "$WORK/soak-$mode/standby.log" ] && cp "$WORK/soak-$mode/standby.log" "$keep.standby.log"
				log "soak history kept in $keep (replay: /usr/bin/python3 test/soak/checker.py $keep)"
			fi
		done
		# run.sh prints "soak: N passed, N failed" for the checker, for
		# selftest.py, and once more when soak.py failed: summed over
		# both modes
		read -r ok bad < <(sed -nE 's/^soak: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$out" |
			awk '{ p += $1; f += $2 } END { print p + 0, f + 0 }')
		;;
	fuzz)
		# test/fuzz/run.sh: a server of its own (Unix socket in the run's
		# directory), the API fuzzer and sqlsmith for 2 minutes at once
		log "fuzz (API fuzzer and sqlsmith, FUZZ_SECONDS=${FUZZ_SECONDS:-120})"
		# shellcheck disable=SC2086
		runuser -u postgres -- env ${PGQ_TEST_ENV:-} PATH="$PATH" PG_CONFIG="$PG_CONFIG" TMPDIR="$WORK/tmp" \
			FUZZ_DIR="$WORK/fuzz" FUZZ_SECONDS="${FUZZ_SECONDS:-120}" FUZZ_SEED="${FUZZ_SEED:-}" \
			bash "$WORK/tree/test/fuzz/run.sh" >"$out" 2>&1
		rc=$?
		ok=$(grep -cE '^ok [0-9]+' "$out")
		bad=$(grep -cE '^not ok [0-9]+' "$out")
		;;
	clients)
		log "clients (Python, Node, PgBouncer, Prometheus exporter, examples)"
		bash "$WORK/tree/test/clients/run.sh" >"$out" 2>&1
		rc=$?
		# the last such line (a kept directory is reported after it)
		read -r ok bad < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$out" | tail -n 1)
		ok=${ok:-0} bad=${bad:-0}
		;;
	dashboard)
		# dashboard/test/run.sh: its own server, Chromium and npm packages
		log "dashboard (browser tests)"
		bash "$WORK/tree/dashboard/test/run.sh" >"$out" 2>&1
		rc=$?
		read -r ok bad < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed.*/\1 \2/p' "$out" | tail -n 1)
		ok=${ok:-0}
		bad=${bad:-0}
		;;
	*)
		echo "unknown test kind: $kind (use docs, regress, compat, isolation, tap, upgrade, soak, fuzz, clients, dashboard or matrix)"
		echo "0 passed, 1 failed"
		exit 2
		;;
	esac
	# a suite that failed without reporting a failed test (server did not
	# start, a TAP script died, its output went missing) still counts as one
	# failure
	ok=${ok:-0}
	bad=${bad:-0}
	if [ ! -s "$out" ]; then rc=1; fi
	if [ "$rc" != 0 ] && [ "$bad" = 0 ]; then bad=1; fi
	if [ "$kind" = tap ] && [ "$rc" = 0 ]; then
		tap_quiet "$out"
	else
		cat "$out"
	fi
	if [ "$rc" != 0 ]; then
		case $kind in
		regress) diffs=$WORK/tree/regression.diffs ;;
		compat) diffs=$WORK/tree/output_compat/regression.diffs ;;
		isolation) diffs=$WORK/tree/output_iso/regression.diffs ;;
		*) diffs= ;;
		esac
		[ -n "$diffs" ] && [ -f "$diffs" ] && { log "$diffs"; cat "$diffs"; }
		if [ "$kind" = fuzz ] && [ -f "$WORK/fuzz/server.log" ]; then
			log "$WORK/fuzz/server.log (tail)"; tail -n 40 "$WORK/fuzz/server.log"
		fi
		if [ "$kind" = tap ] || [ "$kind" = upgrade ]; then
			for f in "$WORK"/tree/tmp_check/log/regress_log_*; do
				[ -f "$f" ] && { log "$f"; tail -n 80 "$f"; }
			done
		fi
		for f in "$WORK"/tree/tmp_check_{regress,compat,iso}/log/postmaster.log; do
			[ -f "$f" ] && { log "$f (tail)"; tail -n 40 "$f"; }
		done
	fi
	log "$kind: $ok passed, $bad failed"
	passed=$((passed + ok))
	failed=$((failed + bad))
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
