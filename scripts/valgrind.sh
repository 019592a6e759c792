#!/usr/bin/env bash
# Run the pg_regress suite with every server process under valgrind's
# memcheck, and report what it finds in pgqueue's code.  Not part of the
# default suite (about 10 to 20 times slower than the regress kind).
#
#   sudo PG_CONFIG=... VALGRIND_SUPP=/path/to/valgrind.supp bash scripts/valgrind.sh
#
# VALGRIND_SUPP: PostgreSQL's src/tools/valgrind.supp (PostgreSQL's source
# tree; Debian's packages do not ship it).  How: pg_regress starts the
# temporary server as <bindir>/postgres; this script passes a bindir of
# symlinks to the installation's programs where postgres is a script that
# runs the real one under valgrind (--trace-children=yes, one log file per
# process).  Debian's PostgreSQL is not built with USE_VALGRIND: memory
# contexts do not tell memcheck about palloc chunks, so errors inside a
# context's blocks go unseen, and postgres itself reports a few things its
# suppressions do not cover (listed as "not ours").  It passes when the
# suite passes and no report has a frame in pgqueue.so
# (test/memcheck/scan.py).  --error-exitcode is left at 0 for the server:
# a backend that exits non-zero is a crash to the postmaster, and the noise
# of postgres itself would then fail every test; the reports are read from
# the log files instead.
set -uo pipefail
# shellcheck source=scripts/as-root.sh
source "$(dirname "$0")/as-root.sh"
as_root "$0" "$@"
cd "$(dirname "$0")/.."
SRC=$(pwd)
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
BIN=$("$PG_CONFIG" --bindir)
DIR=$(mktemp -d "${TEST_DIR_BASE:-/tmp}/pgqueue-valgrind.XXXXXX")
chmod 755 "$DIR"
mkdir -m 1777 "$DIR/logs"
mkdir "$DIR/bin"
for f in "$BIN"/*; do ln -s "$f" "$DIR/bin/$(basename "$f")"; done
rm "$DIR/bin/postgres"
supp=()
if [ -n "${VALGRIND_SUPP:-}" ] && [ -f "$VALGRIND_SUPP" ]; then
	supp=(--suppressions="$VALGRIND_SUPP")
else
	echo "==> no VALGRIND_SUPP: running without PostgreSQL's suppressions (more reports outside pgqueue)"
fi
cat >"$DIR/bin/postgres" <<W
#!/bin/sh
exec valgrind --quiet --trace-children=yes --leak-check=no --num-callers=40 \\
	--error-limit=no --read-inline-info=yes ${supp[*]} --error-exitcode=0 \\
	--log-file=$DIR/logs/vg.%p.log "$BIN/postgres" "\$@"
W
chmod 755 "$DIR/bin/postgres"
chown -R postgres: "$DIR/bin"
echo "==> pg_regress under valgrind memcheck, logs in $DIR/logs"
# slow start and slow statements: give pg_regress and the tests time
PGQ_TEST_ENV="PGCTLTIMEOUT=600" PGQ_INSTALLCHECK_ARGS="bindir=$DIR/bin" \
	bash scripts/test.sh regress 2>&1 | tee "$DIR/test.out"
rc=${PIPESTATUS[0]}
echo "==> valgrind reports ($DIR/logs)"
/usr/bin/python3 "$SRC/test/memcheck/scan.py" valgrind "$DIR/logs" | tee "$DIR/scan.out"
scan_rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && [ "$scan_rc" = 0 ]; then
	echo "valgrind: passed (suite passed, no report in pgqueue's code)"
	exit 0
fi
echo "valgrind: FAILED (suite exit $rc, reports in pgqueue's code: $([ "$scan_rc" = 0 ] && echo no || echo yes))"
exit 1
