#!/usr/bin/env bash
# Install each major's package (built by scripts/package.sh) into a FRESH
# root of its suite and show it working as a user would set it up:
#
#   sudo bash scripts/package-test.sh 15 17 18
#   sudo bash scripts/package.sh --test 15     # build, then this
#   PACKAGE_TEST_KEEP=1 ...                    # keep the roots (PGQ_ROOTS/fresh-SUITE)
#   PACKAGE_TEST_AUTOPKGTEST=0 ...             # skip the autopkgtest
#
# For each major: a root unpacked from the suite's pristine debootstrap
# (scripts/roots.sh; nothing else installed), `apt-get install` of the
# .deb from PGQ_ROOTS/debs/SUITE/ (it brings postgresql-NN, whose postinst
# makes the cluster main), a conf.d file that turns the scheduler on
# (shared_preload_libraries = 'pgqueue', pgqueue.database = 'pkgtest'),
# the cluster started on port 56340 + major with Unix sockets only; then a
# job pushed, scheduled by the background worker (nothing calls
# pgq_schedule), claimed and acked, each asserted and printed.  Then the
# autopkgtest (debian/tests/installcheck, after its Depends) in the same
# root.  Ends with "N passed, N failed".
set -uo pipefail

# shellcheck source=scripts/roots.sh
. "$(dirname "$0")/roots.sh"

