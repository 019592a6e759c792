--
-- pgq_schedule: which jobs a pass moves to work_queue, how many, and in what
-- order (batch_order): due jobs only, priority then due time within a queue,
-- weighted fair share across queues.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- what the scheduler released, in claim order
CREATE TEMP VIEW released AS
SELECT w.batch_order, w.queue, q.payload, q.priority, q.state, q.tries, q.version,
       w.lock_key, w.started, w.lock_timeout
  FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
 ORDER BY w.created, w.batch_order;

-- nothing to do
SELECT pgq_schedule();

-- pending -> scheduled: one batch, batch_order 1..n, nothing claimed yet
SELECT pgq_push('a', jsonb_build_object('n', g)) IS NOT NULL AS pushed
  FROM generate_series(1, 3) g;
SELECT pgq_schedule();
SELECT * FROM released;
SELECT state, count(*) FROM pgqueue.queue GROUP BY 1;
SELECT count(DISTINCT created) AS batches FROM pgqueue.work_queue;
-- a second pass finds nothing new
SELECT pgq_schedule();

-- a later pass comes after an earlier one in claim order, and its batch
-- starts again at 1
SELECT pgq_push('a', '{"n": 4}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT batch_order, payload FROM released;

--
-- delayed jobs: run_after in the future is not scheduled
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('d', '{"n": "in an hour"}', now() + interval '1 hour') IS NOT NULL AS pushed;
SELECT pgq_push('d', '{"n": "in 1 s"}', clock_timestamp() + interval '1 second') IS NOT NULL AS pushed;
SELECT pgq_push('d', '{"n": "a minute ago"}', now() - interval '1 minute') IS NOT NULL AS pushed;
SELECT pgq_push('d', '{"n": "now"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload->>'n' AS n, state FROM pgqueue.queue ORDER BY run_after;
-- once due, it is scheduled
SELECT pg_sleep(1.05);
SELECT pgq_schedule();
SELECT payload->>'n' AS n, state FROM pgqueue.queue ORDER BY run_after;

--
-- order within a queue: priority DESC, then run_after, then id
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('p', '{"n": "p0 first"}') IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p5 first"}', priority => 5) IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p-1"}', priority => -1) IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p5 second"}', priority => 5) IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p0 due 1 min ago"}', now() - interval '1 minute') IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p0 due 2 min ago"}', now() - interval '2 minutes') IS NOT NULL AS pushed;
SELECT pgq_push('p', '{"n": "p100 in the future"}', now() + interval '1 hour', 100) IS NOT NULL AS pushed;
-- same priority, same run_after: by id, i.e. push order
SELECT count(*) AS pushed FROM pgq_push_batch('p', ARRAY['{"n": "tie 1"}', '{"n": "tie 2"}', '{"n": "tie 3"}']::jsonb[],
                                              '2000-01-01 00:00:00+00', 1);
SELECT pgq_schedule();
SELECT batch_order, payload->>'n' AS n, priority FROM released;
SELECT payload->>'n' AS n, state FROM pgqueue.queue WHERE state <> 'scheduled';

--
-- max_items: at most that many per pass, the best first
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed
  FROM generate_series(1, 5) g, pgq_push('m', jsonb_build_object('n', g), priority => g);
SELECT pgq_schedule(2);
SELECT batch_order, payload FROM released;
SELECT pgq_schedule(2);
SELECT pgq_schedule(2);
SELECT pgq_schedule(2);
SELECT payload FROM released;
SELECT pgq_schedule(max_items => 1);

--
-- fairness: a queue with 10 ready jobs is not starved by one with 1000
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed
  FROM pgq_push_batch('big', (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, 1000) g));
SELECT count(*) AS pushed
  FROM pgq_push_batch('small', (SELECT array_agg(jsonb_build_object('n', g)) FROM generate_series(1, 10) g));
SELECT pgq_schedule(100);
-- the small queue gets all 10, the big one the rest of the batch
SELECT queue, count(*), min(batch_order), max(batch_order)
  FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;
