#!/usr/bin/python3
"""Classify every line of a server log written with
log_line_prefix = '%m [%p] %b %d %e ' (test/fuzz/run.sh) and fail on
anything that is not an ordinary error.

Fails on:
  - a crash: "terminated by signal", "server process ... was terminated",
    "all server processes terminated; reinitializing", "database system was
    interrupted", "not properly shut down", PANIC, TRAP: (an assertion);
  - an internal error: SQLSTATE class XX (XX000 elog, XX001 data corrupted,
    XX002 index corrupted) at any level, with one exception: an XX000
    ERROR in sqlsmith's database whose LOCATION (log_error_verbosity =
    verbose) names PostgreSQL's code, not pgqueue's, and that either is
    one of the reviewed messages in PG_INTERNAL or comes from a statement
    that touches nothing of pgqueue's (no pgq_ function, no fz_ wrapper or
    view, no pgqueue schema): sqlsmith, a superuser, reaches PostgreSQL's
    own elog()s with arguments no one else would.  An unreviewed one is
    printed as "REVIEW" (to add to PG_INTERNAL) without failing the run;
  - a process that exited with a non-zero code, except a pgqueue scheduler
    that a FATAL 57P01 (pg_terminate_backend, which sqlsmith may call) or
    a SIGTERM asked to exit;
  - an AddressSanitizer/UBSan/valgrind report that reached the log;
  - a WARNING or LOG line it does not know (listed below as "unknown").
Accepts: ERROR and FATAL with any SQLSTATE outside class XX (the
statements of sqlsmith and of the API fuzzer are wrong on purpose), and
the LOG lines of a server starting, checkpointing and stopping, and of the
pgqueue schedulers starting.  Prints a histogram of what it saw.
"""
import collections
import re
import sys

PREFIX = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+) \[(\d+)\] (.*?) (\S*) ?([0-9A-Z]{5}) '
                    r'(LOG|WARNING|ERROR|FATAL|PANIC|DETAIL|HINT|CONTEXT|STATEMENT|LOCATION|NOTICE|INFO|DEBUG\d?):  (.*)$')
CRASH = re.compile(r'terminated by signal|server process .* was terminated|all server processes terminated|'
                   r'database system was interrupted|not properly shut down|TRAP:|failed Assert|'
                   r'AddressSanitizer|UndefinedBehaviorSanitizer|runtime error:|==\d+==|'
                   r'terminating connection because of crash', re.I)
