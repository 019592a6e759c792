"""The four queue systems under test, as the harness drives them.

Each system lives in its own schema of the `bench` database and knows:
  - how to create itself (sql/sysN_schema.sql) and reset itself between runs,
  - its pgbench scripts (sql/sysN_<role>.sql),
  - how to bulk-load a backlog and wait until its scheduler (if it has one)
    has scheduled it,
  - how to count finished jobs from its tables (deletes from its job table,
    read from pg_stat_user_tables), and how many jobs are left,
  - one-job push / claim / ack calls for the latency workloads (latency.py).

The SQL in the Python calls below is the same as in the pgbench scripts.
"""

import os
import threading
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
SQL_DIR = os.path.join(HERE, "sql")
PAYLOAD = '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'


def connect(cfg, search_path=None, autocommit=True, app="pgqueue-bench"):
    """A connection to the harness's own server (unix socket)."""
    options = "-c search_path=%s" % search_path.replace(" ", "") if search_path else None
    kw = dict(host=cfg["host"], port=cfg["port"], user=cfg["user"],
              dbname=cfg["dbname"], autocommit=autocommit, application_name=app)
    if options:
        kw["options"] = options
    return psycopg.connect(**kw)


def scalar(conn, sql, params=None):
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


class System:
    key = ""            # sys1 .. sys4
    title = ""          # one line for the report
    schema = ""
    job_table = ""      # finished jobs = rows deleted from this table
    tables = ()         # all of the system's tables (truncate, vacuum, sizes)
    has_leases = True
    in_flight_note = ""
    workloads = None    # the workloads it runs (None: all)

    def __init__(self, cfg):
        self.cfg = cfg
        self._bg = None
        # rows deleted from each leaf of the job table, as last read: a
        # partition that is dropped (pgqueue drops free slots) takes its
        # statistics with it, and the rows deleted from it still count
        self._deleted = {}
        self._deleted_lock = threading.Lock()

    # -- setup -------------------------------------------------------------
    @property
    def search_path(self):
        return self.schema

    def script(self, role):
        return os.path.join(SQL_DIR, "%s_%s.sql" % (self.key, role))

    def setup(self, conn):
        with open(self.script("schema")) as f:
            conn.execute(f.read())

    def reset(self, conn):
        """Empty the system and start from equal conditions.

        TRUNCATE gives every table a new, empty file and "unknown" statistics
        (reltuples = -1), as a freshly created table has.  No VACUUM/ANALYZE
        here: on an empty table it would record 0 rows, and statements
        prepared at the start of a run (pgbench -M prepared, plpgsql, SPI)
        would keep seq-scan plans while the table grows.  Backlogs loaded for
        a run are VACUUM ANALYZEd (vacuum()) before the run starts.
        """
        self.stop_background()
        self.truncate(conn)
        conn.execute("CHECKPOINT")

    def truncate(self, conn, attempts=5):
        """TRUNCATE the system's tables.  A scheduler pass running at the same
        time (pgqueue's worker, still moving jobs pushed by the last run) can
        take the tables' locks in the other order: the deadlock detector then
        cancels one of the two, and the TRUNCATE is tried again."""
        conn.execute("SET lock_timeout = '60s'")
        try:
            for i in range(attempts):
                try:
                    conn.execute("TRUNCATE %s RESTART IDENTITY CASCADE" % ", ".join(self.tables))
                    return
                except psycopg.errors.DeadlockDetected:
                    if i == attempts - 1:
                        raise
                    time.sleep(0.2)
        finally:
            conn.execute("RESET lock_timeout")

    def vacuum(self, conn):
        for t in self.tables:
            conn.execute("VACUUM ANALYZE %s" % t)
        conn.execute("CHECKPOINT")

    # -- background scheduler (sys3, and the mock pgqueue) -----------------
    background_call = None  # e.g. "CALL sys3.scheduler_loop()"

    def start_background(self):
        if not self.background_call or self._bg:
            return
        conn = connect(self.cfg, app="bench-%s-scheduler" % self.key)
        pid = conn.info.backend_pid
        errors = []

        def loop():
            try:
                conn.execute(self.background_call)
            except psycopg.errors.QueryCanceled:
                pass
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
            finally:
                conn.close()

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        self._bg = (th, pid, errors)

    def stop_background(self):
        if not self._bg:
            return
        th, pid, errors = self._bg
        with connect(self.cfg) as c:
            c.execute("SELECT pg_cancel_backend(%s)", (pid,))
        th.join(30)
        self._bg = None
        if errors:
            raise RuntimeError("%s scheduler loop failed: %s" % (self.key, errors[0]))

    # -- counting ----------------------------------------------------------
    # The heaps of the system's tables: a partitioned table's statistics
    # and size are its partitions' (pgqueue's queue and work_queue, the
    # experiments' jobs); a plain table is its own.  Read from pg_inherits
    # and pg_class, which lock nothing: pg_partition_tree() locks every
    # partition, and a sampler that does so twice a second pins pgqueue's
    # free slots (a slot a transaction holds a lock on is not reused) as a
    # reader of the table would.
    LEAVES = ("WITH RECURSIVE tree(relid) AS ("
              "  SELECT t::oid FROM unnest(%s::regclass[]) t"
              "  UNION ALL SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid)"
              " SELECT tree.relid::regclass AS relid FROM tree JOIN pg_class c ON c.oid = tree.relid"
              " WHERE c.relkind <> 'p'")
    # The same, locked (ACCESS SHARE, to the end of the transaction) by
    # pg_partition_tree(): for the functions that open each heap (sizes,
    # pgstattuple), so that no partition is dropped between the list and
    # its reading.  Once at the end of a run, not in the sampler.
    LEAVES_LOCKED = ("SELECT coalesce(l.relid, t) AS relid FROM unnest(%s::regclass[]) t "
                     "LEFT JOIN LATERAL pg_partition_tree(t) l ON l.isleaf")

    def deletes(self, conn):
        """Rows ever deleted from the job table (cumulative statistics),
        partitions dropped since they were last read included."""
        rows = conn.execute("SELECT relid::oid, pg_stat_get_tuples_deleted(relid) FROM (%s) h"
                            % self.LEAVES, ([self.job_table],)).fetchall()
        with self._deleted_lock:
            for relid, n in rows:
                # a partition dropped after the list was read reads 0
                self._deleted[relid] = max(n, self._deleted.get(relid, 0))
            return sum(self._deleted.values())

    def settled_deletes(self, conn, timeout=10.0):
        """Deletes once every backend has flushed its statistics."""
        last = self.deletes(conn)
        deadline = time.monotonic() + timeout
        stable = 0
        while time.monotonic() < deadline and stable < 2:
            time.sleep(0.5)
            cur = self.deletes(conn)
            stable = stable + 1 if cur == last else 0
            last = cur
        return last

    def remaining(self, conn):
        return scalar(conn, "SELECT count(*) FROM %s" % self.job_table)

    def is_empty(self, conn):
        # Through the primary key, as the claims go: a seq scan would read
        # every page of dead rows the drain leaves behind, 50 times a second.
        return conn.execute("SELECT id FROM %s ORDER BY id LIMIT 1" % self.job_table).fetchone() is None

    def dead_tuples(self, conn):
        return scalar(conn, "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables "
                            "WHERE relid IN (%s)" % self.LEAVES, (list(self.tables),))

    def total_size(self, conn):
        return scalar(conn, "SELECT sum(pg_total_relation_size(relid))::bigint FROM (%s) h" % self.LEAVES_LOCKED,
                      (list(self.tables),))

    def dead_exact(self, conn):
        """Dead row versions in the tables' heaps (every partition's), counted
        by pgstattuple's scan: n_dead_tup is an estimate from the statistics,
        and counts that backends flush after a TRUNCATE reset them stay on
        the emptied table until its next VACUUM or TRUNCATE."""
        return scalar(conn, "SELECT coalesce(sum((pgstattuple(relid)).dead_tuple_count), 0)::bigint "
                            "FROM (%s) h" % self.LEAVES_LOCKED, (list(self.tables),))

    def dead_items(self, conn):
        """Dead line pointers (LP_DEAD) in the tables' heaps, counted by
        pageinspect: a deleted row that a page's pruning cut down to its line
        pointer, waiting for VACUUM to free it and its index entries.
        pgstattuple counts no such item as a dead tuple (it has no storage
        left) but n_dead_tup does: dead_exact + dead_items is what VACUUM has
        left to clean."""
        return scalar(conn, "SELECT coalesce(sum(n), 0)::bigint FROM (%s) h, LATERAL "
                            "(SELECT count(*) AS n FROM generate_series(0, pg_relation_size(h.relid) / %%s - 1) b, "
                            " heap_page_items(get_raw_page(h.relid::text, b::int)) WHERE lp_flags = 3) d"
                            % self.LEAVES_LOCKED, (list(self.tables), 8192))

    # -- backlog -----------------------------------------------------------
    def preload(self, conn, n, chunk=100000):
        left = n
        while left > 0:
            k = min(chunk, left)
            self._bulk_push(conn, k)
            left -= k

    def _bulk_push(self, conn, k):
        conn.execute("INSERT INTO %s (payload) SELECT %%s::jsonb FROM generate_series(1, %%s)"
                     % self.job_table, (PAYLOAD, k))

    def has_pending(self, conn):
        """Are there jobs not yet released to consumers?  (Never, for the
        single-table systems.)  Cheap: it is polled while a scheduler works."""
        return False

    def wait_scheduled(self, conn, timeout=900):
        """Wait until the scheduler has released the whole backlog.  Polls on
        its own connection with enable_seqscan off: the backlog is not
        ANALYZEd yet (that could change the scheduler's plans), and a seq
        scan of a 1M-row table twice a second would slow the scheduler."""
        if not self.has_pending(conn):
            return
        deadline = time.monotonic() + timeout
        with connect(self.cfg, app="bench-wait") as c:
            c.execute("SET enable_seqscan = off")
            while self.has_pending(c):
                if time.monotonic() > deadline:
                    raise RuntimeError("%s: scheduler did not schedule the backlog in %d s"
                                       % (self.key, timeout))
                time.sleep(0.5)

    # -- one job at a time (latency.py) -------------------------------------
    # Each call below is one statement in autocommit mode: one transaction.
    def push_one(self, conn):
        return scalar(conn, "INSERT INTO jobs (payload) VALUES (%s::jsonb) RETURNING id", (PAYLOAD,))

    def claim_one(self, conn, lock_key, blocking=False):
        """Returns the claimed job's id, or None."""
        raise NotImplementedError

    def ack(self, conn, job_id, lock_key):
        raise NotImplementedError

    def claim_held(self, conn, k):
        """Claim up to k jobs under a 1 hour lease; returns the rows."""
        raise NotImplementedError

    def hold_in_flight(self, conn, n, batch=100):
        """Claim n jobs under a 1 hour lease and never ack them."""
        got = 0
        while got < n:
            rows = self.claim_held(conn, min(batch, n - got))
            if not rows:
                break
            got += len(rows)
        return got


