--
-- pgq_stats(): one row per queue that has jobs or settings.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- nothing at all: no rows
SELECT * FROM pgq_stats();

-- queue "a" gets one job in every state:
--   pending (due an hour ago), pending (due in an hour), retry,
--   scheduled (never claimed), scheduled under an expired lease,
--   scheduled under a live lease (in flight), failed
SELECT pgq_push('a', '{"n": "in flight"}', priority => 9) IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "failed"}', priority => 8) IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "retry"}', priority => 7) IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "expired"}', priority => 6) IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "scheduled"}', priority => 5) IS NOT NULL AS pushed;
-- queue "b" has settings only; queue "c" only a failed job
SELECT pgq_configure('b', paused => true);
SELECT pgq_push('c', '{"n": "c failed"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1', 1, '1 hour', '{a}');
SELECT pgq_configure('a', max_tries => 1);
SELECT pgq_configure('c', max_tries => 1);
SELECT payload, pgq_nack(id, 'w1', 'boom') FROM pgq_claim('w1', 1, '1 hour', '{a}');
SELECT payload, pgq_nack(id, 'w1', 'boom') FROM pgq_claim('w1', 1, '1 hour', '{c}');
SELECT pgq_configure('a', max_tries => 5);
SELECT payload, pgq_nack(id, 'w1', 'later', '1 hour') FROM pgq_claim('w1', 1, '1 hour', '{a}');
SELECT payload FROM pgq_claim('w1', 1, '1 millisecond', '{a}');
SELECT pgq_push('a', '{"n": "pending, due an hour ago"}', now() - interval '1 hour') IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "pending, due in an hour"}', now() + interval '1 hour') IS NOT NULL AS pushed;
SELECT pg_sleep(0.01);

SELECT payload->>'n' AS n, q.state, w.lock_key IS NOT NULL AS claimed,
       w.lock_timeout > clock_timestamp() AS live
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.queue, q.id;
SELECT queue, pending, retry, scheduled, in_flight, failed,
       oldest_ready IS NOT NULL AS has_oldest_ready
  FROM pgq_stats();
-- oldest_ready: the earliest due time of a ready job not in flight (here
-- the pending job due an hour ago)
SELECT s.oldest_ready = q.run_after AS oldest_is_the_hour_old_job
  FROM pgq_stats() s, pgqueue.queue q
 WHERE s.queue = 'a' AND q.payload = '{"n": "pending, due an hour ago"}';
-- scheduled and not claimed, it is still ready
SELECT pgq_schedule(1);
SELECT s.oldest_ready = q.run_after AS oldest_is_the_hour_old_job
  FROM pgq_stats() s, pgqueue.queue q
 WHERE s.queue = 'a' AND q.payload = '{"n": "pending, due an hour ago"}';
SELECT queue, pending, retry, scheduled, in_flight, failed FROM pgq_stats();
-- claim every ready job: nothing is ready any more (the delayed pending job
-- and the retry job are not due, so they do not count)
SELECT payload FROM pgq_claim('w4', 10, '1 hour') ORDER BY payload;
SELECT queue, pending, retry, scheduled, in_flight, failed, oldest_ready
  FROM pgq_stats();
-- a queue whose jobs and settings are all gone has no row
DELETE FROM pgqueue.queues WHERE queue = 'c';
DELETE FROM pgqueue.queue WHERE queue = 'c';
SELECT queue FROM pgq_stats();

-- many queues: one row each, in name order
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT count(*) AS pushed
  FROM generate_series(1, 12) g, pgq_push('q' || lpad(g::text, 2, '0'), '{}');
SELECT pgq_schedule(6);
SELECT queue, pending, scheduled FROM pgq_stats();
SELECT sum(pending) AS pending, sum(scheduled) AS scheduled FROM pgq_stats();

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
