--
-- 1.2: a job's own max_tries (pgq_push, pgq_push_batch), read where a try
-- ends: pgq_nack, the steal of an expired lease, pgq_release; and the
-- index of failed jobs on (queue, id).
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

CREATE TEMP VIEW j AS
SELECT q.payload->>'n' AS n, j.state, j.tries, j.max_tries,
       q.max_tries AS own, w.max_tries AS in_work_queue, j.last_error
  FROM pgqueue.jobs j
  JOIN pgqueue.queue q USING (id)
  LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.id;

-- the queue allows 5 tries (the default); each job says its own
SELECT pgq_push('mt', '{"n": "own1"}', max_tries => 1) IS NOT NULL AS pushed;
SELECT pgq_push('mt', '{"n": "own2"}', max_tries => 2) IS NOT NULL AS pushed;
SELECT pgq_push('mt', '{"n": "queue"}') IS NOT NULL AS pushed;
SELECT pgq_push('mt', '{"n": "null"}', max_tries => NULL) IS NOT NULL AS pushed;
SELECT count(*) AS pushed FROM pgq_push_batch('mt', ARRAY['{"n": "batch1"}', '{"n": "batch2"}']::jsonb[],
                                              max_tries => 1);
-- before the scheduler: the job row has it, work_queue has no row yet
SELECT * FROM j;
SELECT pgq_schedule();
-- scheduled: copied into the work_queue row
SELECT * FROM j;

-- nack: own1 fails on its first try, own2 and queue retry
SELECT n, pgq_nack(id, 'w1', 'boom')
  FROM pgq_claim('w1', 10) c, LATERAL (SELECT c.payload->>'n' AS n) x
 ORDER BY n;
SELECT * FROM j;

-- own2's second try: fails; its queue's max_tries (5) does not apply
UPDATE pgqueue.queue SET run_after = now() WHERE state = 'retry';
SELECT pgq_schedule();
SELECT n, pgq_nack(id, 'w1', 'boom again')
  FROM pgq_claim('w1', 10) c, LATERAL (SELECT c.payload->>'n' AS n) x
 ORDER BY n;
SELECT n, state, tries, max_tries FROM j ORDER BY n;

-- the queue's max_tries changes nothing for a job that has its own, and
-- applies to the others
SELECT pgq_configure('mt', max_tries => 2) IS NOT NULL AS configured;
SELECT n, state, tries, max_tries FROM j ORDER BY n;

-- an expired lease on the last try: the steal fails the job
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('steal', '{"n": "s1"}', max_tries => 1) IS NOT NULL AS pushed;
SELECT pgq_push('steal', '{"n": "s2"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', 2, '1 millisecond');
SELECT pg_sleep(0.01);
-- w2's claim finds both leases expired: s1 fails, s2 is stolen (try 2)
SELECT payload->>'n' AS n, tries FROM pgq_claim('w2', 2, '5 minutes');
SELECT n, state, tries, max_tries, last_error FROM j ORDER BY n;

-- release on the last try fails the job
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('rel', '{"n": "r1"}', max_tries => 1) IS NOT NULL AS pushed;
SELECT pgq_push('rel', '{"n": "r2"}', max_tries => 3) IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('node-1', 2);
SELECT pgq_release('node-1');
SELECT n, state, tries, max_tries, last_error FROM j ORDER BY n;

-- a dedup push keeps its max_tries; a second push with the same key
-- returns the first job and changes nothing
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('dd', '{"n": "d1"}', dedup_key => 'k', max_tries => 3) AS d1 \gset
SELECT pgq_push('dd', '{"n": "d2"}', dedup_key => 'k', max_tries => 7) = :'d1' AS same_job;
SELECT n, state, max_tries, own FROM j;
SELECT pgq_schedule();
SELECT n, in_work_queue FROM j;

-- pgq_retry of a failed job with its own max_tries: it has its tries again
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('rt', '{"n": "t1"}', max_tries => 1) AS t1 \gset
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w1', 'x') FROM pgq_claim('w1', 1);
SELECT pgq_retry(:'t1');
SELECT pgq_schedule();
SELECT n, state, max_tries, in_work_queue FROM j;
SELECT pgq_nack(id, 'w1', 'y') FROM pgq_claim('w1', 1);

-- bad input: below 1 is 22023, nothing stored
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('bad', '{}', max_tries => 0);
\set VERBOSITY sqlstate
SELECT pgq_push('bad', '{}', max_tries => 0);
SELECT pgq_push('bad', '{}', max_tries => -1);
SELECT pgq_push('bad', '{}', dedup_key => 'k', max_tries => 0);
SELECT pgq_push_batch('bad', ARRAY['{}']::jsonb[], max_tries => 0);
SELECT pgq_push_batch('bad', ARRAY['{}']::jsonb[], max_tries => -2147483648);
\set VERBOSITY default
SELECT count(*) AS stored FROM pgqueue.queue;
-- the largest is taken
SELECT pgq_push('big', '{}', max_tries => 2147483647) IS NOT NULL AS pushed;
SELECT max_tries FROM pgqueue.jobs;

-- failed jobs page by (queue, id) in every slot: an index-only scan
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relname ~ '^queue_[0-9]+_failed_idx$'
 ORDER BY c.relname
 LIMIT 1;
-- (the slots a ring makes: t/035_upgrade_12.pl)
SELECT count(*) FILTER (WHERE pg_get_indexdef(i.indexrelid) !~ '\(queue, id\)') = 0 AS every_slot_pages_by_id
  FROM pg_inherits h
  JOIN pg_index i ON i.indrelid = h.inhrelid
  JOIN pg_class c ON c.oid = i.indexrelid
 WHERE h.inhparent = 'pgqueue.queue'::regclass
   AND c.relname ~ '_failed_idx$';
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF)
SELECT id FROM pgqueue.queue_0
 WHERE queue = 'f' AND state = 'failed' AND id > '00000000-0000-0000-0000-000000000000'
 ORDER BY id LIMIT 10;
RESET enable_seqscan;
RESET enable_bitmapscan;

DROP VIEW j;
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