# "{op}" is "=" for one job; "= ANY (ARRAY" ... "))" for a batch (see
# sql/sys1_consume_batch.sql for why not IN (...)).
ONE = {"op": "= (", "end": ")"}
MANY = {"op": "= ANY (ARRAY(", "end": "))"}

CLAIM_SYS1 = """
UPDATE jobs SET started_at = now(), lease_until = now() + %s::interval
 WHERE id {op}SELECT id FROM jobs
               WHERE lease_until IS NULL OR lease_until < now()
               ORDER BY id LIMIT %s
               FOR UPDATE SKIP LOCKED{end}
RETURNING id, payload"""


class Sys1(System):
    key = "sys1"
    title = "single-table lease queue: claim (UPDATE ... SKIP LOCKED) and ack (DELETE) in two transactions"
    schema = "sys1"
    job_table = "sys1.jobs"
    tables = ("sys1.jobs",)

    def claim_one(self, conn, lock_key, blocking=False):
        row = conn.execute(CLAIM_SYS1.format(**ONE), ("30 seconds", 1)).fetchone()
        return row[0] if row else None

    def ack(self, conn, job_id, lock_key):
        conn.execute("DELETE FROM jobs WHERE id = %s", (job_id,))

    def claim_held(self, conn, k):
        return conn.execute(CLAIM_SYS1.format(**MANY), ("1 hour", k)).fetchall()


