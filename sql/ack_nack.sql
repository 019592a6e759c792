--
-- pgq_ack, pgq_ack_batch and pgq_nack: finishing a job, giving it back,
-- retry with backoff, failing when out of tries.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

CREATE TEMP VIEW jobs AS
SELECT q.payload->>'n' AS n, q.state, coalesce(w.tries, q.tries) AS tries,
       coalesce(w.version, q.version) AS version, q.last_error,
       w.id IS NOT NULL AS in_work_queue, w.lock_key
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.id;

--
-- ack: the job leaves both tables
--
SELECT pgq_push('a', '{"n": 1}') AS id1 \gset
SELECT pgq_push('a', '{"n": 2}') AS id2 \gset
SELECT pgq_schedule();
-- not claimed: no one holds it, so no one can ack it
SELECT pgq_ack(:'id1', 'w1');
SELECT count(*) AS claimed FROM pgq_claim('w1', 2);
-- wrong key, other case, unknown id: false, nothing changes
SELECT pgq_ack(:'id1', 'w2');
SELECT pgq_ack(:'id1', 'W1');
SELECT pgq_ack('00000000-0000-7000-8000-000000000000', 'w1');
SELECT * FROM jobs;
-- the holder: true, and the job is gone
SELECT pgq_ack(:'id1', 'w1');
SELECT * FROM jobs;
SELECT count(*) AS left_in_queue FROM pgqueue.queue WHERE id = :'id1';
SELECT count(*) AS left_in_work_queue FROM pgqueue.work_queue WHERE id = :'id1';
-- twice: false the second time
SELECT pgq_ack(:'id1', 'w1');

-- ack inside the worker's own transaction commits or rolls back with it
BEGIN;
SELECT pgq_ack(:'id2', 'w1');
SELECT count(*) AS inside FROM pgqueue.queue WHERE id = :'id2';
ROLLBACK;
SELECT * FROM jobs;
BEGIN;
SELECT pgq_ack(:'id2', 'w1');
COMMIT;
SELECT count(*) AS jobs FROM pgqueue.queue;

-- after the lease ran out, the holder can still ack while no one took it
SELECT pgq_push('a', '{"n": 3}') AS id3 \gset
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT pgq_ack(:'id3', 'w1');
SELECT count(*) AS jobs FROM pgqueue.queue;

--
-- ack_batch: acks the listed jobs lock_key holds, returns how many
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 6) g, pgq_push('b', jsonb_build_object('n', g));
SELECT pgq_schedule();
CREATE TEMP TABLE mine AS SELECT id, payload FROM pgq_claim('w1', 4);
CREATE TEMP TABLE theirs AS SELECT id, payload FROM pgq_claim('w2', 1);
-- three of mine, one of theirs, one unclaimed, one unknown, one twice
SELECT pgq_ack_batch(
         (SELECT array_agg(id ORDER BY payload) FROM (SELECT id, payload FROM mine ORDER BY payload LIMIT 3) m)
         || (SELECT array_agg(id) FROM theirs)
         || (SELECT array_agg(q.id) FROM pgqueue.queue q JOIN pgqueue.work_queue w USING (id) WHERE w.lock_key IS NULL)
         || '00000000-0000-7000-8000-000000000000'::uuid
         || (SELECT min(id::text)::uuid FROM mine),
         'w1') AS acked;
SELECT * FROM jobs;
-- nothing held, or an empty list: 0
SELECT pgq_ack_batch((SELECT array_agg(id) FROM theirs), 'w1') AS acked;
SELECT pgq_ack_batch('{}', 'w1') AS acked;
SELECT pgq_ack_batch(ARRAY[NULL]::uuid[], 'w1') AS acked;
-- the rest
SELECT pgq_ack_batch((SELECT array_agg(id) FROM mine), 'w1') AS acked;
SELECT pgq_ack_batch((SELECT array_agg(id) FROM theirs), 'w2') AS acked;
SELECT * FROM jobs;
-- rolled back with its transaction
SELECT count(*) AS claimed FROM pgq_claim('w3', 10);
BEGIN;
SELECT pgq_ack_batch((SELECT array_agg(id) FROM pgqueue.queue), 'w3') AS acked;
ROLLBACK;
SELECT * FROM jobs;
DROP TABLE mine, theirs;

