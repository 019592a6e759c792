#!/usr/bin/env bash
# What pg_stat_user_tables says of pgqueue's slots against what they hold:
# the steady load of bench/run.sh (a) (2 pgbench clients push one job per
# call, 4 claim and ack one per call), while another session holds a
# REPEATABLE READ snapshot (as in (f)); at the end of the hold, each
# partition's state in pgqueue.slots, n_live_tup, n_dead_tup and n_tup_del,
# and the dead and live row versions pgstattuple counts in its heap, with
# the sums.
#
#   sudo bash bench/slot_stats.sh                 # 40 s of load, 25 s hold
#   LOAD_SECONDS=60 HOLD_SECONDS=45 sudo -E bash bench/slot_stats.sh
#
# Needs the extension installed for PG_CONFIG (make install); uses port
# 5522 (PORT) and a directory under /tmp, both removed at the end.
set -euo pipefail

PORT=${PORT:-5522}
LOAD=${LOAD_SECONDS:-40}
HOLD=${HOLD_SECONDS:-25}
HERE=$(cd "$(dirname "$0")" && pwd)
(( HOLD + 10 <= LOAD )) || { echo "slot_stats.sh: LOAD_SECONDS must be HOLD_SECONDS + 10 or more" >&2; exit 2; }

NAME=stats
EXTRA_CONF='max_wal_size = 4GB'
. "$HERE/server.sh"
psql -d bench -c 'CREATE EXTENSION pgstattuple'
cp "$HERE/sql/sys4_produce.sql" "$HERE/sql/sys4_consume.sql" "$DIR/"
chown postgres: "$DIR"/*.sql

pgbench() { as_pg "$BIN/pgbench" -h "$DIR" -p "$PORT" -n -M prepared "$@" bench >/dev/null 2>&1; }
pgbench -c 2 -j 2 -T "$LOAD" -f "$DIR/sys4_produce.sql" &
pgbench -c 4 -j 4 -T "$LOAD" -f "$DIR/sys4_consume.sql" &
sleep 5
# the holder: its snapshot taken, then held; the tables read one second
# before it ends
psql -d bench -c 'BEGIN ISOLATION LEVEL REPEATABLE READ' -c 'SELECT 1 FROM pg_class LIMIT 1' \
	-c "SELECT pg_sleep($HOLD)" -c 'COMMIT' >/dev/null &
sleep $(( HOLD - 1 ))
psql -d bench -c "
WITH p AS (
  SELECT c.relname, coalesce(s.state, '-') AS state, t.n_live_tup, t.n_dead_tup, t.n_tup_del,
         (pgstattuple(c.oid)).dead_tuple_count AS dead_exact,
         (pgstattuple(c.oid)).tuple_count AS live_exact
    FROM pg_stat_user_tables t
    JOIN pg_class c ON c.oid = t.relid
    LEFT JOIN pgqueue.slots s ON c.relname = s.tbl || '_' || s.slot
   WHERE t.schemaname = 'pgqueue' AND c.relkind = 'r'
     AND (c.relname LIKE 'queue\_%' OR c.relname LIKE 'work\_queue\_%'))
SELECT * FROM (
  SELECT * FROM p
  UNION ALL
  SELECT 'all', '', sum(n_live_tup), sum(n_dead_tup), sum(n_tup_del), sum(dead_exact), sum(live_exact)
    FROM p) x
ORDER BY relname = 'all', relname"
wait