class Sys2(System):
    key = "sys2"
    title = "the same table, claim-and-delete in ONE transaction (DELETE ... SKIP LOCKED RETURNING)"
    schema = "sys2"
    job_table = "sys2.jobs"
    tables = ("sys2.jobs",)
    has_leases = False
    in_flight_note = "sys2 has no leases: its 10k 'in-flight' jobs are 10k claimed (= deleted) jobs"

    CLAIM = """
DELETE FROM jobs
 WHERE id {op}SELECT id FROM jobs
               WHERE lease_until IS NULL OR lease_until < now()
               ORDER BY id LIMIT %s
               FOR UPDATE SKIP LOCKED{end}
RETURNING id, payload"""

    def claim_one(self, conn, lock_key, blocking=False):
        row = conn.execute(self.CLAIM.format(**ONE), (1,)).fetchone()
        return row[0] if row else None

    def ack(self, conn, job_id, lock_key):
        pass  # the claim already deleted it

    def claim_held(self, conn, k):
        return conn.execute(self.CLAIM.format(**MANY), (k,)).fetchall()


class Sys3(System):
    key = "sys3"
    title = ("seed two-table design by hand: queue + work_queue, plpgsql scheduler polling every 1 s "
             "(100 jobs a pass), claim with a lease, ack deletes from both")
    schema = "sys3"
    job_table = "sys3.queue"
    tables = ("sys3.queue", "sys3.work_queue")
    background_call = "CALL sys3.scheduler_loop(100, 1.0)"

    CLAIM = """
WITH claimed AS (
    UPDATE work_queue SET started_at = now(), lease_until = now() + %s::interval
     WHERE id {op}SELECT id FROM work_queue
                   WHERE lease_until IS NULL OR lease_until < now()
                   ORDER BY id LIMIT %s
                   FOR UPDATE SKIP LOCKED{end}
    RETURNING id)
SELECT c.id, q.payload FROM claimed c JOIN queue q ON q.id = c.id"""

    def has_pending(self, conn):
        return scalar(conn, "SELECT EXISTS (SELECT 1 FROM sys3.queue WHERE state = 'pending')")

    def push_one(self, conn):
        return scalar(conn, "INSERT INTO queue (payload) VALUES (%s::jsonb) RETURNING id", (PAYLOAD,))

    def claim_one(self, conn, lock_key, blocking=False):
        row = conn.execute(self.CLAIM.format(**ONE), ("30 seconds", 1)).fetchone()
        return row[0] if row else None

    def ack(self, conn, job_id, lock_key):
        conn.execute("DELETE FROM queue WHERE id = %s", (job_id,))

    def claim_held(self, conn, k):
        return conn.execute(self.CLAIM.format(**MANY), ("1 hour", k)).fetchall()


