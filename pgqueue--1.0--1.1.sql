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