OK_LOG = [
    r'^starting PostgreSQL', r'^listening on', r'^database system is ready',
    r'^database system was shut down at', r'^received (fast|smart|immediate) shutdown request',
    r'^aborting any active transactions', r'^shutting down$', r'^database system is shut down',
    r'^checkpoint (starting|complete)', r'^background worker "logical replication launcher"',
    r'^pgqueue scheduler started for database', r'^pgqueue scheduler: extension pgqueue is not installed',
    # a scheduler that sqlsmith's pg_terminate_backend() stopped
    r'^pgqueue launcher: the scheduler of database ".*" stopped; starting it again',
    r'^redo (starts|done)', r'^restartpoint',
    # WAL written fast (sqlsmith's pg_switch_wal(), CHECKPOINTs, the load)
    r'^checkpoints are occurring too frequently',
    # sqlsmith calls the catalog's functions with random arguments
    r'^logging memory contexts of PID', r'^level: \d+; ', r'^Grand total: ',
    r'^statement: ', r'^duration: ', r'^received SIGHUP, reloading', r'^parameter ".*" changed to',
    r'^configuration file .* contains errors', r'^rotating log file',
    r'^restore point ".*" created at ',   # pg_create_restore_point()
    r'^temporary file: ', r'^could not send data to client', r'^could not receive data from client',
    r'^unexpected EOF on client connection', r'^connection to client lost', r'^automatic (vacuum|analyze)',
]
OK_WARNING = [
    # sqlsmith: pg_cancel_backend/pg_terminate_backend of a random pid,
    # pg_stop_backup without a backup, pg_advisory_unlock of a lock not held,
    # set_config of a GUC it cannot parse at reload, ...
    r'^PID \d+ is not a PostgreSQL (server|backend) process',
    r'^you don\'t own a lock of type',
    r'^there is no transaction in progress', r'^there is already a transaction in progress',
    r'^SET LOCAL can only be used in transaction blocks',
    r'^could not determine', r'^could not send signal to process',
    r'^pg_stop_backup', r'^nonstandard use of',
    # a session that sqlsmith's pg_backup_start() left in a backup, ending
    r'^aborting backup due to backend exiting before pg_backup_stop was called',
    r'^skipping .* --- ', r'^wal_level is insufficient',
    r'^(logical replication|WAL) ', r'^TIME_ZONE', r'^invalid configuration parameter name',
    r'^PID \d+ is not a PostgreSQL', r'^signal', r'^"\S+" is a procedure',
    r'^unrecognized configuration parameter',
    r'^could not (open|read|stat) file', r'^page \d+ of relation',
    r'^rotation not possible because log collection not active',
    # src/archive.c, pgq_archive_try: an upkeep step that failed (a lock
    # sqlsmith holds, a DDL of its own) is logged and tried again later
    r'^could not (make archive partitions|drop expired archive partitions): ',
    # src/ring.c, the same for the rings of queue's and work_queue's slots (a DDL of
    # sqlsmith's on pgqueue's tables, a lock it holds past the timeout)
    r'^could not (turn the ring|move the rows left in old slots|drop the free slots) of pgqueue\.(work_queue|queue): ',
    # src/claim.c: a claim met the work row of a job whose row sqlsmith
    # deleted from pgqueue.queue (it may write pgqueue's tables)
    r'^job \S+ has no row in pgqueue\.queue: its work_queue row is deleted$',
]

# the SQLSTATEs test/fuzz/apifuzz.py accepts (database "fuzz"); sqlsmith's
# database "smith" may end statements with any SQLSTATE outside class XX
FUZZ_STATES = {'22004', '22023', '2202E', '54000', '42501', '22P02', '22008', '22015', '22021',
               '22P05', '22003', '22007', '54001', '40001', '40P01', '55P03', '57014', '57P01'}


# Internal errors (class XX) that PostgreSQL's own code raises when sqlsmith,
# a superuser, calls catalog functions with arguments no one else would:
# accepted in sqlsmith's database only, and only when the LOCATION line
# (log_error_verbosity = verbose) names PostgreSQL's code, not pgqueue's.
# Each was read in the log of a run and traced to the function named.
PG_INTERNAL = [
    # pg_catalog.acldefault() with an object type letter it does not know
    # (acl.c acldefault_sql, an elog)
    r'^unrecognized objtype abbreviation',
    # pg_catalog.unknownin() makes a column of type unknown that a window
    # or CASE then has to coerce (parse_coerce.c)
    r'^failed to find conversion function from unknown to ',
    # pg_catalog.pg_stop_making_pinned_objects(), meant for initdb only
    # (varsup.c SetNextObjectId)
    r'^cannot advance OID counter anymore',
    # pg_catalog.interval(interval, int4) with a typmod that is not one
    # (timestamp.c intervaltypmodleastfield)
    r'^invalid INTERVAL typmod', r'^unrecognized interval typmod',
    # pg_read_binary_file() of a name too long for a path (ENAMETOOLONG,
    # which errcode_for_file_access() does not map: genfile.c)
    r'^could not open file ',
    # pg_stat_file() of a random text too long for a path (the same
    # ENAMETOOLONG: genfile.c pg_stat_file)
    r'^could not stat file ',
    # lo_import()/lo_export() of a random text too long for a path (the
    # same ENAMETOOLONG: be-fsstubs.c lo_import_internal, be_lo_export)
    r'^could not (open|create) server file ',
    # pg_ls_dir() of one (the same ENAMETOOLONG: fd.c AllocateDir/ReadDir)
    r'^could not (open|read) directory ',
    # an OID that names nothing, passed to a catalog function (e.g.
    # to_tsvector(0::regconfig, ...): ts_cache.c lookup_ts_config_cache);
    # the LOCATION check above still fails any raised in pgqueue's code
    r'^cache lookup failed for ',
    # jsonb_to_tsvector(..., flags) with flags a jsonb array holding an
    # array or object (jsonfuncs.c parse_jsonb_index_flags elog()s where it
    # meets the nested container; sqlsmith passed a pgq_stats() wrapper's
    # jsonb as the flags)
    r'^unexpected end of flag array',
    # pg_describe_object(), pg_identify_object() and the like called with
    # a class OID other than pg_class and a non-zero sub-id (dependency.c
    # getObjectClass; pgqueue calls none of them: sqlsmith passed random
    # integers, among them columns of the fz_ wrappers)
    r'^invalid non-zero objectSubId for object class ',
]
# pgqueue's code: any function named pgq_*, or one of its source files
# whose name PostgreSQL does not use itself (worker.c and shmem.c it does)
OUR_LOCATION = re.compile(r'^pgq_|\b(pgqueue|api|admin|archive|claim|jobs|schedule|publish|bounds|tables|uuid7)\.c:')
# a statement that reaches pgqueue: its functions, the SQL wrappers and
# views of test/fuzz/smith.sql, its schema's tables
OUR_STATEMENT = re.compile(r'pgq|\bfz_', re.I)