[ $# -gt 0 ] || { echo "usage: $0 MAJOR...  (15, 17, 18)"; exit 2; }
roots_begin || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
check() { # check NAME GOT WANT: one assertion, printed
	if [ "$2" = "$3" ]; then
		echo "ok - $1: $2"
		passed=$((passed + 1))
	else
		echo "not ok - $1: got '$2', want '$3'"
		failed=$((failed + 1))
	fi
}

for v in "$@"; do
	suite=$(suite_of_major "$v") || { echo "no Debian suite ships PostgreSQL $v"; failed=$((failed + 1)); continue; }
	deb=$(ls "$PGQ_ROOTS/debs/$suite/postgresql-$v-pgqueue_"*.deb 2>/dev/null | head -n 1)
	if [ -z "$deb" ]; then
		echo "not ok - no postgresql-$v-pgqueue package in $PGQ_ROOTS/debs/$suite (scripts/package.sh $v)"
		failed=$((failed + 1))
		continue
	fi
	root=$PGQ_ROOTS/fresh-$suite
	port=$((56340 + v))
	log=$PGQ_ROOTS/logs/package-test-$v.log
	t0=$SECONDS
	echo "==> $(basename "$deb") ($(stat -c %s "$deb") bytes) in a fresh $suite root"
	root_remove "$root" || { failed=$((failed + 1)); continue; }
	root_fresh "$suite" "$root" && root_enter "$root" || { failed=$((failed + 1)); continue; }
	mkdir -p "$root/tmp/debs"
	cp "$deb" "$root/tmp/debs/"
	if ! root_run "$root" sh -c 'apt-get update -qq && apt-get install -y -qq /tmp/debs/*.deb' >"$log" 2>&1; then
		echo "not ok - apt-get install $(basename "$deb") (the end of $log):"
		tail -n 20 "$log"
		failed=$((failed + 1))
		root_leave "$root"
		continue
	fi
	check "installed in $((SECONDS - t0)) s" \
		"$(root_run "$root" dpkg-query -W -f '${Status}' "postgresql-$v-pgqueue")" "install ok installed"

	# the scheduler on, as a user turns it on; this test's port, no TCP
	conf=/etc/postgresql/$v/main/conf.d
	printf "shared_preload_libraries = 'pgqueue'\npgqueue.database = 'pkgtest'\n" >"$root$conf/pgqueue.conf"
	printf "port = %d\nlisten_addresses = ''\n" "$port" >"$root$conf/zz-package-test.conf"
	echo "    $conf/pgqueue.conf:"
	sed 's/^/      /' "$root$conf/pgqueue.conf"
	root_run "$root" pg_ctlcluster "$v" main start >>"$log" 2>&1
	check "pg_ctlcluster $v main start" "$?" 0
	psql() { root_run "$root" runuser -u postgres -- psql -X -At -v ON_ERROR_STOP=1 -p "$port" "$@" 2>>"$log"; }
	check "shared_preload_libraries" "$(psql -c 'SHOW shared_preload_libraries')" pgqueue
	psql -q -c 'CREATE DATABASE pkgtest'
	psql -q -d pkgtest -c 'CREATE EXTENSION pgqueue'
	check "CREATE EXTENSION pgqueue" \
		"$(psql -d pkgtest -c "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'")" \
		"$(sed -nE "s/^default_version = '([0-9.]+)'$/\1/p" "$(dirname "$0")/../pgqueue.control")"
	sched=0
	for _ in $(seq 1 60); do
		sched=$(psql -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pgqueue scheduler' AND datname = 'pkgtest'")
		[ "$sched" = 1 ] && break
		sleep 0.5
	done
	check "the background worker (pgqueue scheduler) runs in pkgtest" "$sched" 1

	id=$(psql -d pkgtest -c "SELECT pgq_push('pkgtest', '{\"hello\": \"package\"}')")
	check "pushed a job" "$([[ $id =~ ^[0-9a-f-]{36}$ ]] && echo uuid)" uuid
	echo "    job $id"
	[ -n "$id" ] || tail -n 2 "$log" | sed 's/^/    psql: /'
	state=
	for _ in $(seq 1 60); do
		[ -n "$id" ] || break
		state=$(psql -d pkgtest -c "SELECT state FROM pgqueue.jobs WHERE id = '$id'")
		[ "$state" = scheduled ] && break
		sleep 0.2
	done
	check "scheduled by the background worker (nothing called pgq_schedule)" "$state" scheduled
	echo "    $(psql -d pkgtest -c "SELECT format('pgq_counters: pushed %s, scheduled %s, scheduler_passes %s', pushed, scheduled, scheduler_passes) FROM pgq_counters()")"
	check "claimed" \
		"$(psql -d pkgtest -c "SELECT id = '$id', tries, payload->>'hello' FROM pgq_claim('pkgtest-worker', 1, '30 seconds')")" "t|1|package"
	check "held by the worker" \
		"$(psql -d pkgtest -c "SELECT state || ' ' || lock_key FROM pgqueue.jobs WHERE id = '$id'")" "running pkgtest-worker"
	check "acked" "$(psql -d pkgtest -c "SELECT pgq_ack('$id', 'pkgtest-worker')")" t
	check "gone once acked" "$(psql -d pkgtest -c "SELECT count(*) FROM pgqueue.jobs WHERE id = '$id'")" 0
	echo "    $(psql -d pkgtest -c "SELECT format('pgq_counters: pushed %s, scheduled %s, claimed %s, acked %s', pushed, scheduled, claimed, acked) FROM pgq_counters()")"
	root_run "$root" pg_ctlcluster "$v" main stop >>"$log" 2>&1
	check "pg_ctlcluster $v main stop" "$?" 0
	# a pgqueue process's ERROR, FATAL, PANIC or WARNING, or its non-zero exit
	fails=$(grep -cE 'pgqueue (launcher|scheduler).*(ERROR|FATAL|PANIC|WARNING)|worker "pgqueue [a-z]+" \(PID [0-9]+\) exited with exit code' \
		"$root/var/log/postgresql/postgresql-$v-main.log")
	check "no failure of pgqueue in the server log" "$fails" 0
	grep -E 'LOG:  pgqueue' "$root/var/log/postgresql/postgresql-$v-main.log" | sed 's/^/    log: /'

	if [ "${PACKAGE_TEST_AUTOPKGTEST:-1}" = 1 ]; then
		# the autopkgtest: its Depends (but the package, @), then the test
		# from a copy of the source tree
		deps=$(sed -nE 's/^Depends: *//p' debian/tests/control | tr -d ' ' | tr ',' '\n' | grep -vx '@' | tr '\n' ' ')
		copy_tree "$SRC" "$root/build/src"
		t1=$SECONDS
		# shellcheck disable=SC2086
		if root_install "$root" $deps >>"$log" 2>&1 &&
			root_run "$root" EXTRA_REGRESS_OPTS="--port=$((56370 + v))" \
				sh -c 'cd /build/src && debian/tests/installcheck' >"$log.autopkgtest" 2>&1; then
			rc=0
		else
			rc=1
		fi
		# pg_regress's lines (15: "test x ... ok", 16 on: "ok 1 - x"), and
		# prove's count of assertions ("Files=2, Tests=57")
		ok=$(grep -cE '^test .* \.\.\. ok|^ok [0-9]+ +- ' "$log.autopkgtest")
		tap=$(sed -nE 's/^Files=[0-9]+, Tests=([0-9]+),.*/\1/p' "$log.autopkgtest" | awk '{ n += $1 } END { print n + 0 }')
		bad=$(grep -cE '\.\.\. FAILED|^not ok [0-9]+|^Result: FAIL' "$log.autopkgtest")
		check "autopkgtest debian/tests/installcheck ($ok regress and isolation tests ok, $tap TAP assertions, $bad failed, $((SECONDS - t1)) s)" "$rc/$bad" "0/0"
		echo "    its output: $log.autopkgtest"
		[ "$rc" = 0 ] || grep -E '\.\.\. FAILED|not ok|FAILED|error' "$log.autopkgtest" | head -n 20
	fi
	root_leave "$root"
	echo "    $suite done in $((SECONDS - t0)) s"
	[ "${PACKAGE_TEST_KEEP:-0}" = 1 ] || root_remove "$root"
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