--
-- nack: back to 'retry' with run_after = now + retry_in, or 'failed'
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('n', '{"n": 1}') AS id1 \gset
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1');
-- not the holder: NULL, nothing changes
SELECT pgq_nack(:'id1', 'w2', 'not mine') IS NULL AS not_held;
SELECT pgq_nack('00000000-0000-7000-8000-000000000000', 'w1') IS NULL AS no_such_job;
SELECT * FROM jobs;
-- the holder: retry in an hour; the error is kept, the try is not undone
SELECT clock_timestamp() AS t0 \gset
SELECT pgq_nack(:'id1', 'w1', 'connection refused', '1 hour');
SELECT clock_timestamp() AS t1 \gset
SELECT * FROM jobs;
SELECT run_after >= :'t0'::timestamptz + interval '1 hour' AS from_t0,
       run_after <= :'t1'::timestamptz + interval '1 hour' AS to_t1
  FROM pgqueue.queue WHERE id = :'id1';
-- a nacked job is no longer held by anyone
SELECT pgq_nack(:'id1', 'w1', 'again') IS NULL AS not_held;
SELECT pgq_ack(:'id1', 'w1') AS acked;
SELECT pgq_extend(:'id1', 'w1') IS NULL AS not_held;
-- not due: not scheduled
SELECT pgq_schedule();
SELECT * FROM jobs;

-- retry_in 0: due at once, scheduled by the next pass, next try
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('n', '{"n": 1}') AS id1 \gset
SELECT pgq_schedule();
SELECT tries, version FROM pgq_claim('w1');
SELECT pgq_nack(:'id1', 'w1', 'first', '0');
SELECT * FROM jobs;
SELECT pgq_schedule();
SELECT * FROM jobs;
SELECT tries, version FROM pgq_claim('w2');
-- error NULL: last_error is cleared (it describes the latest try)
SELECT pgq_nack(:'id1', 'w2', NULL, '0');
SELECT * FROM jobs;

-- nack rolled back with its transaction
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
BEGIN;
SELECT pgq_nack(:'id1', 'w1', 'rolled back', '0');
ROLLBACK;
SELECT * FROM jobs;

-- after the lease ran out, the holder can still nack while no one took it
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('n', '{"n": 1}') AS id1 \gset
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT pgq_nack(:'id1', 'w1', 'late but mine', '0');
SELECT * FROM jobs;

--
-- default backoff (retry_in NULL): 1 s * 2^(tries-1), at most 1 hour, times
-- a random factor in [0.5, 1]
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('bo', max_tries => 100);
SELECT pgq_push('bo', '{"n": "backoff"}') AS bo \gset
-- tries 1: between 0.5 and 1 second
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
SELECT clock_timestamp() AS t0 \gset
SELECT pgq_nack(:'bo', 'w1', 'e1');
SELECT clock_timestamp() AS t1 \gset
SELECT run_after >= :'t0'::timestamptz + interval '0.5 seconds' AS at_least,
       run_after <= :'t1'::timestamptz + interval '1 second' AS at_most
  FROM pgqueue.queue WHERE id = :'bo';
