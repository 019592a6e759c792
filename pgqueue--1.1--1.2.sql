/* pgqueue--1.1--1.2.sql: ALTER EXTENSION pgqueue UPDATE TO '1.2' */
\echo Use "ALTER EXTENSION pgqueue UPDATE TO '1.2'" to load this file. \quit

/*
 * Runs on a live 1.1 database: every job keeps its state, lease, holder and
 * tries; the scheduler and the calls go on, waiting for this transaction's
 * locks.  A fresh CREATE EXTENSION of 1.2 runs pgqueue--1.1.sql and then
 * this file, so a fresh 1.2 and an updated one have the same schema.
 *
 * The library tells the layouts apart per call (src/tables.c, pgq_layout:
 * work_queue's max_tries column), after it has locked the tables, so no
 * call sees half of this update.
 *
 * Locks first, in the order the calls and the scheduling passes take them
 * (work_queue, then queue, then the settings): the update waits for the
 * transactions that use them, and a call that comes meanwhile waits for
 * the update.  (A transaction that used one table before the update began
 * and asks for another while it waits can deadlock with it: one of the
 * two gets 40P01; docs/operations.md.)
 */
LOCK TABLE pgqueue.work_queue, pgqueue.queue, pgqueue.queues IN ACCESS EXCLUSIVE MODE;

/*
 * A job's own limit of tries (NULL: its queue's), set by pgq_push and
 * pgq_push_batch, copied into its work_queue row by the scheduler, read
 * where a try ends (pgq_nack, the steal of an expired lease, pgq_release).
 * Nullable, no default: adding them rewrites no row.  Last, as in every
 * slot the ring makes from now on (CREATE TABLE ... LIKE the parent).
 */
ALTER TABLE pgqueue.queue ADD COLUMN max_tries int;
ALTER TABLE pgqueue.work_queue ADD COLUMN max_tries int;

/*
 * Flows: a job pushed with "after" (its parents) waits, in the state
 * 'waiting', until the last of them is acked; waiting_for counts its
 * parents not yet acked (NULL for a job pushed without parents).  A
 * waiting job is in none of the scheduler's indexes (queue_ready_idx
 * holds 'pending' and 'retry' only).  The new label cannot be used in
 * this transaction (ALTER TYPE ... ADD VALUE), and nothing below does.
 */
ALTER TYPE pgqueue.job_state ADD VALUE 'waiting';
ALTER TABLE pgqueue.queue ADD COLUMN waiting_for int;
/*
 * True on a job that a job was pushed after (set by that push, never
 * cleared): only the ack of such a job looks for children, so a job that
 * is no parent pays nothing for flows.
 */
ALTER TABLE pgqueue.queue ADD COLUMN has_children boolean;

/*
 * The edges of the flows: child waits for parent.  Written by the push
 * that names the parent (which sets the parent's has_children, or locks
 * its row FOR KEY SHARE when it is set, so that its ack waits for the
 * push to commit and then sees the edge),
 * removed by the parent's ack (which counts the child down: src/flow.c),
 * or by a cancel or purge (which cancels the waiting descendants).  Data,
 * not state: pg_dump keeps its rows.
 */
CREATE TABLE pgqueue.job_parents (
    parent uuid NOT NULL,
    child  uuid NOT NULL,
    PRIMARY KEY (parent, child)
);
CREATE INDEX job_parents_child_idx ON pgqueue.job_parents (child);
SELECT pg_catalog.pg_extension_config_dump('pgqueue.job_parents', '');
REVOKE ALL ON pgqueue.job_parents FROM PUBLIC;
GRANT SELECT ON pgqueue.job_parents TO pgqueue_admin;

/*
 * Groups: a job's group_key (NULL: no group), set by pgq_push and
 * pgq_push_batch.  Nullable, no default: adding it rewrites no row.  Only
 * pgqueue.queue has it: the scheduler reads it there (work_queue's rows
 * need it nowhere).
 */
ALTER TABLE pgqueue.queue ADD COLUMN group_key text;

/*
 * Failed jobs page by (queue, id): every slot of pgqueue.queue attached
 * now gets its failed_idx on (queue, id) instead of (queue).  And its
 * group_idx: the jobs of each group of a queue, those in flight (scheduled
 * or retry: state = 'pending' false) first, then the pending ones in the
 * order they run (src/schedule.c, the walk of a queue's groups); jobs
 * without a group are not in it, so they pay no entry.  The slots the ring
 * makes from now on get both too (src/ring.c, make_slot).  Slots the ring
 * retired (detached, waiting to be dropped) are no longer read.
 */
DO $$
DECLARE
    slot regclass;
    idx  text;
