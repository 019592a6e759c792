#!/usr/bin/env bash
# README's two commands on a fresh Debian 12 machine.
#
# Makes a new Debian 12 root (unpacked from a tarball of a plain
# `debootstrap bookworm`, made here when missing), adds a login user "user"
# whose home holds a copy of this tree (git archive of HEAD: a fresh machine
# has no git), and runs in the copy, as root and exactly as README's "Two
# commands" section gives them (read from README.md), its two commands: the
# demo, then the whole test suite.  Checks what the demo leaves behind: no
# NOTICE in its output, all three queues in its last view, no file in the
# checkout that the user does not own, the user's own `make` and `make
# clean` working, `demo.sh stop` twice (both say it is stopped).  Then, as a
# user with sudo (installed for this part): the demo again, `demo.sh stop`,
# `KEEP_TEST_DIR=1 bash scripts/test.sh regress` (the setting must reach the
# root run), and the install lines of the client libraries
# (docs/clients.md, "Install") and of the dashboard (docs/operations.md,
# "Dashboard"), in a copy of the checkout.
#
#   bash scripts/fresh-machine.sh            # as root (or through sudo): it chroots and mounts
#   FRESH_KINDS="regress clients" bash scripts/fresh-machine.sh   # test.sh KINDS
#
# Environment:
#   FRESH_DIR    its directory: the root, the tarball, the logs
#                (default /var/tmp/pgqueue-fresh)
#   FRESH_ROOT   where the root is made, anew each run (default $FRESH_DIR/root)
#   FRESH_TAR    tarball of a fresh Debian 12 root (default
#                $FRESH_DIR/bookworm.tar, made with debootstrap if missing)
#   FRESH_KINDS  kinds given to the test command (default none: the whole suite)
#   FRESH_PORT   first of the 70 ports the servers started in the root get
#                (default 56200; the root shares the host's network):
#                demo +0, soak +10-29, clients +30-49, dashboard +50-53,
#                pg_regress +60 (TAP picks its own, on Unix sockets only)
#   FRESH_CA     a CA bundle that node in the root must trust besides its
#                own (NODE_EXTRA_CA_CERTS), where the npm registry is reached
#                through a proxy that intercepts TLS
#   FRESH_DEMO=0 no demo: the test command alone, on the pristine root (as CI)
#   FRESH_SUDO=0 no second part (the user with sudo)
#   FRESH_NICE   nice level of the commands (default 10)
#   FRESH_KEEP=1 keep the root afterwards (default: removed)
#
# Every server started in the root is stopped, every process left in it is
# ended (by its pid), and the mounts are undone, also on an error or ^C.
# Logs: $FRESH_DIR/logs/*.log.  Ends with "fresh machine: N passed, N failed".
set -uo pipefail

