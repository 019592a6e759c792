/* pgqueue--1.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION pgqueue" to load this file. \quit

/*
 * Roles.  They are cluster-wide objects, so they survive DROP EXTENSION and
 * are shared by every database that installs pgqueue; create them only when
 * they are missing.
 */
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgqueue_producer') THEN
        CREATE ROLE pgqueue_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgqueue_consumer') THEN
        CREATE ROLE pgqueue_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgqueue_admin') THEN
        CREATE ROLE pgqueue_admin NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('pgqueue_admin', 'pgqueue_producer', 'MEMBER') THEN
        GRANT pgqueue_producer TO pgqueue_admin;
    END IF;
    IF NOT pg_catalog.pg_has_role('pgqueue_admin', 'pgqueue_consumer', 'MEMBER') THEN
        GRANT pgqueue_consumer TO pgqueue_admin;
    END IF;
END
$roles$;

CREATE SCHEMA pgqueue;
REVOKE ALL ON SCHEMA pgqueue FROM PUBLIC;

CREATE TYPE pgqueue.job_state AS ENUM ('pending', 'retry', 'scheduled', 'failed');

-- Per-queue settings; a queue without a row uses the defaults below.
CREATE TABLE pgqueue.queues (
    queue         text PRIMARY KEY
                  CHECK (octet_length(queue) BETWEEN 1 AND 128),
    weight        int NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 10000),
    max_in_flight int NOT NULL DEFAULT 0 CHECK (max_in_flight >= 0),
    max_tries     int NOT NULL DEFAULT 5 CHECK (max_tries >= 1),
    paused        boolean NOT NULL DEFAULT false,
    -- how long finished jobs are kept in pgqueue.archive; 0 keeps none
    -- (last, as ALTER TABLE adds it in an update from 1.0)
    retention     interval NOT NULL DEFAULT '0'
                  CHECK (retention >= '0' AND retention <= '365 days')
);

/*
 * Every job that is not finished.  run_after is never NULL: a job pushed
 * without a delay is due at its push time, which also makes it the "age"
 * the scheduler orders by within a priority.
 *
 * fillfactor (a slot's, below) leaves room on each page so that the
 * claim's update of tries/version (no indexed column changes) can be HOT.
 */
CREATE TABLE pgqueue.queue (
    id          uuid NOT NULL,
    created     timestamptz NOT NULL DEFAULT now(),
    version     int NOT NULL DEFAULT 0,
    queue       text NOT NULL,
    state       pgqueue.job_state NOT NULL DEFAULT 'pending',
    tries       int NOT NULL DEFAULT 0,
    priority    int NOT NULL DEFAULT 0,
    run_after   timestamptz NOT NULL DEFAULT now(),
    payload     jsonb NOT NULL DEFAULT '{}',
    dedup_key   text,
    last_error  text,
    slot        int NOT NULL DEFAULT 0  -- last, as ALTER TABLE adds it in an update from 1.0
) PARTITION BY LIST (slot);

/*
 * What the scheduler released to workers.  queue is a copy of the job's
 * queue so that claims filtered by queue need no join.  A row is claimable
 * when lock_timeout is NULL (never claimed, or released) or in the past
 * (lease ran out); the two partial indexes below let a claim find either kind
 * without walking past rows held under a live lease.
 *
 * While a job has a row here, its attempt count (tries) and version live in
 * this row: a claim writes only this row.  The job row's tries and version
 * are brought up to date when the job leaves work_queue (nack, failure,
 * release).  There is no foreign key to pgqueue.queue: the API removes both
 * rows itself (one fewer check per job scheduled, one fewer query per ack).
 */
CREATE TABLE pgqueue.work_queue (
    id           uuid NOT NULL,
    queue        text NOT NULL,
    created      timestamptz NOT NULL DEFAULT now(),
    version      int NOT NULL DEFAULT 0,
    batch_order  int NOT NULL,
    started      timestamptz,
    lock_key     text,
    lock_timeout timestamptz,
    tries        int NOT NULL DEFAULT 0,  -- last two, as ALTER TABLE adds them in an update from 1.0
    slot         int NOT NULL DEFAULT 0
) PARTITION BY LIST (slot);

