--
-- Leases: pgq_extend, expiry, stealing, the last try, real time.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

CREATE TEMP VIEW held AS
SELECT q.payload->>'n' AS n, q.state, coalesce(w.tries, q.tries) AS tries,
       coalesce(w.version, q.version) AS version,
       w.lock_key, w.lock_timeout > clock_timestamp() AS live
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.id;

--
-- pgq_extend
--
SELECT pgq_push('l', '{"n": 1}') AS id1 \gset
SELECT pgq_push('l', '{"n": 2}') AS id2 \gset
SELECT pgq_schedule();
-- not claimed yet: nobody holds it
SELECT pgq_extend(:'id1', 'w1') IS NULL AS not_held;
SELECT lock_timeout AS lt1 FROM pgq_claim('w1', lease => '10 seconds') \gset
-- the holder moves the deadline to now + lease
SELECT pgq_extend(:'id1', 'w1', '1 hour') AS ext \gset
SELECT :'ext'::timestamptz > :'lt1'::timestamptz AS later,
       :'ext'::timestamptz > now() + interval '59 minutes' AS in_an_hour,
       :'ext'::timestamptz = lock_timeout AS stored
  FROM pgqueue.work_queue WHERE id = :'id1';
-- and can shorten it (default lease 30 seconds)
SELECT pgq_extend(:'id1', 'w1') < :'ext'::timestamptz AS shorter;
SELECT lock_timeout < now() + interval '31 seconds' AS about_30s FROM pgqueue.work_queue WHERE id = :'id1';
-- anyone else gets NULL and changes nothing
SELECT lock_timeout AS before FROM pgqueue.work_queue WHERE id = :'id1' \gset
SELECT pgq_extend(:'id1', 'w2', '1 hour') IS NULL AS not_held;
SELECT pgq_extend(:'id1', 'W1', '1 hour') IS NULL AS case_matters;
SELECT pgq_extend(:'id1', 'w1 ', '1 hour') IS NULL AS spaces_matter;
SELECT pgq_extend(:'id2', 'w1', '1 hour') IS NULL AS other_job;
SELECT pgq_extend('00000000-0000-7000-8000-000000000000', 'w1') IS NULL AS no_such_job;
SELECT lock_timeout = :'before'::timestamptz AS unchanged FROM pgqueue.work_queue WHERE id = :'id1';
-- extend changes neither tries nor version
SELECT * FROM held;
-- once the job is acked, extend gets NULL
SELECT pgq_ack(:'id1', 'w1');
SELECT pgq_extend(:'id1', 'w1') IS NULL AS gone;

--
-- a lease that ran out but was not taken still belongs to its holder
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('l', '{"n": 1}') AS id1 \gset
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT * FROM held;
SELECT pgq_extend(:'id1', 'w1', '1 minute') > clock_timestamp() AS extended;
SELECT * FROM held;
-- now live again: not stealable
SELECT count(*) AS stolen FROM pgq_claim('w2');

--
-- stealing: an expired lease goes to the next claim; the old holder has
-- lost the job (extend NULL, ack false, nack NULL)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('l', '{"n": 1}') AS id1 \gset
SELECT pgq_schedule();
SELECT tries, version FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT payload, tries, version FROM pgq_claim('w2', lease => '1 hour');
SELECT * FROM held;
SELECT pgq_extend(:'id1', 'w1') IS NULL AS extend_lost;
SELECT pgq_ack(:'id1', 'w1') AS ack_lost;
SELECT pgq_nack(:'id1', 'w1', 'too late') IS NULL AS nack_lost;
SELECT * FROM held;
-- the new holder finishes it
SELECT pgq_ack(:'id1', 'w2');
SELECT count(*) AS jobs FROM pgqueue.queue;

-- the same worker may take back its own expired job: it is a new try
SELECT pgq_push('l', '{"n": 2}') AS id2 \gset
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries, version FROM pgq_claim('w1');
SELECT * FROM held;