class Sys4(System):
    """pgqueue (or, with --mock-pgqueue, the plpgsql stand-in in test/)."""
    key = "sys4"
    title = "pgqueue through its SQL API (pgq_push / pgq_claim / pgq_ack), scheduled by its background worker"
    schema = "sys4"
    job_table = "pgqueue.queue"
    tables = ("pgqueue.queue", "pgqueue.work_queue")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.ext_schema = cfg.get("pgqueue_schema", "public")
        self.mock = cfg.get("mock_pgqueue", False)
        self.has_push_batch = cfg.get("pgq_push_batch", False)
        self.has_ack_batch = cfg.get("pgq_ack_batch", False)
        if self.mock:
            self.background_call = "CALL pgqueue.mock_scheduler_loop(100, 1.0)"

    def slots(self, conn):
        """The rings at the end of the hold, where the held-back VACUUM
        workload reads them: per table and state (pgqueue.slots; a partition
        without a row there, slot 0 among them before a turn, counts as
        live), how many partitions, their dead row versions (n_dead_tup)
        and their size in kB.  None without pgqueue.slots (1.0, the mock)."""
        if scalar(conn, "SELECT to_regclass('pgqueue.slots') IS NOT NULL") is not True:
            return None
        ring = {}
        for tbl, state, n, dead, kb in conn.execute("""
SELECT p.relname, coalesce(s.state, 'live'), count(*),
       sum(coalesce(st.n_dead_tup, 0))::bigint, (sum(pg_total_relation_size(c.oid)) / 1024)::bigint
  FROM pg_inherits i
  JOIN pg_class p ON p.oid = i.inhparent
  JOIN pg_namespace n ON n.oid = p.relnamespace AND n.nspname = 'pgqueue'
  JOIN pg_class c ON c.oid = i.inhrelid
  LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
  LEFT JOIN pgqueue.slots s ON s.tbl = p.relname AND c.relname = s.tbl || '_' || s.slot
 WHERE p.relname IN ('queue', 'work_queue')
 GROUP BY 1, 2 ORDER BY 1, 2""").fetchall():
            ring.setdefault(tbl, {})[state] = {"partitions": n, "dead": dead, "kb": kb}
        return ring

    @property
    def search_path(self):
        return "%s,%s" % (self.schema, self.ext_schema)

    def setup(self, conn):
        if self.mock:
            with open(os.path.join(HERE, "test", "mock_pgqueue.sql")) as f:
                conn.execute(f.read())
            conn.execute("CREATE SCHEMA IF NOT EXISTS sys4")
        else:
            super().setup(conn)

    def script(self, role):
        if role == "push_batch" and self.has_push_batch:
            role = "push_batch_fn"
        if role == "consume_batch" and self.has_ack_batch:
            role = "consume_batch_ackfn"
        return super().script(role)

    def _bulk_push(self, conn, k):
        # pgq_push per row; chunks of 10,000 per transaction (see preload).
        if self.has_push_batch:
            conn.execute("SELECT count(*) FROM pgq_push_batch('q', array(SELECT %s::jsonb "
                         "FROM generate_series(1, %s)))", (PAYLOAD, k))
        else:
            conn.execute("SELECT count(pgq_push('q', %s::jsonb)) FROM generate_series(1, %s)",
                         (PAYLOAD, k))

    def preload(self, conn, n, chunk=10000):
        super().preload(conn, n, chunk)

    def has_pending(self, conn):
        # Not pgq_stats(): it aggregates the whole table, which takes most of
        # a second at a 1M backlog and slows the scheduler it is waiting for.
        return scalar(conn, "SELECT EXISTS (SELECT 1 FROM pgqueue.queue "
                            "WHERE state IN ('pending', 'retry'))")

    def push_one(self, conn):
        return scalar(conn, "SELECT pgq_push('q', %s::jsonb)", (PAYLOAD,))

    def claim_one(self, conn, lock_key, blocking=False):
        if blocking:
            row = conn.execute("SELECT id, payload FROM pgq_claim(%s, 1, '30 seconds', "
                               "wait => '5 seconds')", (lock_key,)).fetchone()
        else:
            row = conn.execute("SELECT id, payload FROM pgq_claim(%s, 1, '30 seconds')",
                               (lock_key,)).fetchone()
        return row[0] if row else None

    def ack(self, conn, job_id, lock_key):
        ok = scalar(conn, "SELECT pgq_ack(%s, %s)", (job_id, lock_key))
        if not ok:
            raise RuntimeError("pgq_ack(%s, %s) returned %r" % (job_id, lock_key, ok))

    def claim_held(self, conn, k):
        return conn.execute("SELECT id FROM pgq_claim('bench-holder', %s, '1 hour')", (k,)).fetchall()