-- the batch interleaves the queues: the small queue's jobs are among the
-- first 20 to be claimed, and each queue's jobs keep their own order
SELECT count(*) AS small_in_first_20
  FROM pgqueue.work_queue WHERE queue = 'small' AND batch_order <= 20;
SELECT queue, bool_and((payload->>'n')::int = rank) AS in_order
  FROM (SELECT queue, payload, rank() OVER (PARTITION BY queue ORDER BY batch_order)
          FROM released) s
 GROUP BY queue ORDER BY queue;
-- batch_order is 1..100 without gaps
SELECT count(*) AS jobs, count(DISTINCT batch_order) AS distinct_orders,
       min(batch_order), max(batch_order)
  FROM pgqueue.work_queue;
-- with the small queue empty, the big one fills whole passes
SELECT pgq_schedule(100);
SELECT queue, count(*) FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;

-- three queues, two of them busy: the leftover of the quiet one is shared
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed
  FROM pgq_push_batch('b1', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 500)));
SELECT count(*) AS pushed
  FROM pgq_push_batch('b2', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 500)));
SELECT pgq_push('quiet') IS NOT NULL AS pushed;
SELECT pgq_schedule(100);
SELECT queue, count(*) FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;

--
-- weights: shares of a pass follow weight
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('heavy', weight => 3);
SELECT count(*) AS pushed
  FROM pgq_push_batch('heavy', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 1000)));
SELECT count(*) AS pushed
  FROM pgq_push_batch('light', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 1000)));
SELECT pgq_schedule(100);
SELECT queue, count(*) FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;
SELECT pgq_schedule(8);
SELECT queue, count(*) FROM pgqueue.work_queue
 WHERE created = (SELECT max(created) FROM pgqueue.work_queue)
 GROUP BY queue ORDER BY queue;
-- within the batch, three heavy jobs for each light one
SELECT string_agg(CASE WHEN queue = 'heavy' THEN 'H' ELSE 'L' END, '' ORDER BY batch_order) AS pattern
  FROM pgqueue.work_queue
 WHERE created = (SELECT max(created) FROM pgqueue.work_queue);
SELECT pgq_configure('light', weight => 10000);
SELECT pgq_schedule(100);
SELECT queue, count(*) FROM pgqueue.work_queue
 WHERE created = (SELECT max(created) FROM pgqueue.work_queue)
 GROUP BY queue ORDER BY queue;

--
-- what is never scheduled: failed jobs, retry jobs not yet due, paused
-- queues (see configure.sql for paused and max_in_flight)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_configure('f', max_tries => 1);
SELECT pgq_push('f', '{"n": "will fail"}') IS NOT NULL AS pushed;
SELECT pgq_push('r', '{"n": "will retry later"}') IS NOT NULL AS pushed;
SELECT pgq_push('r', '{"n": "will retry now"}', priority => -1) IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT q.payload->>'n' AS n,
       pgq_nack(c.id, 'w1', 'boom', CASE WHEN q.priority = 0 THEN interval '1 hour' ELSE interval '0' END)
  FROM pgq_claim('w1', 10) c JOIN pgqueue.queue q USING (id) ORDER BY 1;
SELECT pgq_schedule();
SELECT payload->>'n' AS n, state, tries FROM pgqueue.queue ORDER BY 1;
SELECT batch_order, payload->>'n' AS n, tries, version FROM released;

-- a pass is transactional: rolled back, it moved nothing
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('tx') IS NOT NULL AS pushed;
BEGIN;
SELECT pgq_schedule();
ROLLBACK;
SELECT state, (SELECT count(*) FROM pgqueue.work_queue) AS in_work_queue FROM pgqueue.queue;
SELECT pgq_schedule();

--
-- passes start each queue's walk at a bound kept in shared memory; a job
-- made ready behind the API's back (a manual UPDATE, which moves no bound)
-- is still found within a second, when a pass walks from the start
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('m', '{"n": "manual"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT pgq_schedule();
DELETE FROM pgqueue.work_queue;
UPDATE pgqueue.queue SET state = 'pending', priority = 9;
SELECT pg_sleep(1.1);
SELECT pgq_schedule();
SELECT payload->>'n' AS n, state FROM pgqueue.queue;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
