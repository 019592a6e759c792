--
-- Slots: pgqueue.queue and pgqueue.work_queue are partitioned by slot
-- (LIST), one partition a slot, so that a slot whose rows are all finished
-- can be given back whole (bench/ROTATION.md).  This version has one slot a
-- table, slot 0, made by the extension: every row lands there, whether
-- written by the per-job calls (in C, into the partition) or by SQL through
-- the parents; a missing slot is a clean error that loses nothing.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- the layout
SELECT c.relname, c.relkind, pg_get_partkeydef(c.oid) AS partkey
  FROM pg_class c
 WHERE c.oid IN ('pgqueue.queue'::regclass, 'pgqueue.work_queue'::regclass)
 ORDER BY 1;
SELECT p.relid::regclass AS part, p.parentrelid::regclass AS parent, p.isleaf,
       pg_get_expr(c.relpartbound, c.oid) AS bound, c.reloptions
  FROM pg_partition_tree('pgqueue.queue') p JOIN pg_class c ON c.oid = p.relid
 WHERE p.level = 1
UNION ALL
SELECT p.relid::regclass, p.parentrelid::regclass, p.isleaf,
       pg_get_expr(c.relpartbound, c.oid), c.reloptions
  FROM pg_partition_tree('pgqueue.work_queue') p JOIN pg_class c ON c.oid = p.relid
 WHERE p.level = 1
 ORDER BY 1;
-- the slots are the extension's, and pg_dump dumps their rows
SELECT c::regclass AS marked_for_dump
  FROM pg_extension e, unnest(e.extconfig) c
 WHERE e.extname = 'pgqueue' AND c::regclass::text LIKE '%\_0'
 ORDER BY 1;
SELECT count(*) AS slot_members
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgqueue'
 WHERE d.deptype = 'e' AND d.classid = 'pg_class'::regclass
   AND d.objid IN ('pgqueue.queue_0'::regclass, 'pgqueue.work_queue_0'::regclass);
-- each slot has its own primary key and indexes, named after it (the
-- calls in C find them so); the parents have none, so that a slot made at
-- run time can be dumped and restored as a table of its own
SELECT i.indrelid::regclass AS tbl, i.indexrelid::regclass AS idx, i.indisprimary, i.indisunique,
       pg_get_expr(i.indpred, i.indrelid) AS pred
  FROM pg_index i
 WHERE i.indrelid IN ('pgqueue.queue'::regclass, 'pgqueue.work_queue'::regclass,
                      'pgqueue.queue_0'::regclass, 'pgqueue.work_queue_0'::regclass)
 ORDER BY i.indexrelid::regclass::text;

-- rows written in C (push, schedule, claim) and through SQL (a dedup push,
-- a nack) all land in slot 0
SELECT pgq_push('s', '{"n": 1}') IS NOT NULL AS pushed;
SELECT pgq_push('s', '{"n": 2}', dedup_key => 'k') IS NOT NULL AS pushed_dedup;
SELECT count(*) AS n FROM (SELECT pgq_push_batch('s', ARRAY['{"n": 3}', '{"n": 4}']::jsonb[])) b;
SELECT pgq_schedule();
SELECT tableoid::regclass AS part, slot, count(*) FROM pgqueue.queue GROUP BY 1, 2;
SELECT tableoid::regclass AS part, slot, count(*) FROM pgqueue.work_queue GROUP BY 1, 2;
SELECT count(*) AS claimed FROM pgq_claim('w', 2, '1 minute');
SELECT n AS nacked_to, count(*)
  FROM pgqueue.work_queue w, pgq_nack(w.id, 'w', 'try again', '0') n
 WHERE w.lock_key = 'w' GROUP BY n;
SELECT pgq_schedule();
SELECT tableoid::regclass AS part, slot, state, count(*) FROM pgqueue.queue GROUP BY 1, 2, 3 ORDER BY 3;
SELECT tableoid::regclass AS part, slot, count(*) FROM pgqueue.work_queue GROUP BY 1, 2;
-- a job's id is unique across the table (the API makes every id)
SELECT count(*) = count(DISTINCT id) AS ids_unique FROM pgqueue.queue;

-- a slot that is missing: each call fails cleanly, and nothing stored is
-- lost when the slot comes back (the lookup of the slot is not kept across
-- the change)
BEGIN;
ALTER TABLE pgqueue.queue DETACH PARTITION pgqueue.queue_0;
SAVEPOINT s;
SELECT pgq_push('s', '{"n": 5}');
ROLLBACK TO s;
SELECT pgq_schedule();
ROLLBACK;
BEGIN;
ALTER TABLE pgqueue.work_queue DETACH PARTITION pgqueue.work_queue_0;
SAVEPOINT s;
SELECT * FROM pgq_claim('w', 1, '1 minute');
ROLLBACK;
SELECT count(*) AS jobs_kept FROM pgqueue.queue;
SELECT pgq_push('s', '{"n": 5}') IS NOT NULL AS pushed_again;
SELECT count(*) AS claimed_again FROM pgq_claim('w', 10, '1 minute');
SELECT tableoid::regclass AS part, count(*) FROM pgqueue.queue GROUP BY 1;

-- a row of a slot that does not exist has nowhere to go
INSERT INTO pgqueue.queue (id, queue, slot) VALUES (gen_random_uuid(), 's', 1);

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
