#!/usr/bin/env bash
# The test matrix (scripts/test.sh matrix): kinds of scripts/test.sh on each
# supported PostgreSQL major, each inside a Debian root of the suite that
# ships that major (scripts/roots.sh): 15 in bookworm, 17 in trixie, 18 in
# sid.
#
#   sudo bash scripts/test.sh matrix
#   MATRIX_MAJORS="15 18" MATRIX_KINDS="regress isolation upgrade tap" sudo bash scripts/matrix.sh
#   MATRIX_MAJORS="15 17 18 fresh" ...  # fresh: README's two commands on a fresh
#                             # Debian 12 root (scripts/fresh-machine.sh, about 27 minutes)
#   MATRIX_REFRESH=1 ...      # apt-get upgrade each kept root before its run
#   PGQ_ROOTS=/var/tmp/roots  # where the roots are kept (default /var/cache/pgqueue-matrix)
#
# MATRIX_KINDS defaults to "regress compat isolation upgrade" (compat: the
# released 1.0 suite against a 1.0 install; upgrade: the TAP files of the
# update from 1.0); add tap for the whole TAP suite.  The first run makes
# each root (debootstrap, then PostgreSQL, its server headers,
# build-essential and libipc-run-perl from Debian) and keeps it; later runs
# reuse it.  In each root the tree (the files git tracks and those it does
# not ignore, as they are now) is copied to /build/pgqueue and its
# scripts/test.sh runs there with PG_CONFIG set to the major's: it builds
# and installs the extension and runs each kind as postgres against private
# servers (Unix sockets only; pg_regress's on port 56300 + major).  Prints
# one line per major and ends with "N passed, N failed"; the whole output
# of each major is in PGQ_ROOTS/logs/matrix-MAJOR.log.
set -uo pipefail

# shellcheck source=scripts/roots.sh
. "$(dirname "$0")/roots.sh"

MAJORS=${MATRIX_MAJORS:-15 17 18}
KINDS=${MATRIX_KINDS:-regress compat isolation upgrade}
roots_begin || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
lines=()
start=$SECONDS
for v in $MAJORS; do
	t0=$SECONDS
	if [ "$v" = fresh ]; then
		# README's two commands, exactly as README gives them, on a fresh
		# Debian 12 root (scripts/fresh-machine.sh: its own root, made anew)
		log=$PGQ_ROOTS/logs/matrix-fresh.log
		echo "==> a fresh Debian 12 machine: README's two commands (scripts/fresh-machine.sh)"
		bash scripts/fresh-machine.sh >"$log" 2>&1
		rc=$?
		read -r ok bad < <(sed -nE 's/^fresh machine: ([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$log" | tail -n 1)
		ok=${ok:-0}
		bad=${bad:-0}
		[ "$rc" != 0 ] && [ "$bad" = 0 ] && bad=1
		suite_line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
		lines+=("fresh Debian 12 (README's two commands): checks $ok passed, $bad failed; its test command: ${suite_line:-no count} [$((SECONDS - t0)) s]")
		if [ "$bad" != 0 ]; then
			echo "--- fresh machine: what failed (the whole output: $log)"
			grep -E 'not ok|FAILED|failed' "$log" | head -n 20
		fi
		passed=$((passed + ok))
		failed=$((failed + bad))
		continue
	fi
	suite=$(suite_of_major "$v") || {
		lines+=("PostgreSQL $v: no Debian suite ships it: 0 passed, 1 failed")
		failed=$((failed + 1))
		continue
	}
	log=$PGQ_ROOTS/logs/matrix-$v.log
	echo "==> PostgreSQL $v ($suite)"
	if ! root_build "$v"; then
		lines+=("PostgreSQL $v ($suite): the root could not be made (see $PGQ_ROOTS/*-$suite.log): 0 passed, 1 failed")
		failed=$((failed + 1))
		continue
	fi
	root=$BUILD_ROOT
	setup=$((SECONDS - t0))
	if ! root_enter "$root"; then
		lines+=("PostgreSQL $v ($suite): could not enter $root: 0 passed, 1 failed")
		failed=$((failed + 1))
		continue
	fi
	if [ "${MATRIX_REFRESH:-0}" = 1 ]; then
		echo "==> apt-get upgrade in $suite"
		root_run "$root" sh -c 'apt-get update -qq && apt-get upgrade -y -qq' >/dev/null
	fi
	rm -rf "$root/build/pgqueue"
	copy_tree "$SRC" "$root/build/pgqueue"
	server=$(root_run "$root" "/usr/lib/postgresql/$v/bin/postgres" --version | sed -E 's/^postgres \(PostgreSQL\) //; s/ .*//')
	t1=$SECONDS
	# shellcheck disable=SC2086
	root_run "$root" PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" PGQ_INSTALLCHECK_ARGS="EXTRA_REGRESS_OPTS=--port=$((56300 + v))" \
		bash /build/pgqueue/scripts/test.sh $KINDS >"$log" 2>&1
	rc=$?
	root_leave "$root"
	run=$((SECONDS - t1))

	read -r ok bad < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$log" | tail -n 1)
	ok=${ok:-0}
	bad=${bad:-0}
	[ "$rc" != 0 ] && [ "$bad" = 0 ] && bad=1
	# each kind's "==> kind: N passed, N failed"
	kinds=$(sed -nE 's/^==> ([a-z0-9]+): ([0-9]+) passed, ([0-9]+) failed$/\1 \2\/\3/p' "$log" | paste -sd ',' | sed 's/,/, /g')
	if [ -n "$kinds" ]; then
		kinds="$kinds (passed/failed)"
	else
		if grep -q 'error:' "$log"; then
			kinds="build failed ($(grep -c 'error:' "$log") compiler error lines)"
		else
			kinds="no kind ran"
		fi
	fi
	lines+=("PostgreSQL $server ($suite): $kinds: $ok passed, $bad failed [root ${setup} s, build and tests ${run} s]")
	if [ "$bad" != 0 ]; then
		echo "--- PostgreSQL $v: what failed (the whole output: $log)"
		grep -E 'error:|\.\.\. FAILED|^[[:space:]]*not ok|^0 passed, 1 failed' "$log" | head -n 20
	fi
	passed=$((passed + ok))
	failed=$((failed + bad))
done

echo "==> matrix ($KINDS) in $((SECONDS - start)) s; roots kept in $PGQ_ROOTS"
printf '%s\n' "${lines[@]}"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