/*
 * The slots: both tables are partitioned by slot (LIST), one partition a
 * slot, so that a slot whose rows are all finished can be given back whole
 * (TRUNCATE) instead of row by row through VACUUM, which a long snapshot
 * holds back (bench/ROTATION.md).  Slot 0 of each is made here as a
 * member of the extension, the others by the scheduler (pgqueue.slots,
 * below); the per-job calls write the slots directly (src/tables.c), the
 * other statements go through the parents.
 *
 * Each slot carries its own primary key and indexes, named after it
 * (queue_0_ready_idx is slot 0's queue_ready_idx); the parents have none.
 * Partitioned indexes on the parents would break pg_dump of a slot made
 * at run time (see pgqueue.archive below).  A job's id is unique across
 * slots because the API makes every id and moves a row from one slot to
 * another only by deleting it where it was.
 */
CREATE TABLE pgqueue.queue_0 PARTITION OF pgqueue.queue FOR VALUES IN (0)
    WITH (fillfactor = 80);
ALTER TABLE pgqueue.queue_0 ADD CONSTRAINT queue_0_pkey PRIMARY KEY (id);
-- What the scheduling pass reads: ready jobs per queue, best first.  The
-- priority is negated (as bigint: -(-2^31) does not fit an int) rather than
-- DESC so that the pass can start each queue's walk at a key
-- (-priority, run_after) with a row comparison (see src/schedule.c).
CREATE INDEX queue_0_ready_idx ON pgqueue.queue_0 (queue, (-(priority::bigint)), run_after, id)
    WHERE state IN ('pending', 'retry');
-- How many jobs of a queue sit in work_queue (max_in_flight).
CREATE INDEX queue_0_scheduled_idx ON pgqueue.queue_0 (queue)
    WHERE state = 'scheduled';
-- At most one live job per (queue, dedup_key); failed jobs do not count.
CREATE UNIQUE INDEX queue_0_dedup_idx ON pgqueue.queue_0 (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND state <> 'failed';
-- The dead letters of a queue (pgq_retry_failed, pgq_purge): only failed
-- jobs are in it, and state is already in the other indexes' predicates,
-- so no update that was HOT stops being HOT.
CREATE INDEX queue_0_failed_idx ON pgqueue.queue_0 (queue)
    WHERE state = 'failed';

CREATE TABLE pgqueue.work_queue_0 PARTITION OF pgqueue.work_queue FOR VALUES IN (0)
    WITH (fillfactor = 70);
ALTER TABLE pgqueue.work_queue_0 ADD CONSTRAINT work_queue_0_pkey PRIMARY KEY (id);
CREATE INDEX work_queue_0_ready_idx ON pgqueue.work_queue_0 (created, batch_order)
    WHERE lock_timeout IS NULL;
CREATE INDEX work_queue_0_queue_ready_idx ON pgqueue.work_queue_0 (queue, created, batch_order)
    WHERE lock_timeout IS NULL;
CREATE INDEX work_queue_0_lease_idx ON pgqueue.work_queue_0 (lock_timeout)
    WHERE lock_timeout IS NOT NULL;

/*
 * One row per unfinished job, merged from both tables: the current truth
 * (while a job is in work_queue, its tries live there).  state is the job's,
 * except that a job in work_queue is 'running' while a live lease holds it
 * and 'scheduled' otherwise.
 */
CREATE VIEW pgqueue.jobs AS
SELECT q.id, q.queue,
       CASE WHEN w.id IS NULL THEN q.state::text
            WHEN w.lock_timeout >= pg_catalog.clock_timestamp() THEN 'running'
            ELSE 'scheduled' END AS state,
       q.priority, q.run_after, q.created,
       coalesce(w.tries, q.tries) AS tries,
       coalesce(s.max_tries, 5) AS max_tries,
       w.lock_key, w.lock_timeout, q.last_error, q.payload
  FROM pgqueue.queue q
  LEFT JOIN pgqueue.work_queue w ON w.id = q.id
  LEFT JOIN pgqueue.queues s ON s.queue = q.queue;

/*
 * Finished jobs of the queues that have a retention (pgq_configure), written
 * in the transaction of the ack, cancel or purge that finishes them.
 *
 * Partitioned by the time a row expires (finished + the queue's retention
 * when it finished), one partition per UTC day, named archive_YYYYMMDD.
 * Dropping a partition whose whole day has passed removes exactly rows that
 * have expired, whatever each queue's retention: no row-by-row delete, no
 * dead rows.  The partitions are made at run time (src/archive.c: ahead of
 * need by the scheduler, by pgq_configure, and by a write that finds its
 * day missing), so they are not members of the extension: pg_dump dumps
 * them, their data and their attachment like any table of the database.
 */
CREATE TABLE pgqueue.archive (
    id          uuid NOT NULL,
    queue       text NOT NULL,
    payload     jsonb NOT NULL,
    priority    int NOT NULL,
    tries       int NOT NULL,
    created     timestamptz NOT NULL,
    finished    timestamptz NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('acked', 'cancelled', 'purged')),
    last_error  text,
    expires     timestamptz NOT NULL
) PARTITION BY RANGE (expires);

