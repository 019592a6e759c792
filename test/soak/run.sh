#!/usr/bin/env bash
# The soak with faults: a private server with pgqueue preloaded,
# soak.py's producers, consumers, fault injector and sampler for
# SOAK_SECONDS, then checker.py over the history.  Installs nothing: it uses
# the extension installed for PG_CONFIG.  Ends with
# "soak: N passed, N failed".
#
# The ring mode (argument "ring" or SOAK_MODE=ring): the same on a
# server whose rings of slots turn fast (pgqueue.slot_size = 64 kB,
# pgqueue.naptime = 50 ms), with ring.py's workers besides: filtered
# blocking claims, calls in multi-statement and REPEATABLE READ
# transactions, snapshot readers, pg_dump in a loop, a restore into a
# second database (soak_restore, named in pgqueue.database) and a streaming
# hot standby (pg_basebackup, hot_standby_feedback = on, on the next free
# port) with readers.  The server logs at DEBUG1 (the scheduler's moves and
# drops of slots are counted from the log).
#
#   bash test/soak/run.sh                       # 180 s (as root or postgres)
#   bash test/soak/run.sh ring                  # the ring mode, 180 s
#   SOAK_SECONDS=3600 SOAK_DIR=/var/tmp/soak1 bash test/soak/run.sh
#
# Environment:
#   SOAK_MODE      faults (default) or ring (an argument wins)
#   SOAK_SECONDS   length of the faulty phase (default 180); a drain follows
#   SOAK_DIR       where the server's data, its log and history.jsonl go
#                  (default: a new directory under ${TMPDIR:-/tmp}); kept
#   SOAK_PORTS     FROM-TO, the first free port is used (default 5650-5699)
#   SOAK_SEED      random seed (default: the time); printed
#   SOAK_ARGS      more arguments for soak.py (--consumers 5 --producers 3
#                  --fault-interval 6 ...)
#   SOAK_CONF      more lines for postgresql.conf (pgqueue.batch_size = 5)
#   SOAK_SELFTEST  0: do not run selftest.py (the checker against violations
#                  made in copies of the history) after a run that passed
#   PG_CONFIG      the installation to use (default pg_config on PATH)
#
# Replay the checker on a history: /usr/bin/python3 test/soak/checker.py FILE
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" = 0 ]; then
	# initdb refuses root: run as postgres (a directory postgres can read)
	: "${SOAK_DIR:=$(mktemp -d "${TMPDIR:-/tmp}/pgqueue-soak.XXXXXX")}"
	mkdir -p "$SOAK_DIR"
	chown postgres: "$SOAK_DIR"
	chmod 755 "$SOAK_DIR"
	exec runuser -u postgres -- env SOAK_DIR="$SOAK_DIR" SOAK_SECONDS="${SOAK_SECONDS:-}" SOAK_MODE="${SOAK_MODE:-}" \
		SOAK_PORTS="${SOAK_PORTS:-}" SOAK_SEED="${SOAK_SEED:-}" SOAK_ARGS="${SOAK_ARGS:-}" \
		SOAK_CONF="${SOAK_CONF:-}" SOAK_SELFTEST="${SOAK_SELFTEST:-}" PG_CONFIG="${PG_CONFIG:-pg_config}" PATH="$PATH" bash "$HERE/run.sh" "$@"
fi

