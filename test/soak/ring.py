#!/usr/bin/python3
"""
The soak's ring mode: soak.py's producers, consumers, fault
injector and sampler, on a server whose rings of slots turn fast
(pgqueue.slot_size = 64 kB, pgqueue.naptime = 50 ms: run.sh sets them),
plus the workers that drive what a turn of the ring can break:

  pushers      single pushes into ring_x (sparse: what waiting claims wait
               for), and pushes of ~1 kB jobs into ring_paused, a queue
               paused for the whole run (its rows fill the slots of
               pgqueue.queue and stay: the scheduler moves them to slot 0),
               each with a row in table soak_paused_pushed in the same
               transaction (what a snapshot must see as many jobs of)
  waiters      filtered blocking claims, pgq_claim(key, n, lease,
               ARRAY[...ring_x...], wait => 0.2 to 15 s), then ack or nack
  tx workers   calls inside multi-statement transactions: push into
               ring_tx, claim (filtered or not, sometimes waiting), ack
               (with the work row), nack, extend (the job is acked in the
               next transaction), push again; COMMIT, sometimes ROLLBACK
  rr workers   claim with a long lease, then ack, nack or extend under
               REPEATABLE READ in a transaction whose snapshot was taken
               up to 12 s earlier (so that the job's rows may have moved to
               another slot meanwhile); 40001 is a clean answer: the call
               is made again in a new transaction
  snapshots    REPEATABLE READ readers of pgqueue.jobs on the primary: the
               snapshot is taken, then every job is read twice, seconds
               apart; no job may vanish, appear or change between the two,
               and ring_paused has as many jobs as soak_paused_pushed rows
  standby      REPEATABLE READ readers on a streaming hot standby (run.sh
               makes it with pg_basebackup, hot_standby_feedback = on): the
               snapshot is taken, then ring_paused's jobs are counted twice,
               seconds apart, each time with soak_paused_pushed: all equal;
               a query cancelled by a replay conflict is counted apart
  pg_dump      pg_dump -Fc of the database in a loop: every run must succeed
               (a run cut by an injected crash, with a lost connection, is
               counted apart)
  restore      once (at --restore-at of the run), the newest dump restored
               with pg_restore into database soak_restore, which
               pgqueue.database names (its scheduler runs), with no crash
               injected meanwhile; then the jobs, archive rows and queue
               settings of the dump are looked for in it, at once and again
               at the end of the run
  ring sampler pgqueue.slots and the slots' relfilenodes every 0.2 s: the
               ring's turns, slots made, truncated and dropped

Events (besides soak.py's; calls of these workers carry ctx: wait, tx or
rr, and sqlstate when they failed):
  ring          slots [[tbl, slot, state, since]], parts [[parent, relname,
                oid, relfilenode]]: written when either changed
  tx            holder, outcome (commit, rollback, error, uncertain),
                pushes, claims, calls, sqlstate
  claim_rb      id, holder, t0, t1: a claim rolled back with its
                transaction (the row was locked, not claimable, meanwhile)
  snap          where (primary, standby), status (ok, cancelled, error),
                ref [3 counts of soak_paused_pushed], paused [2 counts of
                ring_paused's jobs], rows, vanished, appeared, changed, lag
  dump          n, rc, err (first lines of stderr), bytes
  restore       dump, rc, errors, dump_jobs [[id, q, state]], dump_archive,
                dump_queues {q: [weight, max_in_flight, max_tries, paused]}
  restore_check when (after, final), jobs [[id, q, state]], work, archive,
                queues
  ring_log      moved {tbl: rows}, moves {tbl: statements}, dropped {tbl:
                n}, upkeep (the scheduler's DEBUG1 "could not ...")
  standby_log   counts, lines
"""
import argparse
import json
import os
import random
import re
import subprocess
import threading
import time

import psycopg

import soak
from soak import DONE_SQL

PAUSED = 'ring_paused'
RING_QUEUES = {
    # pushed sparsely; what the waiters' filtered claims wait for
    'ring_x': dict(weight=1, max_in_flight=0, max_tries=5),
    # the tx workers' pushes
    'ring_tx': dict(weight=1, max_in_flight=0, max_tries=5),
    # paused from the start to the drain
    PAUSED: dict(weight=1, max_in_flight=0, max_tries=5),
}
CLAIM_SQL = ('SELECT id, queue, tries, version, extract(epoch FROM lock_timeout) '
             'FROM pgq_claim(%s, %s, make_interval(secs => %s), %s, make_interval(secs => %s))')
# a connection lost (crash restart, immediate stop): not an answer
LOST = re.compile(r'server closed the connection|terminating connection because of crash|'
                  r'the database system is (in recovery mode|starting up|shutting down|'
                  r'not yet accepting)|could not connect|connection to server .* failed|'
                  r'no connection to the server|consuming input failed|'
                  r'terminating connection due to administrator command|'
                  r'could not receive data from server|lost synchronization')


