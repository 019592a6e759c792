--
-- pgq_release(lock_key): give back every job a lock_key holds (a node that
-- restarted); jobs on their last try are failed instead.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

CREATE TEMP VIEW jobs AS
SELECT q.queue, q.payload->>'n' AS n, q.state, q.tries, q.version, q.last_error,
       w.id IS NOT NULL AS in_work_queue, w.lock_key,
       w.started IS NOT NULL AS started, w.lock_timeout IS NOT NULL AS leased
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.queue, q.id;

-- nothing held: 0
SELECT pgq_release('node-1');

SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('a', jsonb_build_object('n', g));
SELECT count(*) AS pushed FROM generate_series(1, 2) g, pgq_push('b', jsonb_build_object('n', g));
SELECT pgq_schedule();
-- node-1 holds a1, b1 and a3 (a3 with a lease that ran out but was not
-- taken), node-2 holds a2; b2 is not claimed
SELECT queue, payload FROM pgq_claim('node-1', 2) ORDER BY queue;
SELECT queue, payload FROM pgq_claim('node-2', 1, queues => '{a}');
SELECT queue, payload FROM pgq_claim('node-1', 1, '1 millisecond', '{a}');
SELECT pg_sleep(0.01);
SELECT * FROM jobs;

-- release: all three are claimable again at once, tries are kept
SELECT pgq_release('node-1');
SELECT * FROM jobs;
-- node-1 has lost them
SELECT count(*) AS acked FROM pgqueue.queue q, pgq_ack(q.id, 'node-1') a WHERE a;
SELECT count(*) AS extended FROM pgqueue.queue q, pgq_extend(q.id, 'node-1') e WHERE e IS NOT NULL;
-- a second release finds nothing
SELECT pgq_release('node-1');
-- other keys are untouched, even similar ones
SELECT pgq_release('node-');
SELECT pgq_release('NODE-2');
SELECT pgq_release('node-%');
SELECT lock_key, count(*) FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
-- the released jobs come back in their original scheduling order
SELECT queue, payload, tries FROM pgq_claim('node-3', 10);
SELECT * FROM jobs;

--
-- the last try: a released job that has no try left is failed
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('last', max_tries => 1);
SELECT pgq_configure('more', max_tries => 3);
SELECT pgq_push('last', '{"n": "last"}') IS NOT NULL AS pushed;
SELECT pgq_push('more', '{"n": "more"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('node-1', 10);
-- both count in the result
SELECT pgq_release('node-1');
SELECT * FROM jobs;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('node-1', 10);
SELECT * FROM jobs;

-- the default max_tries of 5
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_push('dflt', '{"n": "dflt"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('n');
SELECT pgq_release('n');
SELECT tries FROM pgq_claim('n');
SELECT pgq_release('n');
SELECT tries FROM pgq_claim('n');
SELECT pgq_release('n');
SELECT tries FROM pgq_claim('n');
SELECT pgq_release('n');
SELECT * FROM jobs;
SELECT tries FROM pgq_claim('n');
SELECT pgq_release('n');
SELECT * FROM jobs;

-- release is transactional
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('tx', '{"n": "tx"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('node-1');
BEGIN;
SELECT pgq_release('node-1');
ROLLBACK;
SELECT * FROM jobs;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