BEGIN
    FOR slot IN
        SELECT i.inhrelid::regclass
          FROM pg_catalog.pg_inherits i
         WHERE i.inhparent = 'pgqueue.queue'::regclass
         ORDER BY i.inhrelid
    LOOP
        SELECT c.relname INTO idx
          FROM pg_catalog.pg_class c
         WHERE c.oid = slot;
        EXECUTE pg_catalog.format('DROP INDEX IF EXISTS pgqueue.%I', idx || '_failed_idx');
        EXECUTE pg_catalog.format(
            'CREATE INDEX %I ON %s (queue, id) WHERE state = ''failed''',
            idx || '_failed_idx', slot);
        EXECUTE pg_catalog.format(
            'CREATE INDEX %I ON %s (queue, group_key, (state = ''pending''),'
            ' (-(priority::bigint)), run_after, id)'
            ' WHERE group_key IS NOT NULL AND state IN (''pending'', ''retry'', ''scheduled'')',
            idx || '_group_idx', slot);
    END LOOP;
END
$$;

/*
 * Rate limits: the scheduler releases at most rate_limit jobs of a queue
 * into work_queue in any window of rate_period (0: no limit).  The columns
 * are filled by an UPDATE (a row a queue with settings: a small table)
 * before they get their defaults, so that no "missing value" of ADD
 * COLUMN ... DEFAULT stays in the catalog: a fresh install, which runs
 * this file too, and an updated database have the same catalog
 * (t/033_upgrade_dump.pl, t/035_upgrade_12.pl).
 */
ALTER TABLE pgqueue.queues
    ADD COLUMN rate_limit  int CHECK (rate_limit >= 0),
    ADD COLUMN rate_period interval
               CHECK (rate_period >= '10 milliseconds' AND rate_period <= '1 day');
UPDATE pgqueue.queues SET rate_limit = 0, rate_period = '1 second';
ALTER TABLE pgqueue.queues
    ALTER COLUMN rate_limit SET DEFAULT 0,
    ALTER COLUMN rate_limit SET NOT NULL,
    ALTER COLUMN rate_period SET DEFAULT '1 second',
    ALTER COLUMN rate_period SET NOT NULL;

/*
 * Groups: at most group_max_in_flight jobs of one group of the queue are
 * scheduled, running or in retry at once (0: no limit); added as
 * rate_limit is, so a fresh and an updated catalog are the same.
 */
ALTER TABLE pgqueue.queues
    ADD COLUMN group_max_in_flight int CHECK (group_max_in_flight >= 0);
UPDATE pgqueue.queues SET group_max_in_flight = 0;
ALTER TABLE pgqueue.queues
    ALTER COLUMN group_max_in_flight SET DEFAULT 0,
    ALTER COLUMN group_max_in_flight SET NOT NULL;

/*
 * The releases of each rate-limited queue in its last rate_period, in
 * buckets (src/rate.c), written by the scheduling passes in their own
 * transactions.  State of the scheduler, not data: pg_dump leaves its rows
 * out (a restored queue starts with an empty window).
 */
CREATE TABLE pgqueue.rate_windows (
    queue  text PRIMARY KEY,
    period bigint NOT NULL,     -- the rate_period the buckets cut, microseconds
    newest bigint NOT NULL,     -- the number of the last bucket of counts
    counts int[] NOT NULL       -- releases by bucket, oldest first
);
REVOKE ALL ON pgqueue.rate_windows FROM PUBLIC;
GRANT SELECT ON pgqueue.rate_windows TO pgqueue_admin;

/* A job's own max_tries, else its queue's; the parents a waiting job waits for; its group (last: views only grow at the end). */
CREATE OR REPLACE VIEW pgqueue.jobs AS
SELECT q.id, q.queue,
       CASE WHEN w.id IS NULL THEN q.state::text
            WHEN w.lock_timeout >= pg_catalog.clock_timestamp() THEN 'running'
            ELSE 'scheduled' END AS state,
       q.priority, q.run_after, q.created,
       coalesce(w.tries, q.tries) AS tries,
       coalesce(q.max_tries, s.max_tries, 5) AS max_tries,
       w.lock_key, w.lock_timeout, q.last_error, q.payload,
       coalesce(q.waiting_for, 0) AS waiting_for, q.group_key
  FROM pgqueue.queue q
  LEFT JOIN pgqueue.work_queue w ON w.id = q.id
  LEFT JOIN pgqueue.queues s ON s.queue = q.queue;