# as root: it makes a root, mounts into it and chroots
# shellcheck source=as-root.sh
source "$(dirname "$0")/as-root.sh"
as_root "$0" "$@"
SRC=$(cd "$(dirname "$0")/.." && pwd)
DIR=${FRESH_DIR:-/var/tmp/pgqueue-fresh}
ROOT=${FRESH_ROOT:-$DIR/root}
TAR=${FRESH_TAR:-$DIR/bookworm.tar}
LOGS=$DIR/logs
PORT=${FRESH_PORT:-56200}
NICE=${FRESH_NICE:-10}
CHECKOUT=/home/user/pgqueue
mkdir -p "$DIR" "$LOGS" || exit 2
ROOT=$(readlink -m "$ROOT")
case $ROOT in / | /usr | /usr/* | /etc | /etc/* | /home | /root) echo "fresh-machine.sh: FRESH_ROOT=$ROOT?" >&2; exit 2 ;; esac

passed=0
failed=0
check() {	# check ok|notok DESCRIPTION
	if [ "$1" = ok ]; then passed=$((passed + 1)); echo "ok - $2"
	else failed=$((failed + 1)); echo "not ok - $2"; fi
}
verdict() { if "$@"; then echo ok; else echo notok; fi; }
log() { printf '\n==> %s\n' "$*"; }

# --- the root: mounts, processes, cleanup --------------------------------------
MOUNTS=(proc sys dev dev/pts dev/shm)
mount_root() {
	local m
	for m in "${MOUNTS[@]}"; do
		mkdir -p "$ROOT/$m"
		mountpoint -q "$ROOT/$m" && continue
		case $m in
		proc) mount -t proc proc "$ROOT/proc" ;;
		sys) mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys" ;;
		*) mount --bind "/$m" "$ROOT/$m" ;;
		esac || return 1
	done
	cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
}
# the pids of the processes whose root is $ROOT: they were started here
root_pids() {
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/root" 2>/dev/null)" = "$ROOT" ] && echo "${p#/proc/}"
	done
}
cleanup() {
	local pids i m
	if [ -x "$ROOT/usr/lib/postgresql/15/bin/pg_ctl" ] && mountpoint -q "$ROOT/proc"; then
		in_root bash -c "cd $CHECKOUT && bash scripts/demo.sh stop" >/dev/null 2>&1
	fi
	for i in 1 2 3 4 5 6 7 8 9 10 11; do
		pids=$(root_pids)
		[ -z "$pids" ] && break
		# shellcheck disable=SC2086
		if [ "$i" -le 10 ]; then kill -TERM $pids 2>/dev/null; else kill -KILL $pids 2>/dev/null; fi
		sleep 1
	done
	for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
		m=$ROOT/${MOUNTS[$i]}
		mountpoint -q "$m" && { umount -R "$m" 2>/dev/null || umount -lR "$m"; }
	done
	if grep -q " $ROOT/" /proc/mounts; then
		echo "fresh-machine.sh: still mounted under $ROOT:" >&2
		grep " $ROOT/" /proc/mounts >&2
		return 1
	fi
}
remove_root() {
	cleanup || return 1
	rm -rf --one-file-system "$ROOT"
}
finish() {
	cleanup
	if [ "${FRESH_KEEP:-0}" = 1 ]; then echo "kept the root: $ROOT"; else remove_root; fi
}

# the environment of every command in the root: a login's, and the ports
ENV=(HOME=/root TERM=dumb LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	PGQ_DEMO_PORT="$PORT" SOAK_PORTS="$((PORT + 10))-$((PORT + 29))"
	PGQ_PORTS="$((PORT + 30))-$((PORT + 49))" DASHBOARD_TEST_PORT="$((PORT + 50))"
	EXTRA_REGRESS_OPTS="--port=$((PORT + 60))")
if [ -n "${FRESH_CA:-}" ]; then ENV+=(NODE_EXTRA_CA_CERTS=/usr/local/share/fresh-machine-ca.crt); fi
in_root() { env -i "${ENV[@]}" nice -n "$NICE" chroot "$ROOT" "$@"; }
as_user() { in_root runuser -u user -- bash -c "cd $CHECKOUT && $1"; }
# timed NAME CMD...: CMD's output to $LOGS/NAME.log; says how long it took
timed() {
	local name=$1 s rc
	shift
	s=$(date +%s)
	"$@" >"$LOGS/$name.log" 2>&1
	rc=$?
	echo "$name: exit $rc, $(($(date +%s) - s)) s (log $LOGS/$name.log)"
	return $rc
}

# --- README's two commands -----------------------------------------------------
# the sh block of the section "Two commands", comments dropped
mapfile -t COMMANDS < <(awk -v heading='^## Two commands' -f "$SRC/scripts/sh-block.awk" "$SRC/README.md" |
	sed -e 's/[ \t]*#.*//' -e '/^$/d')