MODE=${1:-${SOAK_MODE:-faults}}
[ -n "$MODE" ] || MODE=faults
case $MODE in
faults | ring) ;;
*) echo "soak: unknown mode $MODE (faults or ring)"; echo "soak: 0 passed, 1 failed"; exit 2 ;;
esac
SECONDS_RUN=${SOAK_SECONDS:-180}
[ -n "$SECONDS_RUN" ] || SECONDS_RUN=180
PG_CONFIG=${PG_CONFIG:-pg_config}
BIN=$("$PG_CONFIG" --bindir) || { echo "soak: no pg_config"; echo "soak: 0 passed, 1 failed"; exit 1; }
PY=/usr/bin/python3
$PY -c 'import psycopg' 2>/dev/null || {
	echo "soak: /usr/bin/python3 has no psycopg (apt-get install python3-psycopg)"
	echo "soak: 0 passed, 1 failed"
	exit 1
}
DIR=${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/pgqueue-soak.XXXXXX")}
[ -n "$DIR" ] || DIR=$(mktemp -d "${TMPDIR:-/tmp}/pgqueue-soak.XXXXXX")
mkdir -p "$DIR"
SEED=${SOAK_SEED:-$(date +%s)}
[ -n "$SEED" ] || SEED=$(date +%s)
RANGE=${SOAK_PORTS:-5650-5699}
[ -n "$RANGE" ] || RANGE=5650-5699

# the first port of the range from $1 on that nothing listens on (TCP or a
# socket file)
free_port() {
	local p
	for p in $(seq "$1" "${RANGE#*-}"); do
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && [ ! -e "/tmp/.s.PGSQL.$p" ] &&
			[ ! -e "$DIR/.s.PGSQL.$p" ]; then
			echo "$p"
			return
		fi
	done
}
PORT=$(free_port "${RANGE%-*}")
[ -n "$PORT" ] || { echo "soak: no free port in $RANGE"; echo "soak: 0 passed, 1 failed"; exit 1; }

DATA=$DIR/data
LOG=$DIR/server.log
HIST=$DIR/history.jsonl
STANDBY=$DIR/standby
rm -rf "$DATA" "$HIST" "$LOG" "$STANDBY" "$DIR/standby.log" "$DIR/dumps"
"$BIN/initdb" -D "$DATA" -A trust -U postgres --no-sync >"$DIR/initdb.log" 2>&1 ||
	{ cat "$DIR/initdb.log"; echo "soak: 0 passed, 1 failed"; exit 1; }
cat >>"$DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = ''
unix_socket_directories = '$DIR'
shared_preload_libraries = 'pgqueue'
pgqueue.database = 'soak'
pgqueue.naptime = '250ms'
restart_after_crash = on
max_connections = 40
shared_buffers = 32MB
# only processes are killed here, never the machine: the kernel keeps what
# was written, so fsync would only load the shared disk
fsync = off
autovacuum_naptime = 10s
log_line_prefix = '%m [%p] %b '
EOF
if [ "$MODE" = ring ]; then
	cat >>"$DATA/postgresql.conf" <<EOF
# the ring mode: rings that turn within a few dozen pushes, and a second
# database (a restore's) with a scheduler of its own
pgqueue.slot_size = 64
pgqueue.naptime = '50ms'
pgqueue.database = 'soak,soak_restore'
max_connections = 80
# the scheduler's moves and drops of slots are counted from its DEBUG1
# lines; who logged what (pg_dump's errors are the dump check's)
log_min_messages = debug1
log_line_prefix = '%m [%p] %b db=%d app=%a state=%e '
wal_level = replica
max_wal_senders = 4
EOF
fi
# more settings, one per line (e.g. SOAK_CONF="pgqueue.batch_size = 5")
[ -n "${SOAK_CONF:-}" ] && printf '%s\n' "$SOAK_CONF" >>"$DATA/postgresql.conf"
stop_server() {
	"$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1
	[ -d "$STANDBY" ] && "$BIN/pg_ctl" -D "$STANDBY" -m immediate -w stop >/dev/null 2>&1
	return 0
}
trap stop_server EXIT
"$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w start >/dev/null ||
	{ tail -n 30 "$LOG"; echo "soak: 0 passed, 1 failed"; exit 1; }
"$BIN/createdb" -h "$DIR" -p "$PORT" soak || { echo "soak: 0 passed, 1 failed"; exit 1; }

RING_ARGS=()
SPORT=
if [ "$MODE" = ring ]; then
	# the restore's database: empty until the restore, its scheduler
	# waiting for the extension
	"$BIN/createdb" -h "$DIR" -p "$PORT" soak_restore || { echo "soak: 0 passed, 1 failed"; exit 1; }
	# a streaming hot standby on the next free port
	SPORT=$(free_port $((PORT + 1)))
	[ -n "$SPORT" ] || { echo "soak: no second free port in $RANGE"; echo "soak: 0 passed, 1 failed"; exit 1; }
	# with a replication slot: a standby that falls behind under load keeps
	# its WAL (without one the primary removed segments it still needed),
	# and its feedback xmin is the slot's (what the rings' truncation reads)
	"$BIN/pg_basebackup" -h "$DIR" -p "$PORT" -U postgres -D "$STANDBY" -R -X stream -c fast \
		-C -S soak_standby \
		>"$DIR/basebackup.log" 2>&1 || { cat "$DIR/basebackup.log"; echo "soak: 0 passed, 1 failed"; exit 1; }
	cat >>"$STANDBY/postgresql.conf" <<EOF
port = $SPORT
hot_standby = on
hot_standby_feedback = on
log_min_messages = warning
EOF
	"$BIN/pg_ctl" -D "$STANDBY" -l "$DIR/standby.log" -w start >/dev/null ||
		{ tail -n 30 "$DIR/standby.log"; echo "soak: 0 passed, 1 failed"; exit 1; }
	RING_ARGS=(--mode ring --naptime 0.05 --standby-dsn "host=$DIR port=$SPORT dbname=soak user=postgres"
		--standby-log "$DIR/standby.log" --dump-dir "$DIR/dumps"
		--restore-dsn "host=$DIR port=$PORT dbname=soak_restore user=postgres")
fi

echo "soak: $MODE mode, ${SECONDS_RUN}s, seed $SEED, port $PORT${SPORT:+ (standby $SPORT)}, history $HIST"
# shellcheck disable=SC2086
$PY "$HERE/soak.py" --dsn "host=$DIR port=$PORT dbname=soak user=postgres" \
	--datadir "$DATA" --pgbin "$BIN" --logfile "$LOG" --history "$HIST" \
	--seconds "$SECONDS_RUN" --seed "$SEED" "${RING_ARGS[@]}" ${SOAK_ARGS:-}
rc=$?
stop_server
trap - EXIT
[ "$rc" = 0 ] || echo "soak: soak.py exited with $rc"
$PY "$HERE/checker.py" "$HIST"
crc=$?
# and does the checker catch violations?  made one by one in copies of a
# history that passed (selftest.py); counted with the checks
if [ "$crc" = 0 ] && [ "${SOAK_SELFTEST:-1}" = 1 ]; then
	$PY "$HERE/selftest.py" "$HIST" || crc=1
fi
echo "soak: history $HIST (replay: $PY $HERE/checker.py $HIST)"
if [ "$rc" != 0 ]; then
	echo "soak: 0 passed, 1 failed"
	exit 1
fi
exit $crc
