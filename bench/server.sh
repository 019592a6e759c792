# Sourced by the small benchmark scripts (archive_ack.sh, push_scheduler.sh):
# a private PostgreSQL server with pgqueue preloaded, in a new directory
# under /tmp (BENCH_TMP), removed with the server when the script exits.
#
#   NAME=archive EXTRA_CONF='synchronous_commit = off' . "$HERE/server.sh"
#
# Reads PG_CONFIG (default Debian's PostgreSQL 15), PORT, NAME (in the
# directory's name) and EXTRA_CONF (lines added to postgresql.conf); sets BIN
# (the server's bindir) and DIR, defines as_pg and psql; makes database
# bench with the extension created.

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
BIN=$("$PG_CONFIG" --bindir)
DIR=$(mktemp -d "${BENCH_TMP:-/tmp}/pgq-$NAME-bench.XXXXXX")
chmod 755 "$DIR"
chown postgres: "$DIR"
as_pg() { (cd / && runuser -u postgres -- "$@"); }
stop() {
	as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap stop EXIT

as_pg "$BIN/initdb" -D "$DIR/data" -A trust >/dev/null
cat >>"$DIR/data/postgresql.conf" <<CONF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DIR'
shared_buffers = 256MB
shared_preload_libraries = 'pgqueue'
pgqueue.database = 'bench'
${EXTRA_CONF:-}
CONF
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
psql() { as_pg "$BIN/psql" -h "$DIR" -p "$PORT" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -d postgres -c 'CREATE DATABASE bench'
psql -d bench -c 'CREATE EXTENSION pgqueue'
