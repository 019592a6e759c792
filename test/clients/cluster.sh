# shellcheck shell=bash
# Helpers to run a private PostgreSQL with pgqueue preloaded, and PgBouncer
# in front of it, for test/clients/run.sh and bench/clients.sh.  Source it,
# then:
#
#   cluster_init WORKDIR        # initdb + start; sets PGQ_PORT, PGQ_SOCK, ...
#   bouncer_start               # PgBouncer (transaction pooling); sets PGQ_BOUNCER_PORT
#   cluster_stop                # stops both (call it from an EXIT trap)
#
# Everything runs as the postgres user (initdb and postgres refuse root) in
# WORKDIR, which must be writable by postgres.  Ports are picked among the
# free ones of PGQ_PORTS (default 5600-5649).  PG_CONFIG picks the server.

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PGQ_BIN=$("$PG_CONFIG" --bindir)
PGQ_DB=pgq_test
PGQ_PORT=
PGQ_BOUNCER_PORT=
PGQ_TAKEN_PORTS=" "

as_pg() { runuser -u postgres -- "$@"; }

# A TCP port of PGQ_PORTS that nothing listens on and this run has not taken.
free_port() {
	local range=${PGQ_PORTS:-5600-5649} p
	for ((p = ${range%-*}; p <= ${range#*-}; p++)); do
		[[ $PGQ_TAKEN_PORTS == *" $p "* ]] && continue
		[ -e "/tmp/.s.PGSQL.$p" ] && continue
		if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then
			PGQ_TAKEN_PORTS+="$p "
			echo "$p"
			return 0
		fi
	done
	echo "no free port in $range (set PGQ_PORTS=FROM-TO)" >&2
	return 1
}

# Superuser psql on the test database (or another: psql_admin -d postgres ...).
psql_admin() {
	as_pg "$PGQ_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PGQ_SOCK" -p "$PGQ_PORT" -U postgres "$@"
}

# initdb a cluster in $1/data, start it with pgqueue preloaded (scheduler on
# database pgq_test, short naptime), create the database, the extension and
# three login roles: app (producer + consumer), ops (admin), prometheus (admin).
cluster_init() {
	PGQ_WORK=$1
	PGQ_SOCK=$PGQ_WORK/sock
	PGQ_DATA=$PGQ_WORK/data
	mkdir -p "$PGQ_SOCK" && chown postgres: "$PGQ_WORK" "$PGQ_SOCK"
	PGQ_PORT=$(free_port) || return 1
	as_pg "$PGQ_BIN/initdb" -D "$PGQ_DATA" -A trust -U postgres --no-sync >"$PGQ_WORK/initdb.log" 2>&1 ||
		{ cat "$PGQ_WORK/initdb.log"; return 1; }
	cat >>"$PGQ_DATA/postgresql.conf" <<CONF
port = $PGQ_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGQ_SOCK'
shared_preload_libraries = 'pgqueue'
pgqueue.database = '$PGQ_DB'
pgqueue.naptime = '20ms'
max_connections = 150
fsync = off
${PGQ_EXTRA_CONF:-}
CONF
	cluster_start || return 1
	psql_admin -d postgres -c "CREATE DATABASE $PGQ_DB" || return 1
	psql_admin -d "$PGQ_DB" <<'SQL' || return 1
CREATE EXTENSION pgqueue;
CREATE ROLE app LOGIN IN ROLE pgqueue_producer, pgqueue_consumer;
CREATE ROLE ops LOGIN IN ROLE pgqueue_admin;
CREATE ROLE prometheus LOGIN IN ROLE pgqueue_admin;
SQL
	export PGQ_PORT PGQ_SOCK PGQ_DATA PGQ_BIN PGQ_DB
}

cluster_start() {
	as_pg "$PGQ_BIN/pg_ctl" -D "$PGQ_DATA" -l "$PGQ_WORK/server.log" -w -t 60 start >/dev/null ||
		{ tail -n 30 "$PGQ_WORK/server.log"; return 1; }
}

# PgBouncer in transaction pooling in front of the cluster, on 127.0.0.1.
bouncer_start() {
	PGQ_BOUNCER_PORT=$(free_port) || return 1
	cat >"$PGQ_WORK/pgbouncer.ini" <<INI
[databases]
$PGQ_DB = host=$PGQ_SOCK port=$PGQ_PORT dbname=$PGQ_DB

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGQ_BOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGQ_WORK/userlist.txt
pool_mode = transaction
max_client_conn = 300
default_pool_size = 40
server_login_retry = 1
logfile = $PGQ_WORK/pgbouncer.log
pidfile = $PGQ_WORK/pgbouncer.pid
INI
	printf '"app" ""\n"ops" ""\n"postgres" ""\n' >"$PGQ_WORK/userlist.txt"
	chown postgres: "$PGQ_WORK/pgbouncer.ini" "$PGQ_WORK/userlist.txt"
	as_pg pgbouncer -d "$PGQ_WORK/pgbouncer.ini" || { tail "$PGQ_WORK/pgbouncer.log"; return 1; }
	local i
	for i in $(seq 1 50); do
		[ -n "$(ss -Htln "sport = :$PGQ_BOUNCER_PORT")" ] && break
		sleep 0.1
	done
	export PGQ_BOUNCER_PORT
}

# Stop PgBouncer and the cluster (each only if this run started it).
cluster_stop() {
	if [ -f "${PGQ_WORK:-}/pgbouncer.pid" ]; then
		kill "$(cat "$PGQ_WORK/pgbouncer.pid")" 2>/dev/null
		rm -f "$PGQ_WORK/pgbouncer.pid"
	fi
	if [ -n "${PGQ_DATA:-}" ] && [ -f "$PGQ_DATA/postmaster.pid" ]; then
		as_pg "$PGQ_BIN/pg_ctl" -D "$PGQ_DATA" -m immediate -w stop >/dev/null 2>&1
	fi
}
