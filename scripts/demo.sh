#!/usr/bin/env bash
# Set up pgqueue for real on this machine and show jobs flowing.
#
#   bash scripts/demo.sh          # install, build, start, demo
#   bash scripts/demo.sh stop     # stop the demo server
#
# Runs as root; another user's run goes through sudo (scripts/as-root.sh).
# Installs the Debian 12 packages it needs, builds the extension in a
# scratch copy of the tree (the checkout gets no build files) and installs
# it, starts a PostgreSQL 15 server of its own (port 5499, data in
# /var/lib/postgresql/pgqueue-demo; PGQ_DEMO_PORT, PGQ_DEMO_DATA to change)
# with the pgqueue scheduler preloaded, creates database pgqueue_demo, then
# pushes jobs into three queues while two workers claim, work and ack them,
# printing progress.  The server is left running; the last lines say how to
# connect and how to stop it.
set -euo pipefail

# shellcheck source=as-root.sh
source "$(dirname "$0")/as-root.sh"
as_root "$0" "$@"
cd "$(dirname "$0")/.."
SRC=$(pwd)

PORT=${PGQ_DEMO_PORT:-5499}
DATA=${PGQ_DEMO_DATA:-/var/lib/postgresql/pgqueue-demo}
SOCK=/var/run/postgresql
DB=pgqueue_demo
BIN=/usr/lib/postgresql/15/bin
JOBS=${PGQ_DEMO_JOBS:-3000}
export DEBIAN_FRONTEND=noninteractive

log() { printf '\n==> %s\n' "$*"; }
# from / : the checkout may be under a directory postgres cannot enter (/root)
as_pg() { (cd / && runuser -u postgres -- "$@"); }
psql_demo() { as_pg "$BIN/psql" -h "$SOCK" -p "$PORT" -X -q -v ON_ERROR_STOP=1 "$@"; }

if [ "${1:-}" = stop ]; then
	# stopped already (or never started) is not an error
	if id postgres >/dev/null 2>&1 && [ -x "$BIN/pg_ctl" ] &&
		as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
		as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
		echo "the demo server (port $PORT, data in $DATA) is stopped"
	else
		echo "the demo server (port $PORT, data in $DATA) is stopped (it was not running)"
	fi
	exit 0
fi