def main(path):
    bad = []
    hist = collections.Counter()
    unknown = collections.Counter()
    terminated_pids = set()
    waiting_pids = set()      # schedulers that waited for their database to exist
    failed_workers = set()    # parallel workers that logged an ERROR or FATAL
    shutting_down = False
    prev = None
    with open(path, errors='replace') as f:
        lines = f.read().splitlines()
    # pid -> an XX000 entry of sqlsmith's database being read: its ERROR
    # line, message, LOCATION and STATEMENT (with the statement's further
    # lines), judged when the entry ends (the pid's next entry, or the end)
    pending = {}
    review = []

    def judge(e):
        where = e['location']
        if where is None:
            bad.append('internal error (no LOCATION line): ' + e['line'])
        elif OUR_LOCATION.search(where):
            bad.append('internal error: ' + e['line'] + '   LOCATION: ' + where)
        elif any(re.search(p, e['msg']) for p in PG_INTERNAL):
            hist[('ERROR', 'XX000 of PostgreSQL itself (sqlsmith, see PG_INTERNAL): ' + e['msg'][:50] + ' at ' + where.split(',')[0])] += 1
        elif e['statement'] is not None and not OUR_STATEMENT.search(e['statement'] + '\n' + e['context']):
            hist[('ERROR', 'XX000 of PostgreSQL itself, statement without pgqueue (REVIEW): ' + e['msg'][:50] + ' at ' + where.split(',')[0])] += 1
            review.append(e['line'] + '   LOCATION: ' + where)
        else:
            bad.append('internal error: ' + e['line'] + '   LOCATION: ' + where +
                       ('' if e['statement'] is None else '   STATEMENT: ' + e['statement'][:300]))

    cur = None     # the pending entry that continuation lines belong to
    part = 'msg'   # and the part of it they continue
    for ln in lines:
        m = PREFIX.match(ln)
        if CRASH.search(ln):
            bad.append('crash: ' + ln)
            continue
        if not m:
            # a continuation of the previous entry (a multi-line statement)
            if cur is not None:
                cur[part] += '\n' + ln
            if prev is None:
                hist[('other', 'unprefixed')] += 1
                unknown[ln[:160]] += 1
            continue
        _ts, pid, btype, db, state, level, msg = m.groups()
        msg = re.sub(r'^[0-9A-Z]{5}: ', '', msg)   # verbose: the SQLSTATE again
        prev = level
        cur = None
        if btype == 'parallel worker' and level in ('ERROR', 'FATAL'):
            # a parallel worker ends with exit code 1 after an error of
            # its own (a sqlsmith query's: judged like the leader's) or
            # when its leader stops it (FATAL 57P01)
            failed_workers.add(pid)
        if pid in pending:
            if level == 'LOCATION' and pending[pid]['location'] is None:
                pending[pid]['location'] = msg
                cur, part = pending[pid], 'location'
                continue
            if level == 'STATEMENT' and pending[pid]['statement'] is None:
                pending[pid]['statement'] = msg
                cur, part = pending[pid], 'statement'
                continue
            if level in ('DETAIL', 'HINT', 'CONTEXT'):
                pending[pid]['context'] += '\n' + msg
                cur, part = pending[pid], 'context'
                continue
            judge(pending.pop(pid))
        if level in ('DETAIL', 'HINT', 'CONTEXT', 'STATEMENT', 'LOCATION'):
            continue
        if state.startswith('XX'):
            if db == 'smith' and level == 'ERROR' and state == 'XX000':
                pending[pid] = cur = {'line': ln, 'msg': msg, 'location': None, 'statement': None, 'context': ''}
                part = 'msg'
            else:
                bad.append('internal error: ' + ln)
            continue
        if level == 'PANIC':
            bad.append('PANIC: ' + ln)
            continue
        if level == 'FATAL' and state in ('57P01', '57P02', '57P03'):
            terminated_pids.add(pid)
        if re.search(r'received (fast|smart|immediate) shutdown request', msg):
            shutting_down = True
        if btype in ('pgqueue scheduler', 'pgqueue launcher') and \
                re.search(r'named in pgqueue.database does not exist', msg):
            # the databases are made after the server starts: the launcher
            # logs this once and starts the scheduler when the database
            # appears (a version without the launcher: the scheduler logs
            # it, then exits 1 to restart connected)
            waiting_pids.add(pid)
            hist[('LOG', 'scheduler waiting for its database')] += 1
            continue
        if level in ('ERROR', 'FATAL'):
            if btype == 'pgqueue scheduler' and state not in ('57P01',):
                # a scheduling pass that failed: never expected
                unknown[f'{level} {state} {btype} {db}: {msg[:160]}'] += 1
                continue
            if db == 'fuzz' and state not in FUZZ_STATES:
                unknown[f'{level} {state} {btype} {db}: {msg[:160]}'] += 1
                continue
            hist[(level, state, btype, db)] += 1
            continue
        mm = re.search(r'\(PID (\d+)\) exited with exit code (\d+)', msg)
        if mm:
            if btype == 'postmaster' and 'pgqueue scheduler' in msg and mm.group(1) in terminated_pids | waiting_pids:
                hist[('LOG', 'scheduler exited to restart (SIGTERM, or its database appeared)')] += 1
                continue
            if 'parallel worker' in msg and mm.group(2) == '1' and mm.group(1) in failed_workers:
                hist[('LOG', 'parallel worker exited 1 after its ERROR or FATAL')] += 1
                continue
            if shutting_down and mm.group(2) == '1':
                hist[('LOG', 'background worker exited 1 at shutdown')] += 1
                continue
            bad.append('process exited: ' + ln)
            continue
        if level == 'LOG' and any(re.search(p, msg) for p in OK_LOG):
            hist[('LOG', 'ordinary')] += 1
            continue
        if level == 'WARNING' and any(re.search(p, msg) for p in OK_WARNING):
            hist[('WARNING', state, re.sub(r'\d+', 'N', msg)[:60])] += 1
            continue
        if level in ('NOTICE', 'INFO') or level.startswith('DEBUG'):
            hist[(level, state)] += 1
            continue
        unknown[f'{level} {state} {btype}: {msg[:160]}'] += 1
    for e in pending.values():
        judge(e)
    print(f'{len(lines)} lines in {path}')
    for b in bad[:50]:
        print('  BAD ' + b)
    for r in review[:20]:
        print('  REVIEW (PostgreSQL\'s own, not failing; add to PG_INTERNAL once read) ' + r)
    for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])[:50]:
        print(f'  unknown {v:5d}  {k}')
    for k, v in sorted(hist.items(), key=lambda kv: -kv[1]):
        print(f'  {v:7d}  {" ".join(k)}')
    if bad or unknown:
        print(f'FAILED: {len(bad)} crash/internal-error lines, {sum(unknown.values())} unknown lines')
        return 1
    print('log ok: no crash, no assertion, no internal error, nothing unknown')
    return 0

if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