/*
 * pgq_push and pgq_push_batch gain max_tries, after and group_key,
 * pgq_configure rate_limit, rate_period and group_max_in_flight, pgq_stats
 * a column.  A function cannot gain an argument or a column in place, and
 * a second function beside the old one would make
 * every call that leaves the new argument out ambiguous; so they are
 * dropped and made again.  Privileges granted on them beyond the
 * extension's own (pgqueue_producer, pgqueue_admin) go with them: each is named in a
 * WARNING with the GRANT that gives it back (run after the update: granted
 * here, it would count as the extension's own, and pg_dump would not keep
 * it).  An object of the database that depends on them (a view, a
 * function with a SQL-standard body) stops the update with the usual
 * 2BP01, naming it.
 */
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT f.sig, a.grantee, a.is_grantable
          FROM (VALUES ('pgq_push(text, jsonb, timestamptz, int, text)',
                        'pgq_push(text, jsonb, timestamptz, int, text, int, uuid[], text)'),
                       ('pgq_push_batch(text, jsonb[], timestamptz, int)',
                        'pgq_push_batch(text, jsonb[], timestamptz, int, int, uuid[], text)'),
                       ('pgq_stats()', 'pgq_stats()'),
                       ('pgq_configure(text, int, int, int, boolean, interval)',
                        'pgq_configure(text, int, int, int, boolean, interval, int, interval, int)'))
               AS f(old, sig)
          JOIN pg_catalog.pg_proc p
            ON p.oid = pg_catalog.to_regprocedure(
                           pg_catalog.format('%s.%s',
                               (SELECT e.extnamespace::regnamespace::text
                                  FROM pg_catalog.pg_extension e
                                 WHERE e.extname = 'pgqueue'), f.old))
          LEFT JOIN pg_catalog.pg_init_privs ip
            ON ip.objoid = p.oid AND ip.classoid = 'pg_catalog.pg_proc'::regclass
           AND ip.objsubid = 0
          CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
         WHERE a.privilege_type = 'EXECUTE'
           AND NOT EXISTS (SELECT 1
                             FROM pg_catalog.aclexplode(ip.initprivs) i
                            WHERE i.grantee = a.grantee
                              AND i.privilege_type = 'EXECUTE')
           AND a.grantee <> p.proowner
    LOOP
        RAISE WARNING 'pgqueue 1.2: the EXECUTE privilege of % on % is not kept by the update',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(g.grantee::regrole::text) END,
            g.sig
            USING HINT = pg_catalog.format('After the update: GRANT EXECUTE ON FUNCTION %s TO %s%s;',
                g.sig,
                CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(g.grantee::regrole::text) END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

DROP FUNCTION pgq_push(text, jsonb, timestamptz, int, text);
DROP FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int);
DROP FUNCTION pgq_configure(text, int, int, int, boolean, interval);
DROP FUNCTION pgq_stats();

CREATE FUNCTION pgq_push(queue text,
                         payload jsonb DEFAULT '{}',
                         run_after timestamptz DEFAULT NULL,
                         priority int DEFAULT 0,
                         dedup_key text DEFAULT NULL,
                         max_tries int DEFAULT NULL,
                         after uuid[] DEFAULT NULL,
                         group_key text DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'pgq_push'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER;

CREATE FUNCTION pgq_push_batch(queue text,
                               payloads jsonb[],
                               run_after timestamptz DEFAULT NULL,
                               priority int DEFAULT 0,
                               max_tries int DEFAULT NULL,
                               after uuid[] DEFAULT NULL,
                               group_key text DEFAULT NULL)
RETURNS SETOF uuid
AS 'MODULE_PATHNAME', 'pgq_push_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

REVOKE ALL ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text, int, uuid[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int, int, uuid[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq_push(text, jsonb, timestamptz, int, text, int, uuid[], text) TO pgqueue_producer;
GRANT EXECUTE ON FUNCTION pgq_push_batch(text, jsonb[], timestamptz, int, int, uuid[], text) TO pgqueue_producer;

CREATE FUNCTION pgq_configure(queue text,
                              weight int DEFAULT NULL,
                              max_in_flight int DEFAULT NULL,
                              max_tries int DEFAULT NULL,
                              paused boolean DEFAULT NULL,
                              retention interval DEFAULT NULL,
                              rate_limit int DEFAULT NULL,
                              rate_period interval DEFAULT NULL,
                              group_max_in_flight int DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'pgq_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET jit = off;

REVOKE ALL ON FUNCTION pgq_configure(text, int, int, int, boolean, interval, int, interval, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq_configure(text, int, int, int, boolean, interval, int, interval, int) TO pgqueue_admin;

/* pgq_stats gains waiting (last, so that 1.1's columns keep their places). */
CREATE FUNCTION pgq_stats()
RETURNS TABLE (queue text, pending bigint, retry bigint, scheduled bigint,
               in_flight bigint, failed bigint, oldest_ready timestamptz,
               waiting bigint)
AS 'MODULE_PATHNAME', 'pgq_stats'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON FUNCTION pgq_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq_stats() TO pgqueue_admin;
