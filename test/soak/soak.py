#!/usr/bin/python3
"""
The soak with faults: producers, consumers, a fault injector and a
sampler run against one server for --seconds, then the queues are drained and
the final state of the database is appended to the history.  Every event goes
to one JSONL file (--history), which checker.py reads; the checker needs
nothing else, so a failed run can be checked again from its history alone.
The drain ends when nothing is left, when only jobs 'scheduled' without a
work_queue row (lost: no claim can take them) have been left for 10 s, or
--drain-seconds after what is left last went down.

--mode ring adds the workers of ring.py (the ring mode: see there;
run.sh sets up its server, standby and second database).

    /usr/bin/python3 soak.py --dsn 'host=... port=... dbname=soak' \
        --datadir DIR --pgbin BINDIR --logfile LOG --history FILE --seconds 180

Run as the server's owner (it stops and starts the server with pg_ctl and
sends SIGKILL to backends).  Needs psycopg 3 (Debian's python3-psycopg).

Events (one JSON object per line, "ev" says which; times are Unix epoch
seconds from the one system clock that server and clients share; t0/t1 are
when the client sent the call and when it had the answer):
  start     the settings of the run
  config    pgq_configure(q, ...) and when: t0..t1 (its commit lies between)
  push      ids (in order), q, by, prio, delay, dedup, status: ok (COMMIT
            returned) | uncertain (the connection was lost during COMMIT);
            parents {child id: [parent ids]} of a flow producer's push
  claim     id, q, holder, tries, version, lock_timeout (server), lease,
            released (server: the created time of its work_queue row, when
            the scheduler released it)
  push_resolved  ids, found: an uncertain push looked up after reconnecting
            (how many of its ids are in pgqueue.queue or pgqueue.archive)
  claim_uncertain  holder: COMMIT of a claim lost, rows unknown
  idle      holder, queues: a claim that returned no row (t0..t1)
  ack       id, holder, result (true/false), status ok | uncertain | error;
            the job's work (a row in table soak_done) is written in the
            ack's transaction, rolled back when the ack is refused
  ack_batch ids, holder, count, status (rollback: not all acked, so the
            acks and the work were rolled back)
  nack      id, holder, result (retry/failed/null), status
  extend    id, holder, result (new deadline or null), status
  disconnect holder, ids: a consumer closed its connection holding ids
  fault     kind (term_scheduler, sigkill, restart, release, pause, resume,
            weight, cap), details
  sample    wq {queue: rows in work_queue}, claimable [[id, q, since]...]:
            work_queue rows claimable (never claimed, released, or lease
            run out) since `since` (server time) for over a second;
            due [[id, q, run_after]...]: jobs of the uncapped queues due for
            over 5 s and not scheduled; grp {queue: the most jobs of one
            group in flight}: the grouped queues (1.2)
  sizes     bytes and live rows of the tables
  phase     name: run | drain | final
  final_job / final_work / final_archive / final_queue / final_done:
            the final state (final_done: the rows of soak_done)
  server_log  counts of the server log's crash lines
  manual_passes  n, passes, moved: a session's pgq_schedule() calls
  end
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg

QUEUES = {
    # queue: settings at start (retention 1 day everywhere: the archive
    # tells what became of each acked job)
    'soak_plain': dict(weight=1, max_in_flight=0, max_tries=5),
    'soak_cap3': dict(weight=2, max_in_flight=3, max_tries=5),
    'soak_cap5': dict(weight=1, max_in_flight=5, max_tries=4),
    'soak_fail': dict(weight=1, max_in_flight=0, max_tries=2),
    # 1.2: at most 3 releases in any window of a second (batches of pushes
    # fill a window at once)
    'soak_rate': dict(weight=1, max_in_flight=0, max_tries=5, rate_limit=3, rate_period='1 second'),
    # 1.2: flows (the flow producer: a parent, children after it, a fan-in
    # after them); tries enough that no parent fails
    'soak_flow': dict(weight=1, max_in_flight=0, max_tries=20),
    # 1.2: groups of one job in flight at a time (GROUPS keys, and jobs
    # without a group)
    'soak_group': dict(weight=1, max_in_flight=0, max_tries=5, group_max_in_flight=1),
}
CAPPED = ['soak_cap3', 'soak_cap5']
RATED = ['soak_rate']
GROUPED = ['soak_group']
# keys of every length up to the limit (256 bytes), multibyte ones among
# them, so that a grouped queue's index spans pages and a pass's walk of
# its groups steps from page to page
GROUPS = (['g%d' % i for i in range(8)] +
          ['customer-%d-%s' % (i, 'x' * (20 * i)) for i in range(1, 12)] +
          ['ключ-%d' % i for i in range(4)] +
          ['L\u00e9' * 80 + str(i) for i in range(3)])
# a job's "work": a row written in the transaction of its ack
DONE_SQL = 'INSERT INTO soak_done (id, holder) VALUES (%s, %s)'
LEASES = [1, 2, 3]     # seconds


class History:
    def __init__(self, path):
        self.f = open(path, 'a', buffering=1)
        self.lock = threading.Lock()

    def write(self, ev, **kw):
        kw['ev'] = ev
        kw.setdefault('t', time.time())
        line = json.dumps(kw, separators=(',', ':'), default=str)
        with self.lock:
            self.f.write(line + '\n')


class Soak:
    def __init__(self, a):
        self.a = a
        self.h = History(a.history)
        self.rng = random.Random(a.seed)
        self.stop_producers = threading.Event()
        self.stop_faults = threading.Event()
        self.stop_consumers = threading.Event()
        self.stop_sampler = threading.Event()
        self.draining = threading.Event()
        self.keys = {}          # consumer number -> current lock_key
        self.busy = {}          # consumer number -> since when it holds jobs
        self.keys_lock = threading.Lock()
        self.server_lock = threading.Lock()   # held while the injector restarts the server
        self.errors = []        # unexpected exceptions in threads
        self.kill_commit = threading.Event()  # the next COMMIT kills its backend
        self.kill_lock = threading.Lock()
        self.kill_done = threading.Event()
        self.crash_lock = threading.Lock()   # held by the injector during a crash fault
        # the queues set up, paused, sampled and drained (a mode may add
        # some: ring.py); the producers push into QUEUES
        self.queues = dict(QUEUES)
        self.no_pause = set()   # queues the injector leaves alone (pause, resume)
        self.start_extra = {}   # a mode's settings, for the start event

    # --- connections -------------------------------------------------------
    def connect(self, app, stop=None, timeout=120):
        deadline = time.time() + timeout
        while True:
            try:
                return psycopg.connect(self.a.dsn, application_name=app,
                                       connect_timeout=3,
                                       options='-c statement_timeout=20s')
            except psycopg.Error:
                if (stop is not None and stop.is_set()) or time.time() > deadline:
                    raise
                time.sleep(0.2)

    @staticmethod
    def close(conn):
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def guard(self, name, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # a bug of the harness: reported as a failure
            import traceback
            traceback.print_exc()
            self.errors.append('%s: %r' % (name, e))
            self.h.write('harness_error', thread=name, error=repr(e))

    def commit(self, conn, who):
        """COMMIT; or, when the injector asked for it, SIGKILL this
        connection's backend while its COMMIT is in flight (a crash restart
        whose COMMIT may or may not have happened: raises
        OperationalError, as a connection lost during COMMIT does)."""
        take = False
        if self.kill_commit.is_set():
            with self.kill_lock:
                take = self.kill_commit.is_set()
                self.kill_commit.clear()
        if not take:
            conn.commit()
            return
        pid = conn.info.backend_pid
        t0 = time.time()
        conn.pgconn.send_query(b'COMMIT')
        conn.pgconn.flush()
        time.sleep(random.uniform(0, 0.0003))
        os.kill(pid, signal.SIGKILL)
        self.h.write('fault', kind='sigkill', target='commit in flight', pid=pid, app=who,
                     t0=t0, t1=time.time())
        self.kill_done.set()
        raise psycopg.OperationalError('backend killed during COMMIT')

    # --- setup -------------------------------------------------------------
    def configure(self, conn, q, **kw):
        t0 = time.time()
        args = ', '.join('%s => %%s' % k for k in kw)
        conn.execute('SELECT pgq_configure(%%s, %s)' % args, [q] + list(kw.values()))
        conn.commit()
        self.h.write('config', q=q, t0=t0, t1=time.time(),
                     **{k: (str(v) if k == 'retention' else v) for k, v in kw.items()})

    def setup(self):
        conn = self.connect('soak-setup')
        conn.execute('CREATE EXTENSION IF NOT EXISTS pgqueue')
        conn.execute('CREATE TABLE IF NOT EXISTS soak_done (id uuid NOT NULL, holder text NOT NULL, '
                     'at timestamptz NOT NULL DEFAULT clock_timestamp())')
        conn.commit()
        for q, s in self.queues.items():
            self.configure(conn, q, retention='1 day', paused=False, **s)
        conn.close()

    # --- producers ---------------------------------------------------------
    def producer(self, n, kind):
        rng = random.Random(self.a.seed * 100 + n)
        conn = None
        seq = 0
        while not self.stop_producers.is_set():
            if conn is None or conn.closed:
                try:
                    conn = self.connect('soak-producer-%d' % n, self.stop_producers)
                except psycopg.Error:
                    continue
            q = rng.choices(list(QUEUES), weights=[4, 2, 2, 2, 1, 1, 2])[0]
            if kind == 'flow':
                q = 'soak_flow'
            parents = {}
            group = rng.choice(GROUPS + [None]) if q in GROUPED else None
            prio = rng.choice([0, 0, 0, 1, 5, -3])
            delay = round(rng.uniform(0.1, 3.0), 2) if rng.random() < 0.15 else None
            dedup = None
            seq += 1
            t0 = time.time()
            try:
                with conn.cursor() as cur:
                    if kind == 'flow':
                        # one transaction: a parent, 1-3 children after it,
                        # and half the time a fan-in job after the children
                        cur.execute('SELECT pgq_push(%s, %s::jsonb, NULL, %s)',
                                    (q, json.dumps({'p': n, 'n': seq, 'flow': 'parent'}), prio))
                        parent = str(cur.fetchone()[0])
                        cur.execute('SELECT pgq_push_batch(%s, %s::jsonb[], NULL, %s, NULL, %s::uuid[])',
                                    (q, [json.dumps({'p': n, 'n': seq, 'flow': 'child', 'i': i})
                                         for i in range(rng.randint(1, 3))], prio, [parent]))
                        kids = [str(r[0]) for r in cur.fetchall()]
                        ids = [parent] + kids
                        for k in kids:
                            parents[k] = [parent]
                        if rng.random() < 0.5:
                            cur.execute('SELECT pgq_push(%s, %s::jsonb, NULL, %s, NULL, NULL, %s::uuid[])',
                                        (q, json.dumps({'p': n, 'n': seq, 'flow': 'fan-in'}), prio,
                                         kids))
                            fanin = str(cur.fetchone()[0])
                            ids.append(fanin)
                            parents[fanin] = kids
                    elif kind == 'batch':
                        k = rng.randint(2, 6)
                        payloads = [json.dumps({'p': n, 'n': seq, 'i': i}) for i in range(k)]
                        cur.execute(
                            'SELECT pgq_push_batch(%s, %s::jsonb[], '
                            'clock_timestamp() + make_interval(secs => %s), %s, group_key => %s)',
                            (q, payloads, delay or 0, prio, group))
                        ids = [str(r[0]) for r in cur.fetchall()]
                    else:
                        if kind == 'dedup':
                            dedup = 'k%d' % rng.randint(0, 24)
                        # a producer of single pushes sometimes makes several
                        # in one transaction: all of them commit or none
                        k = rng.choice([2, 3]) if kind == 'single' and rng.random() < 0.3 else 1
                        ids = []
                        for i in range(k):
                            cur.execute(
                                'SELECT pgq_push(%s, %s::jsonb, '
                                'CASE WHEN %s::float8 IS NULL THEN NULL '
                                'ELSE clock_timestamp() + make_interval(secs => %s) END, %s, %s, '
                                'group_key => %s)',
                                (q, json.dumps({'p': n, 'n': seq, 'i': i}), delay, delay or 0,
                                 prio, dedup, group))
                            ids.append(str(cur.fetchone()[0]))
            except psycopg.Error as e:
                # nothing was committed: the COMMIT was never sent
                self.h.write('push_error', by=n, q=q, t0=t0, t1=time.time(), error=type(e).__name__)
                self.close(conn)
                conn = None
                continue
            try:
                self.commit(conn, 'producer-%d' % n)
                status = 'ok'
            except psycopg.OperationalError:
                status = 'uncertain'
            except psycopg.Error:
                status = 'error'
            self.h.write('push', ids=ids, q=q, by=n, kind=kind, prio=prio, delay=delay,
                         dedup=dedup, group=group, status=status, t0=t0, t1=time.time(),
                         **({'parents': parents} if parents else {}))
            if status != 'ok':
                self.close(conn)
                conn = None
            if status == 'uncertain':
                # resolve it: the tables and the archive (every soak queue
                # keeps one, and nothing cancels or purges) say whether the
                # COMMIT happened
                try:
                    conn = self.connect('soak-producer-%d' % n, timeout=300)
                    found = conn.execute(
                        'SELECT (SELECT count(*) FROM pgqueue.queue WHERE id = ANY(%s::uuid[]))'
                        '     + (SELECT count(*) FROM pgqueue.archive WHERE id = ANY(%s::uuid[]))',
                        (ids, ids)).fetchone()[0]
                    conn.commit()
                    self.h.write('push_resolved', ids=ids, q=q, by=n, dedup=dedup, found=found)
                except psycopg.Error:
                    self.close(conn)
                    conn = None
            time.sleep(rng.uniform(0, 2 * self.a.push_pause))
        self.close(conn)

    # --- consumers ---------------------------------------------------------
    def consumer(self, n):
        rng = random.Random(self.a.seed * 1000 + n)
        gen = 0
        key = 'c%d.%d' % (n, gen)
        with self.keys_lock:
            self.keys[n] = key
        # consumer 1 claims from the capped queues only, consumer 2 from the
        # others only; the rest from every queue
        queues = {1: CAPPED, 2: ['soak_plain', 'soak_fail']}.get(n)
        conn = None

        def tx(sql, args, work=(), need=None):
            """Run the work's statements and one call, and COMMIT: (value,
            status).  When need(value) is false, ROLLBACK instead (the work
            is undone with the call): status 'rollback'."""
            nonlocal conn
            if conn is None or conn.closed:
                conn = self.connect('soak-consumer-%d' % n, timeout=300)
            try:
                for wsql, wargs in work:
                    conn.execute(wsql, wargs)
                val = conn.execute(sql, args).fetchone()[0]
                if need is not None and not need(val):
                    conn.rollback()
                    return val, 'rollback'
            except psycopg.Error:
                self.close(conn)
                conn = None
                return None, 'error'
            try:
                self.commit(conn, key)
                return val, 'ok'
            except psycopg.OperationalError:
                self.close(conn)
                conn = None
                return val, 'uncertain'
            except psycopg.Error:
                self.close(conn)
                conn = None
                return None, 'error'

        def ack(jid):
            # the job's work (a row in soak_done) commits with its ack, or
            # is rolled back when the ack is refused
            t0 = time.time()
            r, st = tx('SELECT pgq_ack(%s, %s)', (jid, key),
                       work=[(DONE_SQL, (jid, key))], need=lambda r: r is True)
            if st == 'rollback':
                st = 'ok'       # a refused ack: nothing to commit
            self.h.write('ack', id=jid, holder=key, result=r, status=st, t0=t0, t1=time.time())

        def nack(jid):
            t0 = time.time()
            r, st = tx('SELECT pgq_nack(%s, %s, %s, make_interval(secs => %s))',
                       (jid, key, 'soak nack by %s' % key, round(rng.uniform(0, 1.0), 2)))
            self.h.write('nack', id=jid, holder=key, result=r, status=st, t0=t0, t1=time.time())

        def extend(jid, lease):
            t0 = time.time()
            r, st = tx('SELECT extract(epoch FROM pgq_extend(%s, %s, make_interval(secs => %s)))',
                       (jid, key, lease))
            self.h.write('extend', id=jid, holder=key, result=float(r) if r is not None else None,
                         lease=lease, status=st, t0=t0, t1=time.time())
            return r

        while not self.stop_consumers.is_set():
            if conn is None or conn.closed:
                try:
                    conn = self.connect('soak-consumer-%d' % n, self.stop_consumers)
                except psycopg.Error:
                    continue
            lease = rng.choice(LEASES)
            max_items = rng.choice([1, 1, 1, 2, 4])
            wait = rng.choice([0, 0, 1])
            t0 = time.time()
            try:
                # the work_queue row's created: when the job was released
                # (the statement's snapshot is older than the claim, and
                # the claim does not change it)
                rows = conn.execute(
                    'SELECT c.id, c.queue, c.tries, c.version, extract(epoch FROM c.lock_timeout), '
                    '       extract(epoch FROM w.created) '
                    'FROM pgq_claim(%s, %s, make_interval(secs => %s), %s, make_interval(secs => %s)) c '
                    'LEFT JOIN pgqueue.work_queue w ON w.id = c.id',
                    (key, max_items, lease, queues, wait)).fetchall()
            except psycopg.Error:
                self.close(conn)
                conn = None
                continue
            try:
                self.commit(conn, key)
            except psycopg.Error:
                self.h.write('claim_uncertain', holder=key, t0=t0, t1=time.time())
                self.close(conn)
                conn = None
                continue
            t1 = time.time()
            self.busy.pop(n, None)
            if not rows:
                self.h.write('idle', holder=key, queues=queues, t0=t0, t1=t1)
                if wait == 0:
                    time.sleep(0.05)
                continue
            jobs = []
            self.busy[n] = time.time()      # holds jobs: the injector's release prefers it
            for jid, q, tries, version, lt, rel in rows:
                jid = str(jid)
                jobs.append(jid)
                self.h.write('claim', id=jid, q=q, holder=key, tries=tries, version=version,
                             lock_timeout=float(lt), lease=lease, t0=t0, t1=t1,
                             released=float(rel) if rel is not None else None)
            drain = self.draining.is_set()
            if len(jobs) > 1 and rng.random() < 0.2:
                if not drain and rng.random() < 0.1:
                    time.sleep(lease + rng.uniform(0.3, 1.5))   # some may be taken meanwhile
                else:
                    time.sleep(rng.uniform(0, 0.05))
                t0 = time.time()
                # all or nothing: rolled back (acks and work) unless every
                # job was acked
                c, st = tx('SELECT pgq_ack_batch(%s::uuid[], %s)', (jobs, key),
                           work=[(DONE_SQL, (j, key)) for j in jobs],
                           need=lambda c: c == len(jobs))
                self.h.write('ack_batch', ids=jobs, holder=key, count=c, status=st,
                             t0=t0, t1=time.time())
                continue
            for i, jid in enumerate(jobs):
                r = rng.random()
                if drain:
                    r = r * 0.92     # no stalls or disconnects while draining
                time.sleep(rng.uniform(0, 0.03))
                if r < 0.80:
                    ack(jid)
                elif r < 0.90:
                    nack(jid)
                elif r < 0.92:
                    # long work under a lease kept alive with pgq_extend
                    time.sleep(lease * 0.6)
                    if extend(jid, lease) is not None:
                        time.sleep(lease * 0.6)
                    ack(jid)
                elif r < 0.97:
                    # stall past the lease, then ack: false once another
                    # claim took the job
                    time.sleep(lease + rng.uniform(0.3, 1.5))
                    ack(jid)
                else:
                    # disconnect mid-job: the rest of this claim is orphaned
                    # and a new lock_key is used from now on
                    self.h.write('disconnect', holder=key, ids=jobs[i:])
                    self.close(conn)
                    conn = None
                    gen += 1
                    key = 'c%d.%d' % (n, gen)
                    with self.keys_lock:
                        self.keys[n] = key
                    break
        self.close(conn)

    # --- a user's scheduling passes -----------------------------------------
    def manual_scheduler(self, n):
        """pgq_schedule() called by a user while the background scheduler
        runs: passes at once must not exceed a cap together."""
        rng = random.Random(self.a.seed * 31 + n)
        conn = None
        passes = moved = 0
        while not self.stop_producers.is_set():
            if conn is None or conn.closed:
                try:
                    conn = self.connect('soak-schedule-%d' % n, self.stop_producers)
                except psycopg.Error:
                    continue
            try:
                moved += conn.execute('SELECT pgq_schedule(%s)', (rng.randint(1, 5),)).fetchone()[0]
                conn.commit()
                passes += 1
            except psycopg.Error:
                self.close(conn)
                conn = None
            time.sleep(rng.uniform(0, 0.2))
        self.close(conn)
        self.h.write('manual_passes', n=n, passes=passes, moved=moved)

    # --- fault injector ----------------------------------------------------
    def pg_ctl(self, *args):
        return subprocess.run([os.path.join(self.a.pgbin, 'pg_ctl'), '-D', self.a.datadir,
                               '-w', '-t', '120', *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT).returncode

    def wait_server(self):
        c = self.connect('soak-wait', timeout=180)
        c.close()

    def injector(self):
        rng = random.Random(self.a.seed * 7)
        kinds = ['term_scheduler', 'sigkill', 'restart', 'release', 'pause', 'weight', 'cap']
        bag = []
        resumes = []            # (time, queue) of paused queues
        conn = None
        while not self.stop_faults.is_set():
            delay = min(max(rng.expovariate(1.0 / self.a.fault_interval), 1.0),
                        3 * self.a.fault_interval)
            if self.stop_faults.wait(delay):
                break
            if conn is None or conn.closed:
                try:
                    conn = self.connect('soak-injector', self.stop_faults)
                except psycopg.Error:
                    continue
            # resume what is due first
            now = time.time()
            due = [r for r in resumes if r[0] <= now]
            if not bag:
                bag = kinds[:]
                rng.shuffle(bag)
            kind = 'resume' if due else bag.pop()
            # no crash while a mode's step that must not be cut runs (the
            # ring mode's restore): it holds crash_lock
            crash = kind in ('sigkill', 'restart')
            if crash:
                self.crash_lock.acquire()
            t0 = time.time()
            detail = {}
            try:
                if kind == 'resume':
                    _, q = due[0]
                    resumes.remove(due[0])
                    self.configure(conn, q, paused=False)
                    detail = dict(q=q)
                elif kind == 'term_scheduler':
                    r = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                     "WHERE backend_type = 'pgqueue scheduler'").fetchone()[0]
                    conn.commit()
                    detail = dict(terminated=r)
                elif kind == 'sigkill' and rng.random() < 0.5:
                    # a client's backend, killed by the client itself while
                    # its COMMIT is in flight (see commit()); recorded there
                    self.kill_done.clear()
                    self.kill_commit.set()
                    took = self.kill_done.wait(5)
                    with self.kill_lock:
                        self.kill_commit.clear()
                    self.close(conn)
                    conn = None
                    time.sleep(0.5)
                    self.wait_server()
                    if took:
                        continue
                    detail = dict(pid=None, target='no COMMIT within 5 s')
                elif kind == 'sigkill':
                    rows = conn.execute(
                        "SELECT pid, backend_type, application_name FROM pg_stat_activity "
                        "WHERE (backend_type = 'client backend' AND application_name LIKE 'soak-%%' "
                        "       AND pid <> pg_backend_pid()) OR backend_type = 'pgqueue scheduler'"
                    ).fetchall()
                    conn.commit()
                    if rows:
                        # mostly a client's backend, sometimes the scheduler
                        sched = [r for r in rows if r[1] == 'pgqueue scheduler']
                        clients = [r for r in rows if r[1] != 'pgqueue scheduler']
                        pick = rng.choice(sched if sched and (not clients or rng.random() < 0.3)
                                          else clients)
                        os.kill(pick[0], signal.SIGKILL)
                        detail = dict(pid=pick[0], target=pick[1], app=pick[2])
                        self.close(conn)
                        conn = None
                        time.sleep(0.5)
                        self.wait_server()
                    else:
                        detail = dict(pid=None)
                elif kind == 'restart':
                    self.close(conn)
                    conn = None
                    rc1 = self.pg_ctl('-m', 'immediate', 'stop')
                    time.sleep(rng.uniform(0, 1.0))
                    rc2 = self.pg_ctl('-l', self.a.logfile, 'start')
                    detail = dict(stop_rc=rc1, start_rc=rc2)
                    if rc2 != 0:
                        raise RuntimeError('pg_ctl start failed: %d' % rc2)
                    self.wait_server()
                elif kind == 'release':
                    with self.keys_lock:
                        # mostly a consumer that has held jobs for a while
                        busy = [self.keys[n] for n, since in list(self.busy.items())
                                if time.time() - since > 0.5 and n in self.keys]
                        key = rng.choice(busy if busy and rng.random() < 0.8
                                         else list(self.keys.values()))
                    r = conn.execute('SELECT pgq_release(%s)', (key,)).fetchone()[0]
                    conn.commit()
                    detail = dict(key=key, released=r)
                elif kind == 'pause':
                    pausable = [q for q in self.queues if q not in self.no_pause]
                    q = rng.choice([q for q in pausable if q not in [r[1] for r in resumes]] or pausable)
                    detail = dict(q=q)
                    self.configure(conn, q, paused=True)
                    resumes.append((time.time() + rng.uniform(1, 6), q))
                    detail = dict(q=q)
                elif kind == 'weight':
                    q = rng.choice(list(self.queues))
                    w = rng.randint(1, 5)
                    detail = dict(q=q, weight=w)
                    self.configure(conn, q, weight=w)
                    detail = dict(q=q, weight=w)
                elif kind == 'cap':
                    q = rng.choice(CAPPED)
                    c = rng.choice([1, 2, 3, 5, 8, 0])
                    detail = dict(q=q, max_in_flight=c)
                    self.configure(conn, q, max_in_flight=c)
                    detail = dict(q=q, max_in_flight=c)
                self.h.write('fault', kind=kind, t0=t0, t1=time.time(), **detail)
            except psycopg.Error as e:
                # the server went away under another fault's feet (or this
                # call's outcome is unknown): recorded, and a config change
                # whose COMMIT was lost is recorded as uncertain
                self.h.write('fault_error', kind=kind, t0=t0, t1=time.time(),
                             error=type(e).__name__, **detail)
                self.close(conn)
                conn = None
            finally:
                if crash:
                    self.crash_lock.release()
        # resume every queue before the drain (a pause whose COMMIT was
        # lost may have happened too)
        c = self.connect('soak-injector')
        for q in self.queues:
            self.configure(c, q, paused=False)
        c.close()
        self.close(conn)

    # --- sampler -----------------------------------------------------------
    def sampler(self):
        conn = None
        last_sizes = 0
        while not self.stop_sampler.wait(self.a.sample_interval):
            if conn is None or conn.closed:
                try:
                    conn = self.connect('soak-sampler', self.stop_sampler)
                except psycopg.Error:
                    continue
            try:
                t0 = time.time()
                wq = dict(conn.execute(
                    'SELECT queue, count(*) FROM pgqueue.work_queue GROUP BY queue').fetchall())
                cl = conn.execute(
                    "SELECT id::text, queue, extract(epoch FROM coalesce(lock_timeout, created)) "
                    "  FROM pgqueue.work_queue "
                    " WHERE coalesce(lock_timeout, created) < clock_timestamp() - interval '1 second'"
                    ).fetchall()
                # jobs of the uncapped queues due for over 5 s and still
                # not scheduled (the checker leaves out paused queues and
                # scheduler outages)
                due = conn.execute(
                    "SELECT id::text, queue, extract(epoch FROM run_after) FROM pgqueue.queue "
                    " WHERE state IN ('pending', 'retry') AND queue = ANY(%s) "
                    "   AND run_after < clock_timestamp() - interval '5 seconds' LIMIT 100",
                    ([q for q in self.queues
                      if q not in CAPPED and q not in RATED and q not in GROUPED],)).fetchall()
                # the most jobs of one group in flight (scheduled, running
                # or in retry), by grouped queue
                grp = dict(conn.execute(
                    "SELECT queue, max(n) FROM (SELECT queue, group_key, count(*) AS n "
                    "  FROM pgqueue.queue WHERE queue = ANY(%s) AND group_key IS NOT NULL "
                    "   AND state IN ('scheduled', 'retry') GROUP BY queue, group_key) g "
                    " GROUP BY queue", (GROUPED,)).fetchall())
                conn.commit()
                t1 = time.time()
                self.h.write('sample', wq=wq, claimable=[[i, q, float(s)] for i, q, s in cl],
                             due=[[i, q, float(s)] for i, q, s in due], grp=grp, t0=t0, t1=t1)
                if t1 - last_sizes >= self.a.sizes_interval:
                    last_sizes = t1
                    rows = conn.execute(
                        "SELECT c.relname, coalesce((SELECT sum(pg_total_relation_size(relid))::bigint "
                        "                              FROM pg_partition_tree(c.oid) WHERE isleaf), "
                        "                           pg_total_relation_size(c.oid)), "
                        "       (SELECT count(*) FROM pgqueue.queue), "
                        "       (SELECT count(*) FROM pgqueue.work_queue), "
                        "       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) "
                        "          FROM pg_partition_tree('pgqueue.archive')), "
                        "       (SELECT count(*) FROM pgqueue.archive) "
                        "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        " WHERE n.nspname = 'pgqueue' AND c.relname IN ('queue', 'work_queue', 'queues')"
                    ).fetchall()
                    conn.commit()
                    self.h.write('sizes', bytes={r[0]: r[1] for r in rows},
                                 queue_rows=rows[0][2], work_rows=rows[0][3],
                                 archive_bytes=int(rows[0][4]), archive_rows=rows[0][5])
            except psycopg.Error:
                self.close(conn)
                conn = None
        self.close(conn)

    # --- the run -----------------------------------------------------------
    def final_state(self):
        conn = self.connect('soak-final')
        for r in conn.execute(
                "SELECT id::text, queue, state::text, tries, last_error, dedup_key "
                "FROM pgqueue.queue ORDER BY id").fetchall():
            self.h.write('final_job', id=r[0], q=r[1], state=r[2], tries=r[3],
                         last_error=r[4], dedup=r[5])
        for r in conn.execute(
                "SELECT id::text, queue, lock_key, extract(epoch FROM lock_timeout), tries, "
                "       extract(epoch FROM created) "
                "FROM pgqueue.work_queue ORDER BY id").fetchall():
            self.h.write('final_work', id=r[0], q=r[1], holder=r[2],
                         lock_timeout=float(r[3]) if r[3] is not None else None, tries=r[4],
                         released=float(r[5]))
        for r in conn.execute(
                "SELECT id::text, queue, outcome, tries FROM pgqueue.archive ORDER BY id").fetchall():
            self.h.write('final_archive', id=r[0], q=r[1], outcome=r[2], tries=r[3])
        for r in conn.execute("SELECT id::text, holder FROM soak_done ORDER BY id").fetchall():
            self.h.write('final_done', id=r[0], holder=r[1])
        for r in conn.execute(
                "SELECT queue, weight, max_in_flight, max_tries, paused FROM pgqueue.queues").fetchall():
            self.h.write('final_queue', q=r[0], weight=r[1], max_in_flight=r[2],
                         max_tries=r[3], paused=r[4])
        conn.close()

    def log_line(self, line):
        """A line of the server log as the history quotes it."""
        return line.strip()[:300]

    def log_exempt(self, line):
        """A name under which a line of the server log that would count as
        an error is counted apart (a mode's expected errors), or None."""
        return None

    def server_log(self):
        counts = {}
        exempt = {}
        lines = []
        pat = re.compile(r'terminated by signal (\d+)|PANIC|TRAP:|was terminated by exception'
                         r'|server process .* exited with exit code|(ERROR|WARNING|FATAL):')
        # FATALs that the faults cause: connections refused while the
        # server restarts, the scheduler terminated
        expected = re.compile(r'FATAL:  (the database system is (not yet accepting connections|'
                              r'in recovery mode|shutting down|starting up)|terminating background '
                              r'worker "pgqueue scheduler" due to administrator command|'
                              r'terminating connection due to administrator command)')
        try:
            with open(self.a.logfile, errors='replace') as f:
                for line in f:
                    m = pat.search(line)
                    if not m or expected.search(line) or ' DEBUG:  ' in line:
                        continue
                    x = self.log_exempt(line)
                    if x is not None:
                        exempt[x] = exempt.get(x, 0) + 1
                        continue
                    k = ('signal %s' % m.group(1) if m.group(1) else
                         m.group(2) if m.group(2) else m.group(0).split()[0])
                    counts[k] = counts.get(k, 0) + 1
                    if len(lines) < 50 and not (m.group(1) == '9'):
                        lines.append(self.log_line(line))
        except OSError as e:
            lines.append('cannot read log: %r' % e)
        self.h.write('server_log', counts=counts, lines=lines, exempt=exempt)

    # --- a mode's hooks (ring.py) -----------------------------------------
    def more_threads(self):
        return []

    def end_of_run(self, threads):
        pass

    def after_drain(self):
        pass

    def run(self):
        a = self.a
        self.h.write('start', seconds=a.seconds, seed=a.seed, queues=self.queues, mode=a.mode,
                     producers=a.producers, consumers=a.consumers,
                     manual_schedulers=a.manual_schedulers,
                     fault_interval=a.fault_interval, naptime=a.naptime,
                     lease_choices=LEASES, pid=os.getpid(), **self.start_extra)
        self.setup()
        self.h.write('phase', name='run')
        threads = []
        kinds = ['single', 'batch', 'dedup']
        for n in range(a.producers):
            threads.append(('p', threading.Thread(target=self.guard, daemon=True,
                                                  args=('producer%d' % n, self.producer, n,
                                                        kinds[n % 3]))))
        # and one producer of flows (1.2)
        threads.append(('p', threading.Thread(target=self.guard, daemon=True,
                                              args=('producer%d' % a.producers, self.producer,
                                                    a.producers, 'flow'))))
        for n in range(a.consumers):
            threads.append(('c', threading.Thread(target=self.guard, daemon=True,
                                                  args=('consumer%d' % n, self.consumer, n))))
        for n in range(a.manual_schedulers):
            threads.append(('p', threading.Thread(target=self.guard, daemon=True,
                                                  args=('schedule%d' % n, self.manual_scheduler, n))))
        # a mode's own workers: 'p' stop with the producers, 'c' with the
        # consumers, 'r' at the end of the run before everything else
        for kind, name, fn, args in self.more_threads():
            threads.append((kind, threading.Thread(target=self.guard, daemon=True,
                                                   args=(name, fn) + tuple(args))))
        threads.append(('f', threading.Thread(target=self.guard, daemon=True,
                                              args=('injector', self.injector))))
        threads.append(('s', threading.Thread(target=self.guard, daemon=True,
                                              args=('sampler', self.sampler))))
        for _, t in threads:
            t.start()
        t_start = time.time()
        while time.time() - t_start < a.seconds:
            time.sleep(1)
            if a.progress and int(time.time() - t_start) % 60 == 0:
                print('soak: %d s' % int(time.time() - t_start), flush=True)
        self.end_of_run(threads)
        # drain: no more pushes or faults, consumers finish everything
        self.stop_faults.set()
        self.stop_producers.set()
        for k, t in threads:
            if k in 'pf':
                t.join(300)
        self.wait_server()
        self.draining.set()
        self.h.write('phase', name='drain')
        conn = self.connect('soak-drain')
        # the drain goes on while it makes progress: it ends drain_seconds
        # after what is left last went down (a backlog grown over an hour,
        # such as the ring mode's paused queue, takes minutes at the
        # consumers' pace), and after 30 minutes in any case
        deadline = time.time() + a.drain_seconds
        hard_deadline = time.time() + max(a.drain_seconds, 1800)
        least = None
        orphaned_since = None
        while time.time() < min(deadline, hard_deadline):
            # what is left, and of it the jobs 'scheduled' without a
            # work_queue row (lost: no claim can ever take them)
            left, orphans = conn.execute(
                "SELECT (SELECT count(*) FROM pgqueue.queue WHERE state <> 'failed') "
                "     + (SELECT count(*) FROM pgqueue.work_queue), "
                "       (SELECT count(*) FROM pgqueue.queue q WHERE q.state = 'scheduled' "
                "           AND NOT EXISTS (SELECT FROM pgqueue.work_queue w WHERE w.id = q.id))"
                ).fetchone()
            conn.commit()
            if left == 0:
                break
            if least is None or left < least:
                least = left
                deadline = time.time() + a.drain_seconds
            # only lost jobs left for 10 s: waiting longer drains nothing
            if left == orphans:
                orphaned_since = orphaned_since or time.time()
                if time.time() - orphaned_since > 10:
                    break
            else:
                orphaned_since = None
            time.sleep(0.5)
        conn.close()
        self.h.write('phase', name='drained', left=left, orphans=orphans, t=time.time())
        self.stop_consumers.set()
        for k, t in threads:
            if k == 'c':
                t.join(60)
        # a last sample after consumers stopped, then stop the sampler
        time.sleep(a.sample_interval * 2)
        self.stop_sampler.set()
        for k, t in threads:
            if k == 's':
                t.join(30)
        self.h.write('phase', name='final')
        self.final_state()
        self.after_drain()
        self.server_log()
        self.h.write('end', duration=time.time() - t_start, harness_errors=self.errors)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--dsn', required=True)
    p.add_argument('--datadir', required=True)
    p.add_argument('--pgbin', required=True)
    p.add_argument('--logfile', required=True)
    p.add_argument('--history', required=True)
    p.add_argument('--seconds', type=float, default=180)
    p.add_argument('--drain-seconds', type=float, default=120)
    p.add_argument('--producers', type=int, default=3)
    p.add_argument('--consumers', type=int, default=5)
    p.add_argument('--push-pause', type=float, default=0.3)
    p.add_argument('--manual-schedulers', type=int, default=1,
                   help='sessions calling pgq_schedule() besides the background scheduler')
    p.add_argument('--fault-interval', type=float, default=None,
                   help='mean seconds between faults (default 6, or seconds/20 for a run shorter '
                   'than 120 s, so that every kind of fault comes round)')
    p.add_argument('--sample-interval', type=float, default=0.5)
    p.add_argument('--sizes-interval', type=float, default=10)
    p.add_argument('--naptime', type=float, default=0.25)
    p.add_argument('--seed', type=int, default=int(time.time()))
    p.add_argument('--progress', action='store_true')
    p.add_argument('--mode', choices=['faults', 'ring'], default='faults',
                   help='ring: the ring mode\'s workers too (ring.py; its options there)')
    a, rest = p.parse_known_args()
    if a.fault_interval is None:
        a.fault_interval = min(6.0, max(1.5, a.seconds / 20))
    if a.mode == 'ring':
        import ring
        ring.main(a, rest)
    else:
        if rest:
            p.error('unrecognized arguments: %s' % ' '.join(rest))
        Soak(a).run()


if __name__ == '__main__':
    main()