class Sys5(System):
    """An experiment for the held-back VACUUM workload (f): sys1 on rotating, truncated partitions
    (bench/ROTATION.md).  Only the steady-state workloads (a) and (f)."""
    key = "sys5"
    title = ("EXPERIMENT: sys1's lease queue on a ring of LIST partitions, rotated every 5,000 jobs and "
             "truncated when drained (bench/ROTATION.md)")
    schema = "sys5"
    job_table = "sys5.jobs"
    tables = ("sys5.jobs", "sys5.ring")
    workloads = ("a", "f")
    background_call = "CALL sys5.rotator_loop(5000, 0.1)"

    def truncate(self, conn, attempts=5):
        conn.execute("SET lock_timeout = '60s'")
        try:
            conn.execute("SELECT %s.reset()" % self.schema)
        finally:
            conn.execute("RESET lock_timeout")

    def slots(self, conn):
        """The ring at the end of a run: how many partitions, in which state."""
        return dict(conn.execute("SELECT state, count(*) FROM %s.ring GROUP BY state"
                                 % self.schema).fetchall())

    def claim_one(self, conn, lock_key, blocking=False):
        row = conn.execute("SELECT slot, id FROM %s.claim('30 seconds')" % self.schema).fetchone()
        return (row[0], row[1]) if row else None

    def ack(self, conn, job_id, lock_key):
        conn.execute("SELECT %s.ack(%%s, %%s)" % self.schema, job_id)

    def claim_held(self, conn, k):
        return conn.execute("SELECT id FROM %s.claim('1 hour', %%s)" % self.schema, (k,)).fetchall()


class Sys6(Sys5):
    """sys5 in copy mode: the live rows move to a new slot when the dead
    tuples of the current one pile up (bench/ROTATION.md).  Its own schema,
    sys6, made from sys5's script."""
    key = "sys6"
    title = ("EXPERIMENT: sys5 in copy mode: live rows move to a new partition when the current one's "
             "dead tuples reach both 5,000 and its live rows; the old one is truncated (bench/ROTATION.md)")
    schema = "sys6"
    job_table = "sys6.jobs"
    tables = ("sys6.jobs", "sys6.ring")
    background_call = "CALL sys6.rotator_loop(5000, 0.1, copy => true)"

    def script(self, role):
        return os.path.join(SQL_DIR, "sys5_%s.sql" % role)

    def setup(self, conn):
        with open(os.path.join(SQL_DIR, "sys5_schema.sql")) as f:
            conn.execute(f.read().replace("sys5", "sys6"))


ALL = {"1": Sys1, "2": Sys2, "3": Sys3, "4": Sys4, "5": Sys5, "6": Sys6}
NAMES = {"sys1": "sys1", "sys2": "sys2", "sys3": "sys3", "sys4": "pgqueue", "sys5": "sys5 (rotating)",
         "sys6": "sys6 (moving)"}