class Sess:
    """One connection of a worker, made again after an error."""

    def __init__(self, soak_, app, stop, dsn=None, iso=None, statement_timeout='20s'):
        self.s = soak_
        self.app = app
        self.stop = stop
        self.dsn = dsn
        self.iso = iso
        self.statement_timeout = statement_timeout
        self.conn = None

    def get(self, timeout=300):
        if self.conn is None or self.conn.closed:
            self.conn = self.s.connect_to(self.dsn, self.app, self.stop, timeout,
                                          self.statement_timeout)
            if self.iso is not None:
                self.conn.isolation_level = self.iso
        return self.conn

    def drop(self):
        soak.Soak.close(self.conn)
        self.conn = None


def sqlstate(e):
    return getattr(e, 'sqlstate', None)


class RingSoak(soak.Soak):
    def __init__(self, a):
        super().__init__(a)
        self.queues.update(RING_QUEUES)
        self.no_pause.add(PAUSED)
        self.stop_ring = threading.Event()
        self.t_start = None
        self.dumps = []         # (n, path) of the dumps that succeeded, newest last
        self.dumps_lock = threading.Lock()
        self.keep_dump = None   # the path of the dump restored
        self.restored = False
        self.sched_pids = {}    # pid -> database of the pgqueue schedulers seen
        self.start_extra = dict(standby=bool(a.standby_dsn), restore=bool(a.restore_dsn))

    # --- connections -------------------------------------------------------
    def connect_to(self, dsn, app, stop=None, timeout=120, statement_timeout='20s'):
        deadline = time.time() + timeout
        while True:
            try:
                return psycopg.connect(dsn or self.a.dsn, application_name=app,
                                       connect_timeout=3,
                                       options='-c statement_timeout=%s' % statement_timeout)
            except psycopg.Error:
                if (stop is not None and stop.is_set()) or time.time() > deadline:
                    raise
                time.sleep(0.2)

    def set_key(self, n, key):
        with self.keys_lock:
            self.keys[n] = key
        return key

    def commit_status(self, conn, who):
        """COMMIT (maybe with the injected SIGKILL): ok, uncertain or error."""
        try:
            self.commit(conn, who)
            return 'ok', None
        except psycopg.OperationalError as e:
            return 'uncertain', sqlstate(e)
        except psycopg.Error as e:
            return 'error', sqlstate(e)

    def call(self, s, who, sql, args, work=(), need=None):
        """A call and its work in a transaction of their own: (value,
        status, sqlstate); status 'rollback' when need(value) was false."""
        try:
            conn = s.get()
            for wsql, wargs in work:
                conn.execute(wsql, wargs)
            val = conn.execute(sql, args).fetchone()[0]
            if need is not None and not need(val):
                conn.rollback()
                return val, 'rollback', None
        except psycopg.Error as e:
            s.drop()
            return None, 'error', sqlstate(e)
        st, code = self.commit_status(s.conn, who)
        if st != 'ok':
            s.drop()
        return (val if st != 'error' else None), st, code

    def ack(self, s, key, jid, ctx):
        t0 = time.time()
        r, st, code = self.call(s, key, 'SELECT pgq_ack(%s, %s)', (jid, key),
                                work=[(DONE_SQL, (jid, key))], need=lambda r: r is True)
        if st == 'rollback':
            st = 'ok'
        self.h.write('ack', id=jid, holder=key, result=r, status=st, ctx=ctx, sqlstate=code,
                     t0=t0, t1=time.time())

    def nack(self, s, key, jid, ctx, rng):
        t0 = time.time()
        r, st, code = self.call(s, key, 'SELECT pgq_nack(%s, %s, %s, make_interval(secs => %s))',
                                (jid, key, 'soak nack by %s' % key, round(rng.uniform(0, 1.0), 2)))
        self.h.write('nack', id=jid, holder=key, result=r, status=st, ctx=ctx, sqlstate=code,
                     t0=t0, t1=time.time())

    def resolve_push(self, n, ids, q):
        """An uncertain push looked up after reconnecting (as soak.py's
        producers do)."""
        try:
            conn = self.connect('soak-ring-resolve-%d' % n, timeout=300)
            found = conn.execute(
                'SELECT (SELECT count(*) FROM pgqueue.queue WHERE id = ANY(%s::uuid[]))'
                '     + (SELECT count(*) FROM pgqueue.archive WHERE id = ANY(%s::uuid[]))',
                (ids, ids)).fetchone()[0]
            conn.commit()
            conn.close()
            self.h.write('push_resolved', ids=ids, q=q, by=n, dedup=None, found=found)
        except psycopg.Error:
            pass

    # --- setup -------------------------------------------------------------
    def setup(self):
        super().setup()
        conn = self.connect('soak-setup')
        conn.execute('CREATE TABLE IF NOT EXISTS soak_paused_pushed (id uuid PRIMARY KEY)')
        conn.commit()
        self.configure(conn, PAUSED, paused=True)
        conn.close()

    # --- pushers -----------------------------------------------------------
    def pusher(self, n, q, pause, big):
        """Single pushes into q; into ring_paused with a ~1 kB payload and
        a row of soak_paused_pushed in the same transaction."""
        rng = random.Random(self.a.seed * 37 + n)
        s = Sess(self, 'soak-ring-push-%d' % n, self.stop_producers)
        seq = 0
        while not self.stop_producers.is_set():
            try:
                conn = s.get()
            except psycopg.Error:
                continue
            seq += 1
            prio = 0 if big else rng.choice([0, 0, 1, -1])
            payload = {'p': n, 'n': seq}
            if big:
                payload['pad'] = 'x' * rng.randint(500, 1500)
            t0 = time.time()
            try:
                jid = str(conn.execute('SELECT pgq_push(%s, %s::jsonb, NULL, %s)',
                                       (q, json.dumps(payload), prio)).fetchone()[0])
                if q == PAUSED:
                    conn.execute('INSERT INTO soak_paused_pushed (id) VALUES (%s)', (jid,))
            except psycopg.Error as e:
                self.h.write('push_error', by=n, q=q, t0=t0, t1=time.time(),
                             error=type(e).__name__, sqlstate=sqlstate(e))
                s.drop()
                continue
            st, _ = self.commit_status(conn, 'ring-push-%d' % n)
            self.h.write('push', ids=[jid], q=q, by=n, kind='ring', prio=prio, delay=None,
                         dedup=None, status=st, t0=t0, t1=time.time())
            if st != 'ok':
                s.drop()
            if st == 'uncertain':
                self.resolve_push(n, [jid], q)
            time.sleep(rng.uniform(0, 2 * pause))
        s.drop()

    # --- waiters: filtered blocking claims ------------------------------------
    def waiter(self, n):
        rng = random.Random(self.a.seed * 41 + n)
        key = self.set_key(n, 'w%d' % n)
        s = Sess(self, 'soak-ring-wait-%d' % n, self.stop_consumers)
        filters = [['ring_x'], ['ring_x'], ['ring_x', 'soak_plain'], ['ring_x', 'ring_tx']]
        while not self.stop_consumers.is_set():
            try:
                conn = s.get()
            except psycopg.Error:
                continue
            qs = rng.choice(filters)
            wait = rng.choice([0.2, 0.5, 1, 2, 5, 15])
            lease = rng.choice([3, 5, 8])
            max_items = rng.choice([1, 1, 2, 3])
            t0 = time.time()
            try:
                rows = conn.execute(CLAIM_SQL, (key, max_items, lease, qs, wait)).fetchall()
            except psycopg.Error as e:
                self.h.write('call_error', call='claim', holder=key, ctx='wait',
                             sqlstate=sqlstate(e), error=str(e).strip()[:200],
                             t0=t0, t1=time.time())
                s.drop()
                continue
            st, _ = self.commit_status(conn, key)
            if st != 'ok':
                self.h.write('claim_uncertain', holder=key, t0=t0, t1=time.time())
                s.drop()
                continue
            t1 = time.time()
            if not rows:
                self.h.write('idle', holder=key, queues=qs, wait=wait, ctx='wait', t0=t0, t1=t1)
                continue
            self.busy[n] = time.time()
            jobs = []
            for jid, q, tries, version, lt in rows:
                jid = str(jid)
                jobs.append(jid)
                self.h.write('claim', id=jid, q=q, holder=key, tries=tries, version=version,
                             lock_timeout=float(lt), lease=lease, wait=wait, ctx='wait',
                             t0=t0, t1=t1)
            for jid in jobs:
                time.sleep(rng.uniform(0, 0.05))
                if rng.random() < 0.85:
                    self.ack(s, key, jid, 'wait')
                else:
                    self.nack(s, key, jid, 'wait', rng)
            self.busy.pop(n, None)
        s.drop()

    # --- tx workers: calls inside multi-statement transactions -----------------
    def tx_worker(self, n):
        rng = random.Random(self.a.seed * 43 + n)
        key = self.set_key(n, 't%d' % n)
        s = Sess(self, 'soak-ring-tx-%d' % n, self.stop_consumers)
        held = []       # jobs extended in a committed transaction: acked in the next
        filters = [['ring_tx'], ['ring_tx'], ['ring_x'], ['soak_plain'], ['ring_tx', 'ring_x'], None]
        seq = 0
        while not self.stop_consumers.is_set():
            try:
                conn = s.get()
            except psycopg.Error:
                continue
            pushing = not self.stop_producers.is_set()
            t0 = time.time()
            pushes = []
            claims = []         # (id, q, tries, version, lt, lease, tc0, tc1)
            calls = []          # (call, id, result, ta0, lease)
            idle = None
            qs = rng.choice(filters)
            lease = rng.choice([8, 10, 15])
            wait = rng.choice([0, 0, 0, 0.2, 0.5])
            try:
                if pushing and rng.random() < 0.8:
                    for i in range(rng.choice([1, 1, 2])):
                        seq += 1
                        pushes.append(str(conn.execute(
                            'SELECT pgq_push(%s, %s::jsonb)',
                            ('ring_tx', json.dumps({'t': n, 'n': seq, 'i': i}))).fetchone()[0]))
                time.sleep(rng.uniform(0, 1.5))
                # the jobs extended in the last transaction: acked in this one
                for jid in held:
                    ta0 = time.time()
                    r = conn.execute('SELECT pgq_ack(%s, %s)', (jid, key)).fetchone()[0]
                    if r is True:
                        conn.execute(DONE_SQL, (jid, key))
                    calls.append(('ack', jid, r, ta0, None))
                tc0 = time.time()
                rows = conn.execute(CLAIM_SQL, (key, rng.choice([1, 2, 3]), lease, qs, wait)).fetchall()
                tc1 = time.time()
                if not rows:
                    idle = (qs, tc0, tc1)
                for jid, q, tries, version, lt in rows:
                    claims.append((str(jid), q, tries, version, float(lt), lease, tc0, tc1))
                time.sleep(rng.uniform(0, 1.0))
                for jid, *_ in claims:
                    x = rng.random()
                    ta0 = time.time()
                    if x < 0.7:
                        r = conn.execute('SELECT pgq_ack(%s, %s)', (jid, key)).fetchone()[0]
                        if r is True:
                            conn.execute(DONE_SQL, (jid, key))
                        calls.append(('ack', jid, r, ta0, None))
                    elif x < 0.85:
                        r = conn.execute('SELECT pgq_nack(%s, %s, %s, make_interval(secs => %s))',
                                         (jid, key, 'soak nack by %s' % key,
                                          round(rng.uniform(0, 1.0), 2))).fetchone()[0]
                        calls.append(('nack', jid, r, ta0, None))
                    else:
                        r = conn.execute('SELECT extract(epoch FROM pgq_extend(%s, %s, '
                                         'make_interval(secs => %s)))', (jid, key, lease)).fetchone()[0]
                        calls.append(('extend', jid, float(r) if r is not None else None, ta0, lease))
                if pushing and rng.random() < 0.3:
                    seq += 1
                    pushes.append(str(conn.execute(
                        'SELECT pgq_push(%s, %s::jsonb)',
                        ('ring_tx', json.dumps({'t': n, 'n': seq, 'late': True}))).fetchone()[0]))
                rollback = rng.random() < 0.12
                if rollback:
                    conn.rollback()
                    st, code = 'rollback', None
                else:
                    st, code = self.commit_status(conn, key)
            except psycopg.Error as e:
                # rolled back: nothing of it happened
                st, code = 'error', sqlstate(e)
                s.drop()
            t1 = time.time()
            if st not in ('ok', 'rollback', 'error'):
                s.drop()
            self.record_tx(key, st, code, t0, t1, pushes, claims, calls, idle, n)
            if idle is not None:
                self.h.write('idle', holder=key, queues=idle[0], wait=wait, ctx='tx',
                             t0=idle[1], t1=idle[2])
            if st == 'ok':
                done = {c[1] for c in calls if c[0] in ('ack', 'nack')}
                held = [c[1] for c in calls if c[0] == 'extend' and c[2] is not None
                        and c[1] not in done]
            elif st == 'uncertain':
                held = []
            # (rolled back: the held jobs are still held, as before)
            if not self.draining.is_set():
                time.sleep(rng.uniform(0, 0.3))
        s.drop()

    def record_tx(self, key, st, code, t0, t1, pushes, claims, calls, idle, n):
        """The events of one multi-statement transaction, by its outcome."""
        committed = st in ('ok', 'uncertain')
        if pushes:
            self.h.write('push', ids=pushes, q='ring_tx', by=n, kind='tx', prio=0, delay=None,
                         dedup=None, status=st if committed else 'error', t0=t0, t1=t1)
            if st == 'uncertain':
                self.resolve_push(n, pushes, 'ring_tx')
        if st == 'ok':
            for jid, q, tries, version, lt, lease, tc0, tc1 in claims:
                # t1: when the claim returned (the same transaction's calls
                # come after it); commit: when it took effect for others
                self.h.write('claim', id=jid, q=q, holder=key, tries=tries, version=version,
                             lock_timeout=lt, lease=lease, ctx='tx', t0=tc0, t1=tc1, commit=t1)
        elif st == 'uncertain':
            if claims:
                self.h.write('claim_uncertain', holder=key, t0=t0, t1=t1)
        else:
            for c in claims:
                self.h.write('claim_rb', id=c[0], holder=key, t0=c[6], t1=t1)
        if committed:
            for call, jid, r, ta0, lease in calls:
                kw = dict(id=jid, holder=key, result=r, status=st, ctx='tx', t0=ta0, t1=t1)
                if call == 'extend':
                    kw['lease'] = lease
                self.h.write(call, **kw)
        self.h.write('tx', holder=key, outcome=st, sqlstate=code, pushes=len(pushes),
                     claims=len(claims), calls=len(calls), t0=t0, t1=t1)

    # --- rr workers: acks, nacks, extends under REPEATABLE READ ---------------
    def rr_worker(self, n):
        rng = random.Random(self.a.seed * 47 + n)
        key = self.set_key(n, 'r%d' % n)
        sc = Sess(self, 'soak-ring-rrclaim-%d' % n, self.stop_consumers)
        sr = Sess(self, 'soak-rr-%d' % n, self.stop_consumers,
                  iso=psycopg.IsolationLevel.REPEATABLE_READ)
        filters = [['soak_plain', 'ring_x', 'ring_tx'], ['ring_tx'], ['soak_plain'], ['ring_x']]
        while not self.stop_consumers.is_set():
            try:
                conn = sc.get()
            except psycopg.Error:
                continue
            qs = rng.choice(filters)
            lease = rng.choice([20, 30])
            t0 = time.time()
            try:
                rows = conn.execute(CLAIM_SQL, (key, rng.choice([1, 1, 2]), lease, qs, 0.5)).fetchall()
            except psycopg.Error as e:
                self.h.write('call_error', call='claim', holder=key, ctx='rr',
                             sqlstate=sqlstate(e), error=str(e).strip()[:200],
                             t0=t0, t1=time.time())
                sc.drop()
                continue
            st, _ = self.commit_status(conn, key)
            if st != 'ok':
                self.h.write('claim_uncertain', holder=key, t0=t0, t1=time.time())
                sc.drop()
                continue
            t1 = time.time()
            if not rows:
                self.h.write('idle', holder=key, queues=qs, wait=0.5, ctx='rr', t0=t0, t1=t1)
                continue
            self.busy[n] = time.time()
            jobs = []
            for jid, q, tries, version, lt in rows:
                jid = str(jid)
                jobs.append(jid)
                self.h.write('claim', id=jid, q=q, holder=key, tries=tries, version=version,
                             lock_timeout=float(lt), lease=lease, ctx='rr', t0=t0, t1=t1)
            for jid in jobs:
                hold = rng.uniform(0, 12) if not self.draining.is_set() else rng.uniform(0, 0.5)
                x = rng.random()
                if x < 0.7:
                    self.rr_call(sr, key, jid, 'ack', hold)
                elif x < 0.85:
                    self.rr_call(sr, key, jid, 'nack', hold, rng)
                else:
                    r = self.rr_call(sr, key, jid, 'extend', hold, lease=lease)
                    if r is not None:
                        self.rr_call(sr, key, jid, 'ack', rng.uniform(0, 2))
            self.busy.pop(n, None)
        sc.drop()
        sr.drop()

    def rr_call(self, s, key, jid, call, hold, rng=None, lease=None):
        """One ack, nack or extend under REPEATABLE READ, in a transaction
        whose snapshot was taken hold seconds before the call; made again
        in a new transaction (at once) after each 40001, up to 20 times.
        Writes the event; returns the answer (None when refused or not
        had)."""
        attempts = 0
        t_first = time.time()
        while True:
            t0 = time.time()
            try:
                conn = s.get()
                # the snapshot: the work reads whether it was done already
                conn.execute('SELECT count(*) FROM soak_done WHERE id = %s', (jid,)).fetchone()
                if hold > 0:
                    time.sleep(hold)
                if call == 'ack':
                    conn.execute(DONE_SQL, (jid, key))
                    r = conn.execute('SELECT pgq_ack(%s, %s)', (jid, key)).fetchone()[0]
                    if r is not True:
                        conn.rollback()
                elif call == 'nack':
                    r = conn.execute('SELECT pgq_nack(%s, %s, %s, make_interval(secs => %s))',
                                     (jid, key, 'soak nack by %s' % key,
                                      round(rng.uniform(0, 1.0), 2))).fetchone()[0]
                else:
                    r = conn.execute('SELECT extract(epoch FROM pgq_extend(%s, %s, '
                                     'make_interval(secs => %s)))', (jid, key, lease)).fetchone()[0]
                    r = float(r) if r is not None else None
            except psycopg.Error as e:
                code = sqlstate(e)
                s.drop()
                if code == '40001' and attempts < 20:
                    attempts += 1
                    hold = 0
                    continue
                kw = dict(lease=lease) if call == 'extend' else {}
                self.h.write(call, id=jid, holder=key, result=None, status='error', ctx='rr',
                             sqlstate=code, error=str(e).strip()[:200], attempts=attempts,
                             t0=t_first, t_last=t0, t1=time.time(), **kw)
                return None
            if call == 'ack' and r is not True:
                st, code = 'ok', None       # refused: rolled back, nothing to commit
            else:
                st, code = self.commit_status(conn, key)
                if st != 'ok':
                    s.drop()
                if st == 'error':
                    r = None
            kw = dict(lease=lease) if call == 'extend' else {}
            self.h.write(call, id=jid, holder=key, result=r, status=st, ctx='rr', sqlstate=code,
                         attempts=attempts, hold=round(hold, 2), t0=t_first, t_last=t0,
                         t1=time.time(), **kw)
            return r if st in ('ok', 'uncertain') else None

    # --- snapshot readers ------------------------------------------------------
    def snap_reader(self, n, where):
        rng = random.Random(self.a.seed * 53 + n)
        dsn = self.a.standby_dsn if where == 'standby' else self.a.dsn
        # on the standby, a query may wait for the replay of a TRUNCATE or
        # DROP, which waits up to max_standby_streaming_delay (30 s) for
        # the readers that hold the slot: no timeout of ours cuts it first
        s = Sess(self, 'soak-ring-snap-%s-%d' % (where, n), self.stop_ring, dsn=dsn,
                 iso=psycopg.IsolationLevel.REPEATABLE_READ,
                 statement_timeout='20s' if where == 'primary' else '90s')
        full = where == 'primary'
        count_sql = ('SELECT (SELECT count(*) FROM pgqueue.jobs WHERE queue = %s), '
                     '       (SELECT count(*) FROM soak_paused_pushed)')
        # every column, the clock-made state ('running' while the lease
        # holds) read as 'scheduled', the payload as its md5
        rows_sql = ("SELECT id::text, queue, CASE WHEN state = 'running' THEN 'scheduled' "
                    "ELSE state END, priority, run_after::text, created::text, tries, max_tries, "
                    "lock_key, lock_timeout::text, last_error, md5(payload::text) FROM pgqueue.jobs")
        while not self.stop_ring.is_set():
            try:
                conn = s.get(timeout=60)
            except psycopg.Error:
                self.stop_ring.wait(1)
                continue
            t0 = time.time()
            lag = None
            ref = []
            paused = []
            reads = []
            try:
                if where == 'standby':
                    lag = conn.execute('SELECT extract(epoch FROM now() - '
                                       'pg_last_xact_replay_timestamp())').fetchone()[0]
                    lag = float(lag) if lag is not None else None
                    conn.commit()
                # the snapshot (it locks none of pgqueue's tables)
                ref.append(conn.execute('SELECT count(*) FROM soak_paused_pushed').fetchone()[0])
                # the longer the first gap, the likelier a TRUNCATE of a slot
                # the snapshot can see lands in it
                for gap in (rng.uniform(1, 5), rng.uniform(1.5, 4)):
                    if self.stop_ring.wait(gap):
                        break
                    c, r = conn.execute(count_sql, (PAUSED,)).fetchone()
                    paused.append(c)
                    ref.append(r)
                    if full:
                        reads.append({row[0]: row[1:] for row in conn.execute(rows_sql).fetchall()})
                conn.commit()
                st, err = 'ok', None
            except psycopg.Error as e:
                err = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                s.drop()
                if sqlstate(e) == '42P01' and not ref:
                    # the standby has not replayed the setup yet
                    self.stop_ring.wait(0.5)
                    continue
                # a replay conflict: cancelled, or a deadlock with the
                # startup process (it waits for the reader's lock on a
                # slot, the reader for its lock on another)
                st = ('cancelled' if 'conflict with recovery' in str(e) or
                      (where == 'standby' and sqlstate(e) == '40P01') else
                      'stalled' if sqlstate(e) == '57014' else 'error')
            kw = {}
            if len(reads) == 2:
                a, b = reads
                kw['rows'] = len(a)
                kw['vanished'] = [i for i in a if i not in b][:20]
                kw['appeared'] = [i for i in b if i not in a][:20]
                kw['changed'] = [[i, list(a[i]), list(b[i])] for i in a
                                 if i in b and a[i] != b[i]][:20]
            self.h.write('snap', where=where, n=n, status=st, error=err, ref=ref, paused=paused,
                         lag=lag, t0=t0, t1=time.time(), **kw)
            if st != 'ok':
                self.stop_ring.wait(0.5)
        s.drop()

    # --- pg_dump in a loop, and a restore ----------------------------------------
    def dumper(self):
        rng = random.Random(self.a.seed * 59)
        os.makedirs(self.a.dump_dir, exist_ok=True)
        n = 0
        while not self.stop_ring.is_set():
            n += 1
            path = os.path.join(self.a.dump_dir, 'dump-%d.pgdump' % n)
            t0 = time.time()
            try:
                p = subprocess.run([os.path.join(self.a.pgbin, 'pg_dump'), '-Fc', '-f', path,
                                    '-d', self.a.dsn], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=600)
                rc, err = p.returncode, p.stderr.decode(errors='replace').strip().splitlines()
            except subprocess.TimeoutExpired:
                rc, err = -1, ['pg_dump ran over 600 s']
            size = os.path.getsize(path) if os.path.exists(path) else None
            self.h.write('dump', n=n, rc=rc, err=err[:6], bytes=size, t0=t0, t1=time.time())
            with self.dumps_lock:
                if rc == 0:
                    self.dumps.append((n, path))
                elif os.path.exists(path):
                    os.unlink(path)
                # keep the last three, and the one restored
                while len(self.dumps) > 3:
                    old = self.dumps.pop(0)[1]
                    if old != self.keep_dump and os.path.exists(old):
                        os.unlink(old)
            self.stop_ring.wait(rng.uniform(0.5, 2.5))

    @staticmethod
    def dump_rows(pgbin, path):
        """The rows of the dump's job tables, archive and queue settings
        (pg_restore -a to SQL, its COPY blocks read)."""
        out = subprocess.run([os.path.join(pgbin, 'pg_restore'), '-a', '-f', '-', path],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        jobs, work, archive, queues = [], [], [], {}
        table = cols = None
        for line in out.stdout.decode(errors='replace').splitlines():
            if table is None:
                m = re.match(r'^COPY (\S+) \((.*)\) FROM stdin;$', line)
                if m:
                    table = m.group(1).replace('"', '')
                    cols = [c.strip().strip('"') for c in m.group(2).split(',')]
                continue
            if line == '\\.':
                table = None
                continue
            v = dict(zip(cols, line.split('\t')))
            if re.match(r'^pgqueue\.queue_\d+$', table):
                jobs.append([v['id'], v['queue'], v['state']])
            elif re.match(r'^pgqueue\.work_queue_\d+$', table):
                work.append(v['id'])
            elif re.match(r'^pgqueue\.archive_\d+$', table):
                archive.append(v['id'])
            elif table == 'pgqueue.queues':
                queues[v['queue']] = [int(v['weight']), int(v['max_in_flight']),
                                      int(v['max_tries']), v['paused'] == 't']
        return out.returncode, jobs, work, archive, queues

    def restore_check(self, when):
        try:
            conn = self.connect_to(self.a.restore_dsn, 'soak-ring-restore-check', timeout=120)
            jobs = [list(r) for r in conn.execute(
                'SELECT id::text, queue, state::text FROM pgqueue.queue').fetchall()]
            work = [r[0] for r in conn.execute('SELECT id::text FROM pgqueue.work_queue').fetchall()]
            archive = [r[0] for r in conn.execute('SELECT id::text FROM pgqueue.archive').fetchall()]
            queues = {r[0]: [r[1], r[2], r[3], r[4]] for r in conn.execute(
                'SELECT queue, weight, max_in_flight, max_tries, paused FROM pgqueue.queues').fetchall()}
            conn.close()
            self.h.write('restore_check', when=when, jobs=jobs, work=work, archive=archive,
                         queues=queues)
        except psycopg.Error as e:
            self.h.write('restore_check', when=when, error=str(e).strip()[:300])

    def restorer(self):
        at = self.t_start + max(20.0, self.a.restore_at * self.a.seconds)
        while time.time() < at and not self.stop_ring.wait(0.5):
            pass
        # the newest dump that succeeded (waiting up to a minute for one)
        deadline = time.time() + 60
        while True:
            with self.dumps_lock:
                if self.dumps:
                    n, path = self.dumps[-1]
                    self.keep_dump = path
                    break
            if time.time() > deadline:
                self.h.write('restore', dump=None, rc=None, errors=['no dump succeeded'],
                             t0=time.time(), t1=time.time())
                return
            time.sleep(0.5)
        rc_parse, jobs, work, archive, queues = self.dump_rows(self.a.pgbin, path)
        # no crash injected during the restore and the first look
        with self.crash_lock:
            t0 = time.time()
            p = subprocess.run([os.path.join(self.a.pgbin, 'pg_restore'), '-d', self.a.restore_dsn,
                                path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=900)
            t1 = time.time()
            err = p.stderr.decode(errors='replace').strip().splitlines()
            self.h.write('restore', dump=n, path=path, rc=p.returncode, parse_rc=rc_parse,
                         errors=err[:30], n_errors=sum(1 for l in err if 'error:' in l),
                         dump_jobs=jobs, dump_work=work, dump_archive=archive, dump_queues=queues,
                         t0=t0, t1=t1)
            time.sleep(2)
            self.restore_check('after')
        self.restored = True

    # --- the ring sampler --------------------------------------------------------
    def ring_sampler(self):
        s = Sess(self, 'soak-ring-sampler', self.stop_sampler)
        last = None
        while not self.stop_sampler.wait(self.a.ring_interval):
            try:
                conn = s.get()
                slots = [[r[0], r[1], r[2], float(r[3])] for r in conn.execute(
                    'SELECT tbl, slot, state, extract(epoch FROM since) FROM pgqueue.slots '
                    'ORDER BY 1, 2').fetchall()]
                # pg_inherits: no lock on any slot
                parts = [list(r) for r in conn.execute(
                    "SELECT p.relname::text, c.relname::text, c.oid::int8, c.relfilenode::int8 "
                    "  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "  JOIN pg_class p ON p.oid = i.inhparent "
                    " WHERE p.relnamespace = 'pgqueue'::regnamespace "
                    "   AND p.relname IN ('queue', 'work_queue') ORDER BY 1, 2").fetchall()]
                conn.commit()
            except psycopg.Error:
                s.drop()
                continue
            try:
                # which scheduler's DEBUG1 lines are database soak's
                for pid, db in conn.execute("SELECT pid, datname::text FROM pg_stat_activity "
                                            "WHERE backend_type = 'pgqueue scheduler'").fetchall():
                    self.sched_pids[pid] = db
                conn.commit()
            except psycopg.Error:
                s.drop()
            if (slots, parts) != last:
                last = (slots, parts)
                self.h.write('ring', slots=slots, parts=parts)
        s.drop()

    # --- hooks ---------------------------------------------------------------------
    def more_threads(self):
        a = self.a
        t = [('p', 'ring-push-x', self.pusher, (100, 'ring_x', a.x_pause, False)),
             ('p', 'ring-push-paused', self.pusher, (101, PAUSED, a.paused_pause, True))]
        for i in range(a.waiters):
            t.append(('c', 'ring-wait%d' % i, self.waiter, (110 + i,)))
        for i in range(a.tx_workers):
            t.append(('c', 'ring-tx%d' % i, self.tx_worker, (120 + i,)))
        for i in range(a.rr_workers):
            t.append(('c', 'ring-rr%d' % i, self.rr_worker, (130 + i,)))
        for i in range(a.snap_readers):
            t.append(('r', 'ring-snap%d' % i, self.snap_reader, (i, 'primary')))
        if a.standby_dsn:
            for i in range(a.standby_readers):
                t.append(('r', 'ring-standby%d' % i, self.snap_reader, (i, 'standby')))
        t.append(('r', 'ring-dump', self.dumper, ()))
        if a.restore_dsn:
            t.append(('r', 'ring-restore', self.restorer, ()))
        t.append(('s', 'ring-sampler', self.ring_sampler, ()))
        self.t_start = time.time()
        return t

    def end_of_run(self, threads):
        # the readers, dumps and the restore end first: the injector then
        # resumes ring_paused with every queue, for the drain
        self.stop_ring.set()
        for k, t in threads:
            if k == 'r':
                t.join(900)

    def after_drain(self):
        if self.restored:
            self.restore_check('final')

    def log_line(self, line):
        # a scheduler's line says nothing of its database
        line = super().log_line(line)
        m = re.search(r' \[(\d+)\] pgqueue scheduler ', line)
        if m:
            line += ' [database %s]' % self.sched_pids.get(int(m.group(1)), 'unknown')
        return line

    def log_exempt(self, line):
        # the dumps' and the restore's errors are their checks' (dump,
        # restore); REPEATABLE READ's 40001 is a clean answer
        if ' app=pg_dump ' in line:
            return 'pg_dump'
        if ' app=pg_restore ' in line:
            return 'pg_restore'
        if ' app=soak-rr-' in line and ' state=40001 ' in line:
            return 'serialization failure under REPEATABLE READ'
        return None

    def server_log(self):
        super().server_log()
        # the scheduler's DEBUG1 lines of database soak (told by their pid:
        # a background worker's line has no database name): rows moved,
        # slots dropped, upkeep tried again later; of other schedulers,
        # counted apart
        moved, moves, dropped, upkeep, other = {}, {}, {}, {}, {}
        ppid = re.compile(r' \[(\d+)\] pgqueue scheduler ')
        pm = re.compile(r'DEBUG:  moved (\d+) rows of slot (\d+) of pgqueue\.(\w+)')
        pd = re.compile(r'DEBUG:  dropped free slot (\d+) of pgqueue\.(\w+)')
        pu = re.compile(r'DEBUG:  could not (.*?): ')
        try:
            with open(self.a.logfile, errors='replace') as f:
                for line in f:
                    if ' DEBUG:  ' not in line:
                        continue
                    m = ppid.search(line)
                    if not m:
                        continue
                    db = self.sched_pids.get(int(m.group(1)), 'unknown')
                    if db != 'soak':
                        if pm.search(line) or pd.search(line):
                            other[db] = other.get(db, 0) + 1
                        continue
                    m = pm.search(line)
                    if m:
                        moved[m.group(3)] = moved.get(m.group(3), 0) + int(m.group(1))
                        moves[m.group(3)] = moves.get(m.group(3), 0) + 1
                        continue
                    m = pd.search(line)
                    if m:
                        dropped[m.group(2)] = dropped.get(m.group(2), 0) + 1
                        continue
                    m = pu.search(line)
                    if m:
                        upkeep[m.group(1)] = upkeep.get(m.group(1), 0) + 1
        except OSError:
            pass
        self.h.write('ring_log', moved=moved, moves=moves, dropped=dropped, upkeep=upkeep,
                     other=other)
        if self.a.standby_log:
            counts, lines = {}, []
            pat = re.compile(r'terminated by signal (\d+)|PANIC|TRAP:|was terminated by exception'
                             r'|(ERROR|WARNING|FATAL):')
            try:
                with open(self.a.standby_log, errors='replace') as f:
                    for line in f:
                        m = pat.search(line)
                        if not m:
                            continue
                        k = ('conflict with recovery' if 'conflict with recovery' in line else
                             'signal %s' % m.group(1) if m.group(1) else
                             m.group(2) if m.group(2) else m.group(0).split()[0])
                        counts[k] = counts.get(k, 0) + 1
                        if len(lines) < 50 and k != 'conflict with recovery':
                            lines.append(line.strip()[:300])
            except OSError as e:
                lines.append('cannot read the standby log: %r' % e)
            self.h.write('standby_log', counts=counts, lines=lines)


def main(a, rest):
    p = argparse.ArgumentParser(prog='soak.py --mode ring')
    p.add_argument('--standby-dsn', help='a hot standby of the server (run.sh makes it)')
    p.add_argument('--standby-log')
    p.add_argument('--restore-dsn', help='an empty database named in pgqueue.database')
    p.add_argument('--dump-dir', required=True)
    p.add_argument('--restore-at', type=float, default=0.4,
                   help='the restore, at this fraction of --seconds (at least 20 s in)')
    p.add_argument('--ring-interval', type=float, default=0.2)
    p.add_argument('--x-pause', type=float, default=0.6)
    p.add_argument('--paused-pause', type=float, default=0.6)
    p.add_argument('--waiters', type=int, default=2)
    p.add_argument('--tx-workers', type=int, default=2)
    p.add_argument('--rr-workers', type=int, default=2)
    p.add_argument('--snap-readers', type=int, default=2)
    p.add_argument('--standby-readers', type=int, default=3)
    r = p.parse_args(rest)
    for k, v in vars(r).items():
        setattr(a, k, v)
    RingSoak(a).run()
