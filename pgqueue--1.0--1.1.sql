/* pgqueue--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION pgqueue UPDATE TO '1.1'" to load this file. \quit

/*
 * Lighter rows.  While a job is in work_queue its attempt count and version
 * live in its work_queue row, so a claim writes one row; the job row is
 * brought up to date when the job leaves work_queue.  The jobs in flight at
 * the update keep their tries, version, lease and holder: their counts are
 * copied over here, and the library (which serves both layouts, telling them
 * apart by this column) uses the new column from the next call on.
 *
 * The foreign key goes: the API removes both rows of a job itself.
 *
 * ALTER TABLE takes ACCESS EXCLUSIVE locks on both tables, so claims, acks
 * and scheduling passes wait for this transaction and then see the new
 * layout.
 */
ALTER TABLE pgqueue.work_queue DROP CONSTRAINT work_queue_id_fkey;
ALTER TABLE pgqueue.work_queue ADD COLUMN tries int NOT NULL DEFAULT 0;
UPDATE pgqueue.work_queue w
   SET tries = q.tries, version = q.version
  FROM pgqueue.queue q
 WHERE q.id = w.id;

/*
 * Slots (see pgqueue--1.1.sql): each table becomes the slot 0 partition of
 * a new parent of the same name, LIST-partitioned by a new slot column
 * (added with a constant default: no rewrite).  The table keeps its rows
 * and its indexes, renamed after the slot as a fresh install names them;
 * the attach reads the rows once to check the partition constraint.  The
 * slot column's NOT NULL is named as a fresh install's too: PostgreSQL 18
 * keeps NOT NULL constraints by name, and the parents copy them (LIKE);
 * earlier majors ignore the name.
 */
ALTER TABLE pgqueue.queue RENAME TO queue_0;
ALTER TABLE pgqueue.queue_0 ADD COLUMN slot int CONSTRAINT queue_slot_not_null NOT NULL DEFAULT 0;
ALTER TABLE pgqueue.queue_0 RENAME CONSTRAINT queue_pkey TO queue_0_pkey;
ALTER INDEX pgqueue.queue_ready_idx RENAME TO queue_0_ready_idx;
ALTER INDEX pgqueue.queue_scheduled_idx RENAME TO queue_0_scheduled_idx;
ALTER INDEX pgqueue.queue_dedup_idx RENAME TO queue_0_dedup_idx;
-- The dead letters of a queue (pgq_retry_failed, pgq_purge).
CREATE INDEX queue_0_failed_idx ON pgqueue.queue_0 (queue)
    WHERE state = 'failed';
ALTER TABLE pgqueue.work_queue RENAME TO work_queue_0;
ALTER TABLE pgqueue.work_queue_0 ADD COLUMN slot int CONSTRAINT work_queue_slot_not_null NOT NULL DEFAULT 0;
ALTER TABLE pgqueue.work_queue_0 RENAME CONSTRAINT work_queue_pkey TO work_queue_0_pkey;
ALTER INDEX pgqueue.work_queue_ready_idx RENAME TO work_queue_0_ready_idx;
ALTER INDEX pgqueue.work_queue_queue_ready_idx RENAME TO work_queue_0_queue_ready_idx;
ALTER INDEX pgqueue.work_queue_lease_idx RENAME TO work_queue_0_lease_idx;

-- the parents: the slots' columns, in their order, with their defaults
CREATE TABLE pgqueue.queue (LIKE pgqueue.queue_0 INCLUDING DEFAULTS)
    PARTITION BY LIST (slot);
CREATE TABLE pgqueue.work_queue (LIKE pgqueue.work_queue_0 INCLUDING DEFAULTS)
    PARTITION BY LIST (slot);
ALTER TABLE pgqueue.queue ATTACH PARTITION pgqueue.queue_0 FOR VALUES IN (0);
ALTER TABLE pgqueue.work_queue ATTACH PARTITION pgqueue.work_queue_0 FOR VALUES IN (0);
REVOKE ALL ON pgqueue.queue, pgqueue.work_queue FROM PUBLIC;
GRANT SELECT ON pgqueue.queue, pgqueue.work_queue TO pgqueue_admin;

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

REVOKE ALL ON pgqueue.jobs FROM PUBLIC;
GRANT SELECT ON pgqueue.jobs TO pgqueue_admin;

/*
 * The per-job calls lose their SET clauses (see pgqueue--1.1.sql): they
 * write the tables in C and apply the same settings themselves around the
 * SQL statements they run.
 */
ALTER FUNCTION pgq_push(text, jsonb, timestamptz, int, text) RESET ALL;
ALTER FUNCTION pgq_claim(text, int, interval, text[], interval) RESET ALL;
ALTER FUNCTION pgq_extend(uuid, text, interval) RESET ALL;
ALTER FUNCTION pgq_ack(uuid, text) RESET ALL;
ALTER FUNCTION pgq_ack_batch(uuid[], text) RESET ALL;
ALTER FUNCTION pgq_nack(uuid, text, text, interval) RESET ALL;

/*
 * Operating pgqueue: a retention per queue (last column, as in a fresh
 * install), the archive, the marks of periodic jobs, and pg_dump of the
 * user's data (1.0 did not mark its tables, so a dump brought back no
 * jobs).  The index of the dead letters is made with the slots, above.
 */
ALTER TABLE pgqueue.queues
    ADD COLUMN retention interval NOT NULL DEFAULT '0'
               CHECK (retention >= '0' AND retention <= '365 days');

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
 * that its data belongs to the user too.
 */
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.work_queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queue_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.work_queue_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.queues', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.archive', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.periodic', '');
SELECT pg_catalog.pg_extension_config_dump('pgqueue.slots', '');

REVOKE ALL ON pgqueue.archive, pgqueue.periodic, pgqueue.slots FROM PUBLIC;
GRANT SELECT ON pgqueue.archive, pgqueue.periodic, pgqueue.slots TO pgqueue_admin;

/*
 * pgq_configure gets its retention argument: a new signature, so the 1.0
 * function goes (the same C function serves both, by its number of
 * arguments).
 */
DROP FUNCTION pgq_configure(text, int, int, int, boolean);
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

REVOKE ALL ON FUNCTION pgq_configure(text, int, int, int, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_retry(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_retry_failed(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_cancel(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_purge(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_push_periodic(text, text, interval, jsonb, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq_push_periodic(text, text, interval, jsonb, int) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION pgq_configure(text, int, int, int, boolean, interval) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_retry(uuid) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_retry_failed(text) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_cancel(uuid) TO pgqueue_admin;
GRANT EXECUTE ON FUNCTION pgq_purge(text, text) TO pgqueue_admin;