# the build tree, apt's output and the workers' logs
TMP=$(mktemp -d /tmp/pgqueue-demo.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

need=()
command -v make >/dev/null && command -v gcc >/dev/null || need+=(build-essential)
[ -x "$BIN/postgres" ] || need+=(postgresql-15)
[ -f /usr/include/postgresql/15/server/postgres.h ] || need+=(postgresql-server-dev-15)
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]} (apt-get)"
	{ apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >"$TMP/apt.log" 2>&1 ||
		{ cat "$TMP/apt.log"; echo "apt-get install ${need[*]} failed"; exit 1; }
	echo "ok"
fi

log "building and installing pgqueue"
# in a copy: a build as root in the checkout would leave root-owned objects
# there that the owner's next make could not overwrite
mkdir "$TMP/tree"
tar -C "$SRC" --exclude=.git --exclude=node_modules --exclude='tmp_check*' --exclude=results \
	--exclude=output_iso --exclude=output_compat -cf - . | tar -C "$TMP/tree" -xf -
(cd "$TMP/tree" && make -s PG_CONFIG="$BIN/pg_config" clean &&
	make -s PG_CONFIG="$BIN/pg_config" && make -s PG_CONFIG="$BIN/pg_config" install)
echo "installed into $("$BIN/pg_config" --pkglibdir)"

log "starting a PostgreSQL server on port $PORT with the pgqueue scheduler"
mkdir -p "$SOCK" && chown postgres: "$SOCK"
if [ ! -f "$DATA/PG_VERSION" ]; then
	mkdir -p "$DATA" && chown postgres: "$DATA" && chmod 700 "$DATA"
	as_pg "$BIN/initdb" -D "$DATA" -A peer -U postgres >/dev/null
	cat >>"$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$SOCK'
shared_preload_libraries = 'pgqueue'
pgqueue.database = '$DB'
CONF
fi
if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
	as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w start >/dev/null
else
	as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w restart >/dev/null
fi
psql_demo -d postgres -tc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 ||
	psql_demo -d postgres -c "CREATE DATABASE $DB"
# a new extension in each run (its tables from a former run's library are dropped)
psql_demo -d "$DB" -c "SET client_min_messages = warning" \
	-c "DROP EXTENSION IF EXISTS pgqueue" -c "CREATE EXTENSION pgqueue"
# settings for every queue, so that pgq_stats() lists all three at the end
psql_demo -d "$DB" -c "SELECT pgq_configure('emails', weight => 2)" \
	-c "SELECT pgq_configure('thumbnails', weight => 1)" \
	-c "SELECT pgq_configure('reports', max_in_flight => 2)" >/dev/null
echo "server up; scheduler:"
sleep 2
psql_demo -d "$DB" -c "SELECT pid, backend_type, datname FROM pg_stat_activity WHERE backend_type = 'pgqueue scheduler'"

log "pushing $JOBS jobs into emails, thumbnails and reports while two workers claim and ack them"
# A worker: claim (blocking up to 2 s), do the work in its own transaction,
# ack; stop after 3 empty claims.
worker_sql() {
	cat <<SQL
DO \$\$
DECLARE
	j record;
	idle int := 0;
	done int := 0;
BEGIN
	LOOP
		SELECT * INTO j FROM pgq_claim('demo-worker-$1', 1, '30 seconds', NULL, '2 seconds');
		COMMIT;
		IF j.id IS NULL THEN
			idle := idle + 1;
			EXIT WHEN idle >= 3;
			CONTINUE;
		END IF;
		idle := 0;
		PERFORM pg_sleep(0.001);          -- the "work"
		PERFORM pgq_ack(j.id, 'demo-worker-$1');
		COMMIT;
		done := done + 1;
	END LOOP;
	RAISE NOTICE 'worker $1 acked % jobs', done;
END
\$\$;
SQL
}
for w in 1 2; do
	worker_sql "$w" | psql_demo -d "$DB" >"$TMP/worker-$w.log" 2>&1 &
done
psql_demo -d "$DB" <<SQL &
DO \$\$
BEGIN
	FOR i IN 1..$JOBS LOOP
		PERFORM pgq_push(CASE i % 3 WHEN 0 THEN 'emails' WHEN 1 THEN 'thumbnails' ELSE 'reports' END,
		                 jsonb_build_object('n', i), priority => i % 2);
		IF i % 50 = 0 THEN COMMIT; PERFORM pg_sleep(0.01); END IF;
	END LOOP;
	COMMIT;
END
\$\$;
SQL
producer=$!

for _ in $(seq 1 120); do
	sleep 1
	# looked at before the line is printed: the last line shows every job done
	finished=no
	if ! kill -0 "$producer" 2>/dev/null &&
		[ "$(psql_demo -d "$DB" -At -c "SELECT count(*) FROM pgqueue.queue")" = 0 ]; then
		finished=yes
	fi
	psql_demo -d "$DB" -At -F ' ' -c \
		"SELECT format('pushed %s  scheduled %s  claimed %s  acked %s  | waiting %s  in flight %s',
		               c.pushed, c.scheduled, c.claimed, c.acked,
		               (SELECT coalesce(sum(pending + retry + scheduled), 0) FROM pgq_stats()),
		               (SELECT coalesce(sum(in_flight), 0) FROM pgq_stats()))
		   FROM pgq_counters() c"
	[ "$finished" = yes ] && break
done
wait
cat "$TMP"/worker-*.log | grep -o 'worker .*' || true

log "per-queue view (pgq_stats) and counters since server start (pgq_counters)"
psql_demo -d "$DB" -c "SELECT * FROM pgq_stats()" -c "SELECT * FROM pgq_counters()"

# root's own run has no sudo to suggest (a fresh Debian has none)
as_postgres="runuser -u postgres --"
[ -n "${SUDO_USER:-}" ] && as_postgres="sudo -u postgres"
cat <<MSG

pgqueue is running.
  connect:  $as_postgres psql -h $SOCK -p $PORT $DB
  try:      SELECT pgq_push('emails', '{"to": "you@example.com"}');
            SELECT * FROM pgq_claim('me', wait => '5 seconds');
  log:      $DATA/server.log
  stop:     bash scripts/demo.sh stop
MSG
