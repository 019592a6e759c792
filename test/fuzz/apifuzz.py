#!/usr/bin/python3
"""pgqueue's API fuzzer (test/fuzz/run.sh runs it; /usr/bin/python3 with
Debian's psycopg 3).

Several sessions at once call every pgqueue function with boundary and
hostile values (NULL in every position, empty, huge, multi-dimensional
arrays and arrays with NULL elements, 10,000 and 10,001 elements, extreme
and month-heavy intervals, infinite and far timestamps, invalid UTF-8,
names and keys at and over their limits, payloads at and over
pgqueue.max_payload_size, deeply nested jsonb), in random transactions:
autocommit, BEGIN/COMMIT, ROLLBACK, savepoints rolled back or released,
PREPARE TRANSACTION then COMMIT/ROLLBACK PREPARED, under READ COMMITTED,
REPEATABLE READ and SERIALIZABLE.  After each transaction it runs the
consistency checks (invariants.sql) and fails on any violation, on a lost
connection (a crash), on SQLSTATE class XX, and on any SQLSTATE outside
the classes below.  At the end it drains: every ready job of an unpaused
queue must get scheduled and every claimable job claimed (nothing lost
below a scan bound).  Prints the counts; exits 1 on a failure.

  /usr/bin/python3 test/fuzz/apifuzz.py --dsn 'host=/tmp port=5432 dbname=fuzz' \
      --seconds 120 --procs 4 --seed 42 --invariants test/fuzz/invariants.sql
"""
import argparse
import collections
import multiprocessing as mp
import random
import sys
import time
import traceback
import uuid

import psycopg
from psycopg import errors as E

# SQLSTATEs a call may end with, and why.
ACCEPTED = {
    # pgqueue's documented bad-input classes (docs/sql-reference.md, "Limits and errors")
    '22004': 'required argument NULL',
    '22023': 'value out of range',
    '2202E': 'multi-dimensional array',
    '54000': 'over a size or count limit',
    '42501': 'no privilege (a call as a role without grants)',
    # PostgreSQL's own input conversion of the fuzzer's literals, before any
    # pgqueue code runs (the casts in the statement)
    '22P02': 'invalid input syntax (cast of a literal)',
    '22008': 'timestamp out of range (literal or now() + interval)',
    '22015': 'interval field overflow (literal)',
    '22021': 'invalid UTF-8 (rejected at input)',
    '22P05': 'untranslatable character (\\u0000 in jsonb)',
    '22003': 'numeric value out of range (literal)',
    '22007': 'invalid datetime format (literal)',
    '54001': 'stack depth limit (deeply nested jsonb input)',
    # concurrency, documented for the per-job calls
    '40001': 'serialization failure (REPEATABLE READ / SERIALIZABLE)',
    '40P01': 'deadlock detected',
    '55P03': 'lock_timeout (a row held by a prepared transaction or another session)',
    '57014': 'statement cancelled by a deliberately short statement_timeout',
    '57P01': 'session terminated by an administrator (sqlsmith in the other database)',
}
QUEUES = ['fz_a', 'fz_b', 'fz_c', 'fz_d', 'fz_e', 'fz_paused', 'fz_arch', 'fz_one',
          'q' * 128, 'fz é ✓', "fz'quote\"", 'fz;drop']


class Failure(Exception):
    pass


def bad_queue_names():
    return [None, '', 'q' * 129, 'x' * 10000, 'é' * 64 + 'a', 'é' * 64,
            '\\', '%s', "'); DROP TABLE pgqueue.queue; --", ' ', '\t\n', 'fz\u2028x']


