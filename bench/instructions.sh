#!/usr/bin/env bash
# Instructions per job of two builds of pgqueue, counted by valgrind
# (callgrind) in a single-user backend (postgres --single): a count that a
# loaded machine does not move, for changes too small for ab.sh's timed
# runs to see beside other work (a budget of 3 % on a shared 2-core
# machine whose control spreads 20-60 %).
#
#   sudo PG_CONFIG_A=/root-a/usr/lib/postgresql/15/bin/pg_config \
#        PG_CONFIG_B=/root-b/usr/lib/postgresql/15/bin/pg_config bash bench/instructions.sh
#
# Each PG_CONFIG is an installation with its build of pgqueue installed
# (make install PG_CONFIG=...; a relocated copy of Debian's PostgreSQL 15
# serves, as ab.sh makes them).  For each build: initdb, CREATE EXTENSION
# pgqueue; then a round is ROUNDS_SHORT (3) and ROUNDS_LONG (10)
# repetitions of the workload in one backend each, A and B alternating
# (A B, then B A), PAIRS (2) times.  The workload: 100 jobs pushed in one
# pgq_push_batch, 100 by single pgq_push calls, two pgq_schedule(100)
# passes, and 200 claimed (100 a claim) and acked one pgq_ack each: jobs
# without parents, children or group.  Instructions per job = (long -
# short) / (200 x (ROUNDS_LONG - ROUNDS_SHORT)), which leaves out the
# backend's start, the first calls' plans and the end; B / A per pair.
# Writes nothing but its directory under /tmp (removed) and prints a
# markdown table.
set -euo pipefail

: "${PG_CONFIG_A:?set PG_CONFIG_A}" "${PG_CONFIG_B:?set PG_CONFIG_B}"
ROUNDS_SHORT=${ROUNDS_SHORT:-3}
ROUNDS_LONG=${ROUNDS_LONG:-10}
PAIRS=${PAIRS:-2}
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }

DIR=$(mktemp -d /tmp/pgq-instructions.XXXXXX)
chmod 755 "$DIR"
trap 'rm -rf "$DIR"' EXIT
as_pg() { (cd / && runuser -u postgres -- "$@"); }

cat >"$DIR/work.sql" <<'SQL'
SELECT count(*) FROM pgq_push_batch('q', array_fill('{}'::jsonb, ARRAY[100]));
SELECT count(pgq_push('q', '{}')) FROM generate_series(1, 100);
SELECT pgq_schedule(100);
SELECT pgq_schedule(100);
SELECT count(pgq_ack(id, 'w')) FROM pgq_claim('w', 100, '1 minute');
SELECT count(pgq_ack(id, 'w')) FROM pgq_claim('w', 100, '1 minute');
SQL
for n in "$ROUNDS_SHORT" "$ROUNDS_LONG"; do
	for _ in $(seq 1 "$n"); do cat "$DIR/work.sql"; done >"$DIR/work$n.sql"
done
chown -R postgres: "$DIR"

for b in A B; do
	pgc=PG_CONFIG_$b
	bin=$("${!pgc}" --bindir)
	as_pg "$bin/initdb" -D "$DIR/$b" -A trust >/dev/null
	printf "shared_preload_libraries = 'pgqueue'\npgqueue.database = 'postgres'\n" >>"$DIR/$b/postgresql.conf"
	echo "CREATE EXTENSION pgqueue;" | as_pg "$bin/postgres" --single -D "$DIR/$b" postgres >/dev/null
done

# instructions of one backend running workN.sql on build b
count() {
	local b=$1 n=$2 pgc bin
	pgc=PG_CONFIG_$b
	bin=$("${!pgc}" --bindir)
	as_pg valgrind --tool=callgrind --callgrind-out-file=/dev/null \
		"$bin/postgres" --single -D "$DIR/$b" postgres <"$DIR/work$n.sql" 2>&1 |
		awk '/Collected/ { print $NF }'
}

jobs=$((200 * (ROUNDS_LONG - ROUNDS_SHORT)))
echo "| pair | A instructions per job | B instructions per job | B / A |"
echo "|---|---|---|---|"
for p in $(seq 1 "$PAIRS"); do
	order="A B"
	[ $((p % 2)) = 0 ] && order="B A"
	declare -A per=()
	for b in $order; do
		s=$(count "$b" "$ROUNDS_SHORT")
		l=$(count "$b" "$ROUNDS_LONG")
		per[$b]=$(((l - s) / jobs))
	done
	echo "| $p | ${per[A]} | ${per[B]} | $(awk -v a="${per[A]}" -v b="${per[B]}" 'BEGIN { printf "%.4f", b / a }') |"
done
echo
echo "A: $("$PG_CONFIG_A" --pkglibdir)/pgqueue.so md5 $(md5sum "$("$PG_CONFIG_A" --pkglibdir)/pgqueue.so" | cut -c1-12);" \
	"B: $("$PG_CONFIG_B" --pkglibdir)/pgqueue.so md5 $(md5sum "$("$PG_CONFIG_B" --pkglibdir)/pgqueue.so" | cut -c1-12);" \
	"$ROUNDS_SHORT and $ROUNDS_LONG rounds of 200 jobs, $PAIRS pairs; $(valgrind --version)."