if [ ${#COMMANDS[@]} != 2 ] || [[ ${COMMANDS[0]} != *demo.sh* ]] || [[ ${COMMANDS[1]} != *test.sh* ]]; then
	echo "fresh-machine.sh: README's Two commands are not a demo.sh and a test.sh command: ${COMMANDS[*]}" >&2
	exit 2
fi
DEMO=${COMMANDS[0]}
TEST="${COMMANDS[1]}${FRESH_KINDS:+ $FRESH_KINDS}"
echo "README's commands: '$DEMO' and '$TEST' (FRESH_KINDS adds kinds)"

# --- a fresh root ----------------------------------------------------------------
if [ ! -f "$TAR" ]; then
	log "debootstrap bookworm (once: kept as $TAR)"
	command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null || exit 2
	rm -rf "$DIR/debootstrap"
	timed debootstrap debootstrap bookworm "$DIR/debootstrap" http://deb.debian.org/debian || exit 2
	tar --numeric-owner --xattrs --acls -C "$DIR/debootstrap" -cf "$TAR.part" . && mv "$TAR.part" "$TAR" || exit 2
	rm -rf "$DIR/debootstrap"
fi
log "a fresh root in $ROOT (from $TAR)"
remove_root || exit 2
trap finish EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$ROOT" && tar --numeric-owner --xattrs --acls -C "$ROOT" -xpf "$TAR" || exit 2
# the host's name resolves, as on a machine of its own (sudo looks it up)
printf '127.0.1.1\t%s\n' "$(hostname)" >>"$ROOT/etc/hosts"
# packages start no services in it (the postgresql package's cluster on 5432)
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d" && chmod 755 "$ROOT/usr/sbin/policy-rc.d"
if [ -n "${FRESH_CA:-}" ]; then
	mkdir -p "$ROOT/usr/local/share" && cp "$FRESH_CA" "$ROOT/usr/local/share/fresh-machine-ca.crt" || exit 2
fi
mount_root || { echo "fresh-machine.sh: mounting into $ROOT failed" >&2; exit 2; }
in_root useradd -m -s /bin/bash user || exit 2
mkdir -p "$ROOT$CHECKOUT"
git -C "$SRC" archive HEAD | tar -x -C "$ROOT$CHECKOUT" || exit 2
in_root chown -R user: "$CHECKOUT"
echo "user's checkout: $CHECKOUT (git archive of $(git -C "$SRC" rev-parse --short HEAD))"
[ -z "$(git -C "$SRC" status --porcelain --untracked-files=no)" ] ||
	echo "(the tree has uncommitted changes: they are not in the copy)"
for c in sudo git make gcc python3 node npm curl; do
	in_root sh -c "command -v $c >/dev/null" && echo "the root has $c already"
done
START=$(date +%s)

# files in the checkout the user does not own (root's builds would leave them)
foreign_files() { in_root find "$CHECKOUT" ! -user user -printf '%u %p\n' | head -n 5; }
# the checks of a demo's log
demo_checks() {	# demo_checks LOG WHO
	local out=$1 who=$2 last
	check "$(verdict test -z "$(grep -E '^(NOTICE|WARNING|ERROR)' "$out")")" \
		"$who: no NOTICE, WARNING or ERROR in the demo's output"
	check "$(verdict test "$(sed -n '/per-queue view/,$p' "$out" | grep -cE '^ (emails|thumbnails|reports) +\|')" = 3)" \
		"$who: the demo's last view shows all three queues"
	last=$(grep -E '^pushed [0-9]+ ' "$out" | tail -n 1)
	check "$(verdict awk '{ exit !($2 > 0 && $2 == $8 && $11 == 0 && $14 == 0) }' <<<"$last")" \
		"$who: the demo's jobs were all acked: $last"
	check "$(verdict test -z "$(foreign_files)")" "$who: no file in the checkout that user does not own $(foreign_files | tr '\n' ' ')"
}
stop_checks() {	# stop_checks WHO RUN...: demo.sh stop, twice
	local who=$1 n
	shift
	for n in 1 2; do
		if timed "stop-$who-$n" "$@" "bash scripts/demo.sh stop" && grep -q 'is stopped' "$LOGS/stop-$who-$n.log"; then
			check ok "$who: demo.sh stop ($n): $(tail -n 1 "$LOGS/stop-$who-$n.log")"
		else
			check notok "$who: demo.sh stop ($n): $(tail -n 1 "$LOGS/stop-$who-$n.log")"
		fi
	done
}
as_root_in_checkout() { in_root bash -c "cd $CHECKOUT && $1"; }

if [ "${FRESH_DEMO:-1}" != 0 ]; then
	log "as root: $DEMO"
	timed demo-root as_root_in_checkout "$DEMO"
	rc=$?
	check "$(verdict test "$rc" = 0)" "root: '$DEMO' exits 0"
	sed -n '/per-queue view/,$p' "$LOGS/demo-root.log"
	demo_checks "$LOGS/demo-root.log" root
	log "the user's own make after the demo"
	timed make-user as_user "make && make clean"
	rc=$?
	check "$(verdict test "$rc" = 0)" "user: make and make clean in the checkout after the demo"
	check "$(verdict test -z "$(cd "$ROOT$CHECKOUT" && find . -name '*.o' -o -name '*.bc' -o -name '*.so')")" \
		"user: no build file left after make clean"
	stop_checks root as_root_in_checkout
fi

log "as root: $TEST"
timed test-root as_root_in_checkout "$TEST"
rc=$?
grep -E '^==> [a-z]+: [0-9]+ passed' "$LOGS/test-root.log"
summary=$(tail -n 1 "$LOGS/test-root.log")
echo "$summary"
check "$(verdict test "$rc" = 0)" "root: '$TEST' exits 0"
check "$(verdict grep -qE '^[1-9][0-9]* passed, 0 failed$' <<<"$summary")" "root: it ends with '$summary'"
check "$(verdict test -z "$(foreign_files)")" "root: no file in the checkout that user does not own after the tests"

if [ "${FRESH_SUDO:-1}" != 0 ]; then
	log "a user with sudo"
	timed install-sudo in_root sh -c 'apt-get update -qq && apt-get install -y -qq sudo' &&
		echo 'user ALL=(ALL) NOPASSWD: ALL' >"$ROOT/etc/sudoers.d/user" &&
		chmod 440 "$ROOT/etc/sudoers.d/user"
	rc=$?
	check "$(verdict test "$rc" = 0)" "sudo installed, user may use it"
	if [ "${FRESH_DEMO:-1}" != 0 ]; then
		timed demo-user as_user "$DEMO"
		rc=$?
		check "$(verdict test "$rc" = 0)" "user: '$DEMO' exits 0 (through sudo)"
		demo_checks "$LOGS/demo-user.log" user
		check "$(verdict grep -q 'connect:  sudo -u postgres psql' "$LOGS/demo-user.log")" \
			"user: the demo's last lines say to connect with sudo -u postgres"
		stop_checks user as_user
	fi
	timed test-user-keep as_user "KEEP_TEST_DIR=1 bash scripts/test.sh regress"
	rc=$?
	kept=$(sed -nE 's/^==> kept (.*)/\1/p' "$LOGS/test-user-keep.log")
	check "$(verdict test "$rc" = 0)" "user: 'KEEP_TEST_DIR=1 bash scripts/test.sh regress' exits 0: $(grep -E '^[0-9]+ passed' "$LOGS/test-user-keep.log")"
	check "$(verdict test -n "$kept" -a -d "$ROOT$kept")" "user: ... and keeps its directory ($kept)"
	[ -n "$kept" ] && rm -rf "${ROOT:?}$kept"
	# the install lines of the libraries (the sh block of docs/clients.md's
	# "Install") and of the dashboard (docs/operations.md), in a copy of the
	# checkout (they write venv/, node_modules/, package.json; the copy is
	# also the pages' /path/to/pgqueue); apt-get's question, if it has one,
	# is answered yes
	clients=$(awk -v heading='^## Install$' -f "$SRC/scripts/sh-block.awk" "$SRC/docs/clients.md" |
		sed 's|/path/to/pgqueue/|/home/user/app/|g')
	dashboard=$(grep -E '^npm ci .*--prefix dashboard' "$SRC/docs/operations.md" | sed 's/[ \t]*#.*//')
	in_root runuser -u user -- cp -a "$CHECKOUT" /home/user/app
	timed clients-user in_root runuser -u user -- bash -ec "cd /home/user/app
$clients
$dashboard
venv/bin/python -c 'import pgqueue, psycopg; print(\"python: pgqueue imports\")'
node -e 'import(\"pgqueue\").then(m => console.log(\"node: pgqueue exports\", Object.keys(m).join(\" \")))'
node -e 'require(\"./dashboard/node_modules/pg\"); console.log(\"dashboard: pg installed\")'" < <(yes)
	rc=$?
	check "$(verdict test "$rc" = 0)" "user: the documented install lines of the client libraries and the dashboard work"
	tail -n 3 "$LOGS/clients-user.log"
fi

log "fresh machine: $(($(date +%s) - START)) s"
echo "fresh machine: $passed passed, $failed failed"
[ "$failed" = 0 ]