class Session:
    def __init__(self, dsn, seed, wid, stats, deadline, invariants):
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.wid = wid
        self.stats = stats
        self.deadline = deadline
        self.invariants = invariants
        self.key = f'fzk-{wid}'
        self.held = []           # (id, lock_key) this session claimed
        self.ids = []            # ids of jobs seen, for calls by id
        self.history = collections.deque(maxlen=40)
        self.hostile = False
        self.big_tables = False
        self.connect()

    # --- connections -------------------------------------------------
    def connect(self):
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute("SET statement_timeout = '20s'")
        self.conn.execute("SET lock_timeout = '3s'")
        self.conn.execute("SET application_name = 'apifuzz-%d'" % self.wid)
        if self.wid % 2 == 1:
            # payloads near the limit without sending megabytes
            self.conn.execute("SET pgqueue.max_payload_size = '1kB'")
        self.check = psycopg.connect(self.dsn, autocommit=True)
        self.check.execute("SET statement_timeout = '60s'")

    def reconnect(self):
        for c in (self.conn, self.check):
            try:
                c.close()
            except Exception:
                pass
        self.connect()

    # --- values ---------------------------------------------------------
    def pick(self, *choices):
        return self.rng.choice(choices)

    def h(self):
        # whether this argument gets a hostile value: in a hostile call
        # (40 % of calls) each argument is hostile with probability 0.4,
        # so that most calls reach the functions' bodies
        return self.hostile and self.rng.random() < 0.4

    def queue(self):
        r = self.rng.random()
        if not self.h() or r < 0.4:
            return self.rng.choice(QUEUES)
        if r < 0.85:
            return 'fzq_%d' % self.rng.randrange(50)
        return self.rng.choice(bad_queue_names())

    def payload(self):
        r = self.rng.random()
        if not self.h():
            return '{"w": %d, "n": %d}' % (self.wid, self.rng.randrange(1000000))
        return self.pick(None, 'null', '[]', '"s"', '0', '{}', '1e1000',
                         '{"a": "\\u0000"}', '{"a": "\\ud800"}',
                         '[' * 1000 + ']' * 1000, '[' * 100000 + ']' * 100000,
                         '{"big": "%s"}' % ('x' * self.rng.choice([900, 1000, 1100, 16 * 1024 * 1024])),
                         '{"a": ' * 500 + '1' + '}' * 500, 'not json', '{"k": "é✓\\n\\t"}')

    def ts(self):
        if not self.h():
            return self.pick(None, None, None, 'now', 'now + 1s', 'now - 1 day', 'now + 1 day')
        return self.pick(None, None, None, 'now', 'infinity', '-infinity',
                         '294276-12-31 23:59:59.999999+00', '4713-11-24 00:00:00+00 BC',
                         '294277-01-01 00:00:00+00', 'epoch', '2000-01-01', '1999-12-31 23:59:59+00',
                         'now + 1s', 'now - 1 day', 'now + 1 day', 'now + 1000 years')

    def ts_sql(self, v):
        # a few values relative to now(), the rest literals
        if v == 'now + 1s':
            return "now() + interval '1 second'", None
        if v == 'now - 1 day':
            return "now() - interval '1 day'", None
        if v == 'now + 1 day':
            return "now() + interval '1 day'", None
        if v == 'now + 1000 years':
            return "now() + interval '1000 years'", None
        return '%s::timestamptz', v

    def interval(self, typical='30 seconds'):
        if not self.h():
            return typical
        return self.pick(typical, typical, typical, None, '0', '1 microsecond', '-1 microsecond',
                         '7 days', '7 days 00:00:00.000001', '178000000 years', '-178000000 years',
                         '1 mon', '1 mon -29 days', '1 mon -31 days', '-1 mon 40 days',
                         '1 day -86400 seconds', '2147483647 days', '-2147483648 months',
                         '60 seconds', '60.000001 seconds', '365 days', '366 days', '12 mons',
                         '13 mons', '1 year', '00:00:00.2', 'P0.5D', '-0', '2147483647 hours',
                         '@ 1 minute ago', '0.5 seconds', '3 seconds')

    def int_(self, typical):
        if not self.h():
            return typical
        return self.pick(typical, typical, typical, None, 0, -1, 1, 2, 100, 10000, 10001,
                         2147483647, -2147483648, '2147483648')

    def key_(self):
        r = self.rng.random()
        if r < 0.6 or (not self.h() and r < 0.7):
            return self.key
        if r < 0.8 or not self.h():
            return 'fzk-%d' % self.rng.randrange(4)
        return self.pick(None, '', 'k' * 256, 'k' * 257, 'fz-holder-1', 'fz-holder-2',
                         'fz-expired', 'é' * 128, 'é' * 128 + 'a', 'k' * 100000)

    def job_id(self):
        r = self.rng.random()
        if r < 0.5 and self.held:
            return str(self.rng.choice(self.held)[0])
        if (r < 0.85 or not self.h()) and self.ids:
            return str(self.rng.choice(self.ids))
        return self.pick(None, str(uuid.uuid4()), '00000000-0000-0000-0000-000000000000',
                         'ffffffff-ffff-ffff-ffff-ffffffffffff', 'not-a-uuid')

    def queues_arr(self):
        r = self.rng.random()
        if r < 0.4:
            return None
        if r < 0.7 or not self.h():
            names = self.rng.sample(QUEUES, self.rng.randrange(1, 4))
            return self.arr(names)
        return self.pick('{}', '{NULL}', '{fz_a,NULL}', '{{fz_a},{fz_b}}', '[5:6]={fz_a,fz_b}',
                         self.arr(['fz_a'] * 100), self.arr(['fz_a'] * 101),
                         self.arr(['q' * 129]), self.arr(['']), self.arr(QUEUES + ['fzq_1']),
                         '{{{fz_a}}}', '{"fz é ✓"}')

    @staticmethod
    def arr(items):
        def el(x):
            if x is None:
                return 'NULL'
            return '"' + x.replace('\\', '\\\\').replace('"', '\\"') + '"'
        return '{' + ','.join(el(x) for x in items) + '}'

    def ids_arr(self):
        held = [str(h[0]) for h in self.held]
        r = self.rng.random()
        if r < 0.5 or not self.h():
            return self.arr(self.rng.sample(held, min(len(held), self.rng.randrange(1, 12))))
        return self.pick(None, '{}', '{NULL}', self.arr(held + [None]), self.arr(held + held),
                         '{{%s}}' % str(uuid.uuid4()),
                         self.arr([str(uuid.uuid4()) for _ in range(10000)]),
                         self.arr([str(uuid.uuid4()) for _ in range(10001)]),
                         '[0:0]={%s}' % str(uuid.uuid4()))

    def payloads_arr(self):
        r = self.rng.random()
        n = self.rng.choice([1, 2, 5, 50])
        if r < 0.6 or not self.h():
            return self.arr(['{"b": %d}' % i for i in range(n)])
        return self.pick(None, '{}', '{NULL}', self.arr(['{}', None]), '{{"{}"},{"{}"}}',
                         self.arr(['{}'] * 10000), self.arr(['{}'] * 10001),
                         self.arr(['{"big": "%s"}' % ('x' * 2000)]), self.arr(['not json']),
                         '[3:4]={"{}","[]"}')

    # --- calls ----------------------------------------------------------
    def call(self, fn):
        """One call: (name, sql, params, flags)."""
        rng = self.rng
        if fn == 'push':
            tsql, tval = self.ts_sql(self.ts())
            params = [self.queue(), self.payload()]
            sql = 'SELECT pgq_push(%s::text, %s::jsonb, ' + tsql + ', %s::int, %s::text)'
            if tsql.startswith('%s'):
                params.append(tval)
            params += [self.int_(0), self.pick(None, None, 'k%d' % rng.randrange(20), '', 'd' * 256, 'd' * 257)]
            if rng.random() < 0.2:
                return 'push', 'SELECT pgq_push(%s::text)', [self.queue()]
            return 'push', sql, params
        if fn == 'push_batch':
            tsql, tval = self.ts_sql(self.ts())
            params = [self.queue(), self.payloads_arr()]
            if tsql.startswith('%s'):
                params.append(tval)
            params.append(self.int_(0))
            return 'push_batch', 'SELECT count(*) FROM pgq_push_batch(%s::text, %s::jsonb[], ' + tsql + ', %s::int)', params
        if fn == 'claim':
            wait = '0' if not self.h() else self.pick('0', '00:00:00.01', None, '-1 second', '61 seconds', '60 seconds',
                             '00:00:00.05', '1 mon', '-1 microsecond')
            params = [self.key_(), self.int_(rng.choice([1, 1, 3, 10])), self.interval(rng.choice(['30 seconds', '1 hour', '1 millisecond'])),
                      self.queues_arr(), wait]
            return 'claim', 'SELECT id, lock_timeout FROM pgq_claim(%s::text, %s::int, %s::interval, %s::text[], %s::interval)', params
        if fn == 'extend':
            h = self.rng.choice(self.held) if self.held and rng.random() < 0.7 else None
            idv = str(h[0]) if h else self.job_id()
            key = h[1] if h and rng.random() < 0.8 else self.key_()
            return 'extend', 'SELECT pgq_extend(%s::uuid, %s::text, %s::interval)', [idv, key, self.interval()]
        if fn == 'ack':
            h = self.rng.choice(self.held) if self.held and rng.random() < 0.7 else None
            idv = str(h[0]) if h else self.job_id()
            key = h[1] if h and rng.random() < 0.8 else self.key_()
            return 'ack', 'SELECT pgq_ack(%s::uuid, %s::text)', [idv, key]
        if fn == 'ack_batch':
            return 'ack_batch', 'SELECT pgq_ack_batch(%s::uuid[], %s::text)', [self.ids_arr(), self.key_()]
        if fn == 'nack':
            h = self.rng.choice(self.held) if self.held and rng.random() < 0.7 else None
            idv = str(h[0]) if h else self.job_id()
            key = h[1] if h and rng.random() < 0.8 else self.key_()
            err = self.pick(None, 'boom', 'é✓\n') if not self.h() else self.pick('', 'e' * 100000, None)
            return 'nack', 'SELECT pgq_nack(%s::uuid, %s::text, %s::text, %s::interval)', [idv, key, err, self.interval(self.pick('0', '1 second', None))]
        if fn == 'release':
            return 'release', 'SELECT pgq_release(%s::text)', [self.key_()]
        if fn == 'configure':
            q = self.queue()
            if q in ('fz_paused',) and rng.random() < 0.5:
                q = 'fzq_%d' % rng.randrange(50)
            return 'configure', 'SELECT pgq_configure(%s::text, %s::int, %s::int, %s::int, %s::boolean, %s::interval)', [
                q, self.pick(None, None, 1, 3) if not self.h() else self.pick(0, -1, 10000, 10001, 2147483647),
                self.pick(None, None, 0, 1, 5) if not self.h() else self.pick(-1, 2147483647),
                self.pick(None, None, 1, 2, 5) if not self.h() else self.pick(0, -1, 2147483647),
                self.pick(None, None, True, False, False),
                self.pick(None, None, '0', '1 day', '365 days', '12 mons') if not self.h() else
                self.pick('366 days', '-1 second', '13 mons', '1 mon -29 days', '178000000 years', '1 microsecond',
                          '-178000000 years', '365 days 00:00:00.000001')]
        if fn == 'schedule':
            return 'schedule', 'SELECT pgq_schedule(%s::int)', [self.int_(100)]
        if fn == 'stats':
            return 'stats', 'SELECT count(*) FROM pgq_stats()', []
        if fn == 'counters':
            return 'counters', 'SELECT * FROM pgq_counters()', []
        if fn == 'retry':
            return 'retry', 'SELECT pgq_retry(%s::uuid)', [self.job_id()]
        if fn == 'retry_failed':
            return 'retry_failed', 'SELECT pgq_retry_failed(%s::text)', [self.queue()]
        if fn == 'cancel':
            return 'cancel', 'SELECT pgq_cancel(%s::uuid)', [self.job_id()]
        if fn == 'purge':
            return 'purge', 'SELECT pgq_purge(%s::text, %s::text)', [
                self.queue(), self.pick('failed', 'pending', 'retry') if not self.h() else
                self.pick('scheduled', 'running', '', None, 'PENDING', 'failed ')]
        if fn == 'push_periodic':
            return 'push_periodic', 'SELECT pgq_push_periodic(%s::text, %s::text, %s::interval, %s::jsonb, %s::int)', [
                self.queue(), self.pick('p1', 'p2', 'n' * 224, 'é' * 112) if not self.h() else
                self.pick(None, '', 'n' * 225, 'é' * 112 + 'a'),
                self.pick('1 second', '1 minute', '1 hour', '1 day', '365 days') if not self.h() else
                self.pick('999 milliseconds', '365 days 00:00:00.000001', '1 mon', '1 mon -30 days', '-1 day', None,
                          '0', '178000000 years', '1 day -86399 seconds', '-178000000 years'),
                self.payload(), self.int_(0)]
        raise ValueError(fn)

    WEIGHTS = [('push', 14), ('push_batch', 4), ('claim', 16), ('extend', 6), ('ack', 10),
               ('ack_batch', 5), ('nack', 8), ('release', 3), ('configure', 4), ('schedule', 6),
               ('stats', 1), ('counters', 1), ('retry', 4), ('retry_failed', 2), ('cancel', 4),
               ('purge', 2), ('push_periodic', 3)]

    def random_fn(self):
        total = sum(w for _, w in self.WEIGHTS)
        r = self.rng.uniform(0, total)
        for fn, w in self.WEIGHTS:
            r -= w
            if r <= 0:
                return fn
        return 'push'

    # --- running ------------------------------------------------------------
    def execute(self, sql, params=()):
        self.history.append((sql[:200], [p if not isinstance(p, str) or len(p) < 120 else p[:60] + '...(%d chars)' % len(p) for p in params]))
        return self.conn.execute(sql, params)

    def run_call(self, in_txn):
        fn = self.random_fn()
        self.hostile = self.rng.random() < 0.4
        name, sql, params = self.call(fn)
        self.stats['calls'] += 1
        self.stats['call:' + name] += 1
        short_timeout = False
        if name == 'claim' and params[4] in ('60 seconds', '1 mon') and in_txn:
            # a long blocking claim, cancelled by a short timeout: the wait is
            # interrupted as a worker's would be
            self.execute("SET LOCAL statement_timeout = '300ms'")
            short_timeout = True
        elif name == 'claim' and params[4] in ('60 seconds', '1 mon'):
            params[4] = '00:00:00.05'
        try:
            cur = self.execute(sql, params)
            rows = cur.fetchall()
        except psycopg.Error as e:
            self.classify(name, e, short_timeout)
            return False
        finally:
            if short_timeout and not self.conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                try:
                    self.execute("SET LOCAL statement_timeout = '20s'")
                except psycopg.Error:
                    pass
        self.stats['ok:' + name] += 1
        if name == 'claim':
            key = params[0]
            for r in rows:
                self.held.append((r[0], key))
                self.ids.append(r[0])
            self.held = self.held[-200:]
        elif name == 'push' and rows and rows[0][0] is not None:
            self.ids.append(rows[0][0])
        elif name in ('ack', 'cancel') and rows and rows[0][0]:
            self.held = [h for h in self.held if str(h[0]) != str(params[0])]
        self.ids = self.ids[-500:]
        return True

    def classify(self, name, e, short_timeout):
        st = e.sqlstate
        if st is None:
            # a lost connection: a crash, or the client refused the value
            if isinstance(e, psycopg.DataError) and 'NUL' in str(e):
                self.stats['client-rejected'] += 1
                return
            raise Failure('%s: no SQLSTATE (connection lost?): %s' % (name, e))
        self.stats['err:' + st] += 1
        self.stats['err:%s:%s' % (name, st)] += 1
        if st.startswith('XX'):
            raise Failure('%s: internal error %s: %s' % (name, st, e))
        if st == '57014' and not short_timeout:
            raise Failure('%s: statement ran into the 20 s statement_timeout (a hang?): %s' % (name, e))
        if st == '40P01':
            # accepted, but shown: which calls of which transactions
            print('deadlock (40P01) in session %d, %s: %s\n  its transaction so far:\n%s' % (
                self.wid, name, str(e).replace('\n', ' | '),
                '\n'.join('    %s %r' % h for h in list(self.history)[-8:])), flush=True)
        if st == '57P01':
            raise ConnectionResetError(str(e))
        if st in ('57P02', '57P03'):
            raise Failure('%s: %s (crash of another server process): %s' % (name, st, e))
        if st not in ACCEPTED:
            raise Failure('%s: SQLSTATE %s outside the accepted classes: %s' % (name, st, e))

    def transaction(self):
        rng = self.rng
        mode = rng.choices(['auto', 'commit', 'rollback', 'savepoints', 'prepare'], [40, 25, 12, 15, 8])[0]
        if self.big_tables and mode != 'rollback':
            # keep the tables small enough for a check after every transaction
            self.execute("SELECT pgq_purge(q, 'pending') FROM unnest(%s::text[]) q", [QUEUES])
            self.big_tables = False
            self.stats['shrinks'] += 1
        self.stats['txn:' + mode] += 1
        if mode == 'auto':
            self.run_call(False)
            return
        iso = rng.choices(['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'], [80, 12, 8])[0]
        self.execute('BEGIN ISOLATION LEVEL ' + iso)
        ncalls = rng.randint(1, 6)
        failed = False
        for i in range(ncalls):
            if mode == 'savepoints':
                self.execute('SAVEPOINT s%d' % i)
                ok = self.run_call(True)
                if not ok or rng.random() < 0.4:
                    self.execute('ROLLBACK TO SAVEPOINT s%d' % i)
                    self.stats['savepoint-rolled-back'] += 1
                elif rng.random() < 0.5:
                    self.execute('RELEASE SAVEPOINT s%d' % i)
            else:
                if not self.run_call(True):
                    failed = True
                    break
        if failed or mode == 'rollback':
            self.execute('ROLLBACK')
            return
        if mode == 'prepare':
            gid = 'fz-%d-%d' % (self.wid, rng.randrange(1 << 30))
            try:
                self.execute("PREPARE TRANSACTION '%s'" % gid)
            except psycopg.Error as e:
                self.classify('prepare', e, False)
                self.execute('ROLLBACK')
                return
            if rng.random() < 0.3:
                # another call while the prepared transaction holds its locks
                try:
                    self.run_call(False)
                except Failure:
                    raise
            fin = 'COMMIT PREPARED' if rng.random() < 0.6 else 'ROLLBACK PREPARED'
            self.execute("%s '%s'" % (fin, gid))
            self.stats['prepared:' + fin] += 1
            return
        try:
            self.execute('COMMIT')
        except psycopg.Error as e:
            self.classify('commit', e, False)
            if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self.execute('ROLLBACK')

    def check_invariants(self):
        self.stats['checks'] += 1
        out = []
        cur = self.check.cursor()
        for stmt in split_sql(self.invariants):
            cur.execute(stmt)
            if cur.description:
                out += [r[0] for r in cur.fetchall()]
        if out:
            raise Failure('consistency violated after a transaction:\n  ' + '\n  '.join(out[:20]))

    def refresh_ids(self):
        cur = self.check.execute('SELECT id FROM pgqueue.queue TABLESAMPLE SYSTEM (5) LIMIT 200')
        self.ids = [r[0] for r in cur.fetchall()]
        self.big_tables = self.check.execute('SELECT count(*) > 20000 FROM pgqueue.queue').fetchone()[0]

    def privileges(self):
        # a call as a role without pgqueue's grants: 42501, nothing else
        fn = self.random_fn()
        name, sql, params = self.call(fn)
        self.execute('BEGIN')
        self.execute('SET LOCAL ROLE fz_nobody')
        try:
            self.execute(sql, params).fetchall()
            raise Failure('%s ran for a role without grants' % name)
        except psycopg.Error as e:
            self.stats['calls'] += 1
            self.stats['call:' + name] += 1
            if e.sqlstate != '42501':
                self.classify(name, e, False)
            else:
                self.stats['err:42501'] += 1
        self.execute('ROLLBACK')

    def raw_bytes(self):
        # bytes that are not UTF-8, sent as they are (no client-side encoding)
        self.stats['calls'] += 1
        self.stats['call:invalid-utf8'] += 1
        stmt = self.rng.choice([b"SELECT pgq_push('\xff\xfe', '{}')",
                                b"SELECT pgq_push('fz_a', '{\"a\": \"\xc3\x28\"}')",
                                b"SELECT pgq_configure('\xed\xa0\x80')",
                                b"SELECT pgq_claim('\xc0\xaf')",
                                b"SELECT pgq_push('fz_a', '{}', NULL, 0, '\xf8\x88\x80\x80\x80')",
                                b"SELECT pgq_push(convert_from('\\xc328'::bytea, 'UTF8'))"])
        res = self.conn.pgconn.exec_(stmt)
        st = res.error_field(psycopg.pq.DiagnosticField.SQLSTATE)
        st = st.decode() if st else None
        if res.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            self.stats['err:' + str(st)] += 1
            if st != '22021':
                raise Failure('invalid UTF-8: SQLSTATE %s, not 22021: %s' % (st, res.error_message))
        else:
            raise Failure('invalid UTF-8 accepted: %r' % stmt)

    def loop(self):
        while time.time() < self.deadline:
            try:
                r = self.rng.random()
                if r < 0.01:
                    self.privileges()
                elif r < 0.02:
                    self.raw_bytes()
                else:
                    self.transaction()
                if self.rng.random() < 0.05:
                    self.refresh_ids()
                self.check_invariants()
            except ConnectionResetError as e:
                self.stats['reconnects'] += 1
                self.reconnect()
            except psycopg.OperationalError as e:
                if e.sqlstate == '57P01':
                    self.stats['reconnects'] += 1
                    self.reconnect()
                    continue
                raise Failure('connection lost (crash?): %s' % e)