-- tries 4: between 4 and 8 seconds (bring the job back at once twice first)
CREATE FUNCTION pg_temp.again(id uuid, n int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    i int;
    t int;
BEGIN
    FOR i IN 1 .. n LOOP
        UPDATE pgqueue.queue SET run_after = clock_timestamp() WHERE queue.id = again.id;
        PERFORM pgq_schedule();
        SELECT c.tries INTO t FROM pgq_claim('w1') c;
        IF i < n THEN
            PERFORM pgq_nack(again.id, 'w1', 'again', '0');
        END IF;
    END LOOP;
    RETURN t;
END
$$;
SELECT pg_temp.again(:'bo', 3) AS tries;
SELECT clock_timestamp() AS t0 \gset
SELECT pgq_nack(:'bo', 'w1', 'e4');
SELECT clock_timestamp() AS t1 \gset
SELECT run_after >= :'t0'::timestamptz + interval '4 seconds' AS at_least,
       run_after <= :'t1'::timestamptz + interval '8 seconds' AS at_most
  FROM pgqueue.queue WHERE id = :'bo';
-- tries 13: 2^12 s is over an hour, so capped: between 30 and 60 minutes
SELECT pg_temp.again(:'bo', 9) AS tries;
SELECT clock_timestamp() AS t0 \gset
SELECT pgq_nack(:'bo', 'w1', 'e13');
SELECT clock_timestamp() AS t1 \gset
SELECT run_after >= :'t0'::timestamptz + interval '30 minutes' AS at_least,
       run_after <= :'t1'::timestamptz + interval '60 minutes' AS at_most
  FROM pgqueue.queue WHERE id = :'bo';
-- tries 60: still capped (no overflow)
SELECT pg_temp.again(:'bo', 47) AS tries;
SELECT clock_timestamp() AS t0 \gset
SELECT pgq_nack(:'bo', 'w1', 'e60');
SELECT clock_timestamp() AS t1 \gset
SELECT run_after >= :'t0'::timestamptz + interval '30 minutes' AS at_least,
       run_after <= :'t1'::timestamptz + interval '60 minutes' AS at_most
  FROM pgqueue.queue WHERE id = :'bo';
SELECT * FROM jobs;
-- the factor is random: 20 nacks on try 1 (in one statement) spread over
-- [0.5, 1] s instead of all waiting the same
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 20) g, pgq_push('bo', jsonb_build_object('n', g));
SELECT pgq_schedule();
SELECT count(*) AS nacked FROM pgq_claim('w1', 20) c, pgq_nack(c.id, 'w1');
SELECT max(run_after) - min(run_after) > interval '0.1 seconds' AS spread,
       max(run_after) - min(run_after) < interval '0.6 seconds' AS within_range
  FROM pgqueue.queue;

--
-- nack when the tries are used up: 'failed', kept for inspection
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
-- the default max_tries is 5
SELECT pgq_push('f', '{"n": "default"}') AS f \gset
CREATE TEMP TABLE outcomes (try int, state text);
DO $$
DECLARE
    i int;
    t int;
    s text;
    f uuid := (SELECT id FROM pgqueue.queue);
BEGIN
    FOR i IN 1 .. 5 LOOP
        PERFORM pgq_schedule();
        SELECT c.tries INTO t FROM pgq_claim('w1') c;
        s := pgq_nack(f, 'w1', 'error ' || i, '0');
        INSERT INTO outcomes VALUES (t, s);
    END LOOP;
END
$$;
SELECT * FROM outcomes ORDER BY try;
SELECT * FROM jobs;
SELECT run_after < now() AS run_after_kept FROM pgqueue.queue;
-- a failed job is never scheduled or claimed again
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1');
SELECT pgq_nack(:'f', 'w1') IS NULL AS not_held;

-- max_tries from the queue's settings, read at nack time
SELECT pgq_configure('f2', max_tries => 2);
SELECT pgq_push('f2', '{"n": "two tries"}') AS f2 \gset
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
SELECT pgq_nack(:'f2', 'w1', 'first', '0');
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
-- raised before the nack: one more try
SELECT pgq_configure('f2', max_tries => 3);
SELECT pgq_nack(:'f2', 'w1', 'second', '0');
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
-- lowered before the nack: failed at once
SELECT pgq_configure('f2', max_tries => 1);
SELECT pgq_nack(:'f2', 'w1', 'third', '1 hour');
SELECT * FROM jobs;
-- max_tries 1: the first nack fails the job
SELECT pgq_configure('once', max_tries => 1);
SELECT pgq_push('once', '{"n": "once"}') AS once \gset
SELECT pgq_schedule();
SELECT tries FROM pgq_claim('w1');
SELECT pgq_nack(:'once', 'w1', 'only chance');
SELECT * FROM jobs;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