/*
 * "What became of job X" probes an index on id in each partition.  It is
 * made with each partition (src/archive.c), not as a partitioned index
 * here: CREATE EXTENSION would make that index before pg_restore attaches
 * the dumped partitions, ATTACH PARTITION would then build each
 * partition's index, and the restore's own CREATE INDEX of it would fail.
 */

/*
 * The state of each slot (src/ring.c): 'current' (where new rows go),
 * 'live' (may hold rows: calls visit it), 'drained' (found empty, waiting
 * to be truncated) or 'free' (truncated, the next to become current); a
 * slot without a row here is live.  since: when it last became current;
 * low, when set: rows moved into it are older than that (claims begin a
 * slot's walk only once they reach min(since, low)).  Only the scheduler
 * writes it.  The
 * scheduler makes the slots of queue and work_queue after slot 0 at run
 * time, as tables of their own attached to the parents (queue_1,
 * work_queue_1, ...): they are not members of the extension, and pg_dump
 * dumps them with their rows.  Slot 0 of queue is its cold slot: never
 * truncated, it keeps the jobs with a dedup_key (its unique index is the
 * only one) and the jobs that stayed in an old slot (src/ring.c).
 */
CREATE TABLE pgqueue.slots (
    tbl   text NOT NULL CHECK (tbl IN ('queue', 'work_queue')),
    slot  int NOT NULL CHECK (slot >= 0),
    state text NOT NULL CHECK (state IN ('current', 'live', 'drained', 'free')),
    since timestamptz NOT NULL DEFAULT now(),
    low   timestamptz,
    PRIMARY KEY (tbl, slot)
);

/*
 * pgq_push_periodic: the period whose job each (queue, name) pushed last.
 * A dedup_key only holds while its job is unfinished; this row keeps a
 * period that fires again after its job was acked from pushing twice.
 */
CREATE TABLE pgqueue.periodic (
    queue        text NOT NULL,
    name         text NOT NULL,
    period_start timestamptz NOT NULL,
    job          uuid,
    PRIMARY KEY (queue, name)
);

/*
 * pg_dump dumps the rows of these tables (user data), not only their
 * definition.  archive is partitioned: pg_dump keeps no rows in a
 * partitioned table itself, and dumps its partitions (made at run time, not
 * members of the extension) with their rows in any case; marking it says
 * that its data belongs to the user too.  queue and work_queue are
 * partitioned in the same way: their rows are in their slots, of which
 * slot 0 is a member of the extension (made above: CREATE EXTENSION on
 * restore makes it again, and the dump's rows go into it).
 */
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.work_queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.work_queue_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queues', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.archive', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.periodic', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.slots', '');

REVOKE ALL ON ALL TABLES IN SCHEMA pgqueue FROM PUBLIC;

/*
 * The API.  Every function is SECURITY DEFINER; the C code
 * schema-qualifies every object and passes values as parameters.  The
 * statements inside keep generic plans (see pgq_keep_plan) that are made,
 * and remade after each ANALYZE, at whatever size the tables have then:
 * made while a queue is nearly empty, a plan would keep its sequential or
 * bitmap scans as the tables grow.  Every statement is a probe of an index,
 * so the functions that run them turn both off; and JIT, which the cost of
 * a disabled scan (the few statements that must read a whole small table)
 * would otherwise set off on every call.  With search_path fixed to
 * pg_catalog, pg_temp, nothing on the caller's search_path can hijack an
 * operator or function of those statements.
 *
 * The per-job calls (pgq_push, pgq_claim, pgq_extend, pgq_ack,
 * pgq_ack_batch, pgq_nack) carry no SET clauses, which cost more than a
 * call's own work: they write the tables in C, resolving no name through
 * search_path, and their SQL statements (rare paths: a dedup push, a steal)
 * run under the same settings applied in C (pgq_spi_connect).
 * None is STRICT: a NULL required argument raises 22004 instead of silently
 * returning NULL.
 */