--
-- expired leases come first, oldest deadline first, then never-claimed jobs
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 4) g, pgq_push('l', jsonb_build_object('n', g));
SELECT pgq_schedule();
-- job 1 runs out later than job 2; jobs 3 and 4 are never claimed
SELECT payload FROM pgq_claim('w1', lease => '600 milliseconds');
SELECT payload FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.65);
SELECT payload, tries FROM pgq_claim('w2', 1);
SELECT payload, tries FROM pgq_claim('w2', 1);
SELECT payload, tries FROM pgq_claim('w2', 1);
SELECT * FROM held;
-- with max_items, stolen and fresh jobs come together
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 4) g, pgq_push('l', jsonb_build_object('n', g));
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1', 2, '1 millisecond');
SELECT pg_sleep(0.01);
SELECT payload, tries FROM pgq_claim('w2', 3) ORDER BY payload;
SELECT * FROM held;

-- a queues filter applies to stealing too
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('x', '{"n": "x"}') IS NOT NULL AS pushed;
SELECT pgq_push('y', '{"n": "y"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', 2, '1 millisecond');
SELECT pg_sleep(0.01);
SELECT payload FROM pgq_claim('w2', 10, queues => '{y}');
SELECT * FROM held;

--
-- the last try: a job whose lease ran out while tries >= max_tries is
-- failed by the next claim that would take it, not handed out again
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_configure('last', max_tries => 2);
SELECT pgq_push('last', '{"n": "doomed"}') AS doomed \gset
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
-- try 2 of 2 is still handed out
SELECT tries FROM pgq_claim('w2', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT pgq_push('last', '{"n": "fresh"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
-- the next claim fails the doomed job and takes the fresh one
SELECT payload, tries FROM pgq_claim('w3', 1);
SELECT payload->>'n' AS n, state, tries, last_error FROM pgqueue.jobs ORDER BY id;
SELECT count(*) AS in_work_queue FROM pgqueue.work_queue WHERE id = :'doomed';
-- the failed job is lost to its last holder, and never scheduled again
SELECT pgq_ack(:'doomed', 'w2') AS ack;
SELECT pgq_extend(:'doomed', 'w2') IS NULL AS extend_null;
SELECT pgq_nack(:'doomed', 'w2') IS NULL AS nack_null;
SELECT pgq_schedule();
SELECT state FROM pgqueue.queue WHERE id = :'doomed';
-- with the default max_tries (5)
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_push('dflt', '{"n": "five tries"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries FROM pgq_claim('w9 last', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w1');
SELECT state, tries, last_error FROM pgqueue.queue;
SELECT count(*) AS in_work_queue FROM pgqueue.work_queue;
-- a filtered claim only fails jobs of its queues
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('x', max_tries => 1);
SELECT pgq_configure('y', max_tries => 1);
SELECT pgq_push('x') IS NOT NULL AS pushed;
SELECT pgq_push('y') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', 2, '1 millisecond');
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w2', 10, queues => '{x}');
SELECT queue, state, last_error FROM pgqueue.queue ORDER BY queue;

-- a job failed this way does not use up the claim: the next expired lease
-- still comes before a never-claimed job
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('z', max_tries => 2);
SELECT pgq_push('z', '{"n": "doomed"}') IS NOT NULL AS pushed;
SELECT pgq_push('z', '{"n": "expired"}') IS NOT NULL AS pushed;
SELECT pgq_push('z', '{"n": "never claimed"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload, tries FROM pgq_claim('w1', 1, '1 millisecond');
SELECT pg_sleep(0.01);
-- doomed runs out first (on its last try), then expired
SELECT payload, tries FROM pgq_claim('w1', 1, '300 milliseconds');
SELECT payload, tries FROM pgq_claim('w2', 1, '600 milliseconds');
SELECT pg_sleep(0.65);
SELECT payload, tries FROM pgq_claim('w3', 1);
SELECT * FROM held;

--
-- leases are measured in real time: a claim inside a long transaction sees
-- a lease run out although now() has not moved
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_push('rt', '{"n": 1}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', lease => '500 milliseconds');
BEGIN;
SELECT now() < lock_timeout AS live_at_now FROM pgqueue.work_queue;
SELECT pg_sleep(0.6);
SELECT now() < lock_timeout AS still_live_at_now FROM pgqueue.work_queue;
SELECT payload, tries FROM pgq_claim('w2');
-- extend inside the transaction also counts from the real time
SELECT pgq_extend(id, 'w2', '1 minute') > now() + interval '60.5 seconds' AS from_clock
  FROM pgqueue.work_queue;
COMMIT;
SELECT * FROM held;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
