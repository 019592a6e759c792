#!/usr/bin/env bash
# Build pgqueue with AddressSanitizer and UndefinedBehaviorSanitizer and run
# the regress, isolation and TAP suites (scripts/test.sh) with the sanitizer
# runtime preloaded into every server they start.  Not part of the default
# suite: it takes about twice as long as those kinds normally do.
#
#   sudo PG_CONFIG=... bash scripts/sanitize.sh                  # regress isolation tap
#   sudo bash scripts/sanitize.sh regress fuzz                   # other kinds
#
# PostgreSQL itself is not built with ASan: the runtime (libasan.so.8 from
# gcc 12) is preloaded (LD_PRELOAD) into the servers and test programs so
# that pgqueue.so, which is instrumented, can run in them (after
# test/memcheck/asan_early.so, which makes it initialize first).  ASan then checks
# every access pgqueue's code makes against malloc'd blocks and the stack,
# and UBSan checks pgqueue's arithmetic, shifts, alignment and NULLs;
# palloc'd chunks inside a memory context block are not redzoned (that
# needs PostgreSQL built with USE_VALGRIND, see scripts/valgrind.sh).
# detect_leaks=0: memory contexts free in bulk, leak reports would be noise.
# Reports go to files (log_path) in a directory printed at the end, read by
# test/memcheck/scan.py: it passes when the suites pass and no report has a
# frame in pgqueue.so; reports entirely inside PostgreSQL (or perl, psql)
# are listed, not failed.  Leaves the ordinary build of pgqueue installed.
set -uo pipefail
# shellcheck source=scripts/as-root.sh
source "$(dirname "$0")/as-root.sh"
as_root "$0" "$@"
cd "$(dirname "$0")/.."
SRC=$(pwd)
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
KINDS=${*:-regress isolation tap}
LIBASAN=$(readlink -f "$(gcc -print-file-name=libasan.so)")
[ -f "$LIBASAN" ] || { echo "libasan not found (apt-get install gcc)"; exit 1; }
LOGDIR=$(mktemp -d "${TEST_DIR_BASE:-/tmp}/pgqueue-sanitize.XXXXXX")
chmod 1777 "$LOGDIR"

# the ASan runtime must initialize before other libraries' constructors
# call into glibc's locale code (test/memcheck/asan_early.c says why)
gcc -shared -fPIC -O2 -o "$LOGDIR/asan_early.so" "$SRC/test/memcheck/asan_early.c" -ldl ||
	{ echo "could not build asan_early.so"; exit 1; }
chmod 755 "$LOGDIR/asan_early.so"

export PG_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -g"
export PG_LDFLAGS="-fsanitize=address,undefined"
# the environment of the test programs and of every server they start
export PGQ_TEST_ENV="LD_PRELOAD=$LOGDIR/asan_early.so:$LIBASAN ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:log_path=$LOGDIR/asan:detect_stack_use_after_return=0:handle_segv=1 UBSAN_OPTIONS=print_stacktrace=1:log_path=$LOGDIR/ubsan"
# positive control: a heap overflow in an instrumented library loaded the
# same way must leave a report that test/memcheck/scan.py finds
mkdir -m 1777 "$LOGDIR/control"
cat >"$LOGDIR/control/pgqueue.c" <<'C'
#include <stdlib.h>
int pgq_control(int i) { volatile char *p = malloc(8); int r = p[i]; free((void *) p); return r; }
C
cat >"$LOGDIR/control/main.c" <<'C'
#include <dlfcn.h>
int main(void) { void *h = dlopen(CONTROL_SO, RTLD_NOW); int (*f)(int) = (int (*)(int)) dlsym(h, "pgq_control"); return h && f ? f(8) : 2; }
C
gcc -shared -fPIC -g $PG_CFLAGS -o "$LOGDIR/control/pgqueue.so" "$LOGDIR/control/pgqueue.c" &&
	gcc -DCONTROL_SO="\"$LOGDIR/control/pgqueue.so\"" -o "$LOGDIR/control/main" "$LOGDIR/control/main.c" -ldl &&
	env LD_PRELOAD="$LOGDIR/asan_early.so:$LIBASAN" \
		ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:log_path=$LOGDIR/control/asan" "$LOGDIR/control/main"
if ! /usr/bin/python3 "$SRC/test/memcheck/scan.py" asan "$LOGDIR/control" >"$LOGDIR/control/scan.out" 2>&1; then
	echo "==> positive control: the planted heap overflow was reported and attributed to pgqueue.so, as it must"
else
	cat "$LOGDIR/control/scan.out"
	echo "sanitize: FAILED (the positive control left no report: the sanitizer setup does not work)"
	exit 1
fi

echo "==> sanitized build ($PG_CFLAGS), kinds: $KINDS, reports in $LOGDIR"
bash scripts/test.sh $KINDS 2>&1 | tee "$LOGDIR/test.out"
rc=${PIPESTATUS[0]}

echo "==> sanitizer reports ($LOGDIR)"
/usr/bin/python3 "$SRC/test/memcheck/scan.py" asan "$LOGDIR" | tee "$LOGDIR/scan.out"
scan_rc=${PIPESTATUS[0]}

# put the ordinary build back (the sanitized library needs the preload)
unset PG_CFLAGS PG_LDFLAGS
tmp=$(mktemp -d "${TEST_DIR_BASE:-/tmp}/pgqueue-build.XXXXXX")
tar -C "$SRC" --exclude=.git --exclude=node_modules --exclude='tmp_check*' -cf - . | tar -C "$tmp" -xf -
(cd "$tmp" && make -s clean && make -s && make -s install) >/dev/null 2>&1 ||
	echo "could not reinstall the ordinary build of pgqueue"
rm -rf "$tmp"

if [ "$rc" = 0 ] && [ "$scan_rc" = 0 ]; then
	echo "sanitize: passed (suites passed, no report in pgqueue's code)"
	exit 0
fi
echo "sanitize: FAILED (suites exit $rc, reports in pgqueue's code: $([ "$scan_rc" = 0 ] && echo no || echo yes))"
exit 1