def split_sql(text):
    stmts, cur = [], []
    for line in text.splitlines():
        if line.strip().startswith('--') or not line.strip():
            continue
        cur.append(line)
        if line.rstrip().endswith(';'):
            stmts.append('\n'.join(cur))
            cur = []
    return stmts


def worker(args, wid, q):
    stats = collections.Counter()
    s = None
    try:
        s = Session(args.dsn, args.seed * 1000 + wid, wid, stats, time.time() + args.seconds,
                    open(args.invariants).read())
        s.loop()
        q.put((wid, dict(stats), None))
    except Exception as e:
        hist = ''
        if s is not None:
            hist = '\n'.join('    %s %r' % h for h in list(s.history)[-15:])
        msg = '%s\n  last statements of session %d (seed %d):\n%s' % (
            e if isinstance(e, Failure) else traceback.format_exc(), wid, args.seed * 1000 + wid, hist)
        q.put((wid, dict(stats), msg))


def drain(args):
    """Every ready job of an unpaused queue gets scheduled and every claimable
    job claimed: nothing is lost below a scan bound."""
    conn = psycopg.connect(args.dsn, autocommit=True)
    conn.execute("SET statement_timeout = '120s'")
    leftovers = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()").fetchall()
    for (gid,) in leftovers:
        conn.execute("ROLLBACK PREPARED '%s'" % gid)
    conn.execute("SELECT pgq_configure(queue, paused => false, max_in_flight => 0) FROM pgqueue.queues")
    t0 = time.time()
    first_missed = None
    while True:
        while conn.execute('SELECT pgq_schedule(10000)').fetchone()[0] > 0:
            pass
        claimed = conn.execute("SELECT count(*) FROM pgq_claim('fz-drain', 10000, '1 hour')").fetchone()[0]
        while claimed:
            claimed = conn.execute("SELECT count(*) FROM pgq_claim('fz-drain', 10000, '1 hour')").fetchone()[0]
        left = conn.execute(
            "SELECT (SELECT count(*) FROM pgqueue.queue WHERE state IN ('pending', 'retry') AND run_after <= now()),"
            "       (SELECT count(*) FROM pgqueue.work_queue WHERE lock_timeout IS NULL OR lock_timeout < clock_timestamp())"
        ).fetchone()
        if left == (0, 0):
            break
        if first_missed is None:
            first_missed = left
        if time.time() - t0 > 40:
            conn.close()
            return 'after 40 s, %d ready jobs not scheduled and %d claimable jobs not claimed' % left, first_missed
        time.sleep(1)
    conn.close()
    return None, first_missed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--dsn', required=True)
    ap.add_argument('--seconds', type=float, default=120)
    ap.add_argument('--procs', type=int, default=4)
    ap.add_argument('--seed', type=int, default=int(time.time()))
    ap.add_argument('--invariants', required=True)
    args = ap.parse_args()
    print('apifuzz: seed %d, %d sessions, %.0f s' % (args.seed, args.procs, args.seconds), flush=True)
    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fz_nobody') "
                  "THEN CREATE ROLE fz_nobody; END IF; END$$")
        c.execute('GRANT USAGE ON SCHEMA public TO fz_nobody')
    q = mp.Queue()
    procs = [mp.Process(target=worker, args=(args, i, q)) for i in range(args.procs)]
    for p in procs:
        p.start()
    total = collections.Counter()
    failures = []
    for _ in procs:
        wid, stats, err = q.get()
        total.update(stats)
        if err:
            failures.append('session %d: %s' % (wid, err))
    for p in procs:
        p.join()
    err, first_missed = drain(args)
    if err:
        failures.append('drain: ' + err)
    if first_missed:
        print('drain: the first immediate pass/claim left %s (ready, claimable); found after a re-check' % (first_missed,))
    print('calls: %d, transactions: %d, consistency checks: %d, reconnects after 57P01: %d' % (
        total['calls'], sum(v for k, v in total.items() if k.startswith('txn:')), total['checks'], total['reconnects']))
    print('transactions: ' + ', '.join('%s %d' % (k[4:], v) for k, v in sorted(total.items()) if k.startswith('txn:')))
    print('prepared: ' + ', '.join('%s %d' % (k[9:], v) for k, v in sorted(total.items()) if k.startswith('prepared:'))
          + ', savepoints rolled back %d' % total['savepoint-rolled-back'])
    print('per function (calls / ok):')
    for k, v in sorted(total.items()):
        if k.startswith('call:'):
            print('  %-14s %7d / %7d' % (k[5:], v, total.get('ok:' + k[5:], 0)))
    print('errors by SQLSTATE:')
    for k, v in sorted(total.items()):
        if k.startswith('err:') and k.count(':') == 1:
            print('  %s %7d  %s' % (k[4:], v, ACCEPTED.get(k[4:], 'NOT ACCEPTED')))
    print('crashes: %d' % sum(1 for f in failures if 'connection lost' in f or 'no SQLSTATE' in f))
    for f in failures:
        print('FAILURE ' + f)
    print('apifuzz: %s' % ('FAILED' if failures else 'ok'))
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()