CREATE FUNCTION pgq_push(queue text,
                         payload jsonb DEFAULT '{}',
                         run_after timestamptz DEFAULT NULL,
                         priority int DEFAULT 0,
                         dedup_key text DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'pgq_push'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_push_batch(queue text,
                               payloads jsonb[],
                               run_after timestamptz DEFAULT NULL,
                               priority int DEFAULT 0)
RETURNS SETOF uuid
AS 'MODULE_PATHNAME', 'pgq_push_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_schedule(max_items int DEFAULT 100)
RETURNS int
AS 'MODULE_PATHNAME', 'pgq_schedule'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_claim(lock_key text,
                          max_items int DEFAULT 1,
                          lease interval DEFAULT '30 seconds',
                          queues text[] DEFAULT NULL,
                          wait interval DEFAULT '0')
RETURNS TABLE (id uuid, queue text, payload jsonb, tries int, version int,
               lock_timeout timestamptz)
AS 'MODULE_PATHNAME', 'pgq_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 10;

CREATE FUNCTION pgq_extend(id uuid, lock_key text,
                           lease interval DEFAULT '30 seconds')
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'pgq_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_ack(id uuid, lock_key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pgq_ack'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_ack_batch(ids uuid[], lock_key text)
RETURNS int
AS 'MODULE_PATHNAME', 'pgq_ack_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_nack(id uuid, lock_key text,
                         error text DEFAULT NULL,
                         retry_in interval DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'pgq_nack'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_release(lock_key text)
RETURNS int
AS 'MODULE_PATHNAME', 'pgq_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_configure(queue text,
                              weight int DEFAULT NULL,
                              max_in_flight int DEFAULT NULL,
                              max_tries int DEFAULT NULL,
                              paused boolean DEFAULT NULL,
                              retention interval DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'pgq_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_stats()
RETURNS TABLE (queue text, pending bigint, retry bigint, scheduled bigint,
               in_flight bigint, failed bigint, oldest_ready timestamptz)
AS 'MODULE_PATHNAME', 'pgq_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE FUNCTION pgq_counters()
RETURNS TABLE (pushed bigint, scheduled bigint, claimed bigint, acked bigint,
               nacked bigint, failed bigint, leases_stolen bigint,
               scheduler_passes bigint, stats_reset timestamptz)
AS 'MODULE_PATHNAME', 'pgq_counters'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

/*
 * Operating: the failed-job lifecycle, cancel, purge (src/admin.c), and
 * periodic jobs (pg_cron calls pgq_push_periodic once per period).
 */
CREATE FUNCTION pgq_retry(id uuid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pgq_retry'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_retry_failed(queue text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'pgq_retry_failed'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_cancel(id uuid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'pgq_cancel'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_purge(queue text, state text DEFAULT 'failed')
RETURNS bigint
AS 'MODULE_PATHNAME', 'pgq_purge'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

CREATE FUNCTION pgq_push_periodic(queue text, name text, period interval,
                                  payload jsonb DEFAULT '{}',
                                  priority int DEFAULT 0)
RETURNS uuid
AS 'MODULE_PATHNAME', 'pgq_push_periodic'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

/* Privileges: nothing for PUBLIC, everything through the three roles. */
REVOKE ALL ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_schedule(int) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_claim(text, int, interval, text[], interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_extend(uuid, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_ack(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_ack_batch(uuid[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_nack(uuid, text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_release(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_stats() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_configure(text, int, int, int, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_retry(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_retry_failed(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_cancel(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_purge(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_push_periodic(text, text, interval, jsonb, int) FROM PUBLIC;

GRANT USAGE ON SCHEMA @extschema@ TO pgqueue_producer, pgqueue_consumer, pgqueue_admin;

GRANT EXECUTE ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION pgq_push_periodic(text, text, interval, jsonb, int) TO pgqueue_producer;

GRANT EXECUTE ON FUNCTION pgq_claim(text, int, interval, text[], interval) TO pgqueue_consumer;
GRANT EXECUTE ON FUNCTION pgq_extend(uuid, text, interval) TO pgqueue_consumer;
GRANT EXECUTE ON FUNCTION pgq_ack(uuid, text) TO pgqueue_consumer;
GRANT EXECUTE ON FUNCTION pgq_ack_batch(uuid[], text) TO pgqueue_consumer;
GRANT EXECUTE ON FUNCTION pgq_nack(uuid, text, text, interval) TO pgqueue_consumer;
GRANT EXECUTE ON FUNCTION pgq_release(text) TO pgqueue_consumer;

-- pgqueue_admin is a member of both roles above (see the DO block) and also:
GRANT EXECUTE ON FUNCTION pgq_schedule(int) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_configure(text, int, int, int, boolean, interval) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_retry(uuid) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_retry_failed(text) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_cancel(uuid) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_purge(text, text) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_stats() TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_counters() TO pgqueue_admin;
GRANT USAGE ON SCHEMA pgqueue TO pgqueue_admin;
GRANT SELECT ON ALL TABLES IN SCHEMA pgqueue TO pgqueue_admin;
