#!/usr/bin/env bash
# The benchmark on other PostgreSQL majors: bench/run.sh inside the Debian
# root of each major's suite (scripts/roots.sh, the roots of
# scripts/test.sh matrix: 15 in bookworm, 17 in trixie, 18 in sid), pgqueue
# (sys4) against the hand-rolled SKIP LOCKED lease queue (sys1) on the same
# server, and a report per major in bench/results/major-NN.md.
#
#   sudo bash bench/matrix.sh                       # 17 and 18: steady state (a) and drain (b), 3 rounds
#   BENCH_MAJORS="15 17 18" BENCH_ONLY=a,b,f BENCH_ROUNDS=5 sudo bash bench/matrix.sh
#
# The roots share the machine's CPUs with everything else: run it on a quiet
# machine, as bench/run.sh.  Each root's server listens on a Unix socket of
# its own (bench/run.sh makes its directory), on port 56400 + major.
set -uo pipefail

# shellcheck source=scripts/roots.sh
. "$(dirname "$0")/../scripts/roots.sh"

MAJORS=${BENCH_MAJORS:-17 18}
ONLY=${BENCH_ONLY:-a,b}
ROUNDS=${BENCH_ROUNDS:-3}
SYSTEMS=${BENCH_SYSTEMS:-1,4}
roots_begin || exit 1
mkdir -p "$SRC/bench/results"

rc=0
for v in $MAJORS; do
	suite=$(suite_of_major "$v") || { echo "PostgreSQL $v: no Debian suite ships it"; rc=1; continue; }
	echo "==> PostgreSQL $v ($suite)"
	root_build "$v" || { echo "PostgreSQL $v: the root could not be made"; rc=1; continue; }
	root=$BUILD_ROOT
	root_enter "$root" || { echo "PostgreSQL $v: could not enter $root"; rc=1; continue; }
	rm -rf "$root/build/pgqueue"
	copy_tree "$SRC" "$root/build/pgqueue"
	out=bench/results/major-$v.md
	root_run "$root" PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" BENCH_PORT=$((56400 + v)) BENCH_DIR=/var/tmp \
		bash /build/pgqueue/bench/run.sh --only "$ONLY" --systems "$SYSTEMS" --rounds "$ROUNDS" \
		--out "/build/pgqueue/$out" 2>&1 | tee "$PGQ_ROOTS/logs/bench-$v.log"
	status=${PIPESTATUS[0]}
	root_leave "$root"
	if [ "$status" != 0 ] || [ ! -f "$root/build/pgqueue/$out" ]; then
		echo "PostgreSQL $v: bench/run.sh failed (exit $status; $PGQ_ROOTS/logs/bench-$v.log)"
		rc=1
		continue
	fi
	cp "$root/build/pgqueue/$out" "$SRC/$out"
	for f in "$root/build/pgqueue/${out%.md}".*; do
		[ -f "$f" ] && cp "$f" "$SRC/bench/results/"
	done
	echo "==> PostgreSQL $v: $SRC/$out"
done
exit $rc
