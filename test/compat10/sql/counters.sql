--
-- pgq_counters(): cumulative counters in shared memory, published when the
-- transaction commits.  Other tests ran before, so look at differences.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- one row; every counter is a non-negative number
SELECT count(*) AS rows,
       bool_and(pushed >= 0 AND scheduled >= 0 AND claimed >= 0 AND acked >= 0 AND
                nacked >= 0 AND failed >= 0 AND leases_stolen >= 0 AND scheduler_passes >= 0)
         AS non_negative,
       bool_and(stats_reset <= now()) AS reset_in_the_past
  FROM pgq_counters();
SELECT stats_reset AS reset0 FROM pgq_counters() \gset

-- the counters as they were at the last mark, and the change since
CREATE TEMP TABLE mark AS SELECT * FROM pgq_counters();
CREATE FUNCTION pg_temp.mark() RETURNS void LANGUAGE sql AS $$
    DELETE FROM mark;
    INSERT INTO mark SELECT * FROM pgq_counters();
$$;
CREATE TEMP VIEW delta AS
SELECT c.pushed - m.pushed AS pushed, c.scheduled - m.scheduled AS scheduled,
       c.claimed - m.claimed AS claimed, c.acked - m.acked AS acked,
       c.nacked - m.nacked AS nacked, c.failed - m.failed AS failed,
       c.leases_stolen - m.leases_stolen AS stolen,
       c.scheduler_passes - m.scheduler_passes AS passes
  FROM pgq_counters() c, mark m;

SELECT * FROM delta;

--
-- pushed
--
SELECT pg_temp.mark();
SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('c', jsonb_build_object('n', g));
SELECT count(*) AS pushed FROM pgq_push_batch('c', ARRAY['{"n": 4}', '{"n": 5}']::jsonb[]);
SELECT * FROM delta;
-- a push that finds its dedup_key taken adds nothing and counts nothing
SELECT pg_temp.mark();
SELECT pgq_push('c', '{"n": 6}', dedup_key => 'once') IS NOT NULL AS pushed;
SELECT pgq_push('c', '{"n": 7}', dedup_key => 'once') IS NOT NULL AS pushed;
SELECT * FROM delta;
-- counted when the transaction commits, not before
SELECT pg_temp.mark();
BEGIN;
SELECT pgq_push('c', '{"n": 8}') IS NOT NULL AS pushed;
SELECT pushed FROM delta;
COMMIT;
SELECT pushed FROM delta;
-- a rolled-back push does not count
SELECT pg_temp.mark();
BEGIN;
SELECT pgq_push('c', '{"n": "rolled back"}') IS NOT NULL AS pushed;
SELECT count(*) AS pushed FROM pgq_push_batch('c', ARRAY['{}', '{}']::jsonb[]);
ROLLBACK;
SELECT * FROM delta;
-- nor one in a savepoint rolled back, or in a PL/pgSQL block that failed,
-- while the rest of the transaction counts
BEGIN;
SAVEPOINT s1;
SELECT pgq_push('c', '{"n": "savepoint rolled back"}') IS NOT NULL AS pushed;
ROLLBACK TO SAVEPOINT s1;
SAVEPOINT s2;
SELECT pgq_push('c', '{"n": 9}') IS NOT NULL AS pushed;
RELEASE SAVEPOINT s2;
SAVEPOINT s3;
SAVEPOINT s4;
SELECT pgq_push('c', '{"n": "inner savepoint rolled back"}') IS NOT NULL AS pushed;
ROLLBACK TO SAVEPOINT s3;
COMMIT;
SELECT * FROM delta;
DO $$
BEGIN
    PERFORM pgq_push('c', '{"n": 10}');
    BEGIN
        PERFORM pgq_push('c', '{"n": "exception"}');
        RAISE EXCEPTION 'give up';
    EXCEPTION WHEN raise_exception THEN
        NULL;
    END;
END
$$;
SELECT * FROM delta;
SELECT payload->>'n' AS n FROM pgqueue.queue ORDER BY id;

--
-- scheduled, scheduler_passes
--
SELECT pg_temp.mark();
SELECT pgq_schedule(4);
SELECT pgq_schedule();
SELECT pgq_schedule();
SELECT * FROM delta;

--
-- claimed, acked
--
SELECT pg_temp.mark();
CREATE TEMP TABLE got AS SELECT id FROM pgq_claim('w1', 3);
SELECT * FROM delta;
SELECT pg_temp.mark();
SELECT pgq_ack(id, 'w1') FROM got WHERE id = (SELECT min(id::text)::uuid FROM got);
SELECT pgq_ack(id, 'w1') FROM got WHERE id = (SELECT min(id::text)::uuid FROM got);
SELECT pgq_ack_batch(ARRAY(SELECT id FROM got), 'w1');
SELECT * FROM delta;
-- rolled back: neither counts
SELECT pg_temp.mark();
BEGIN;
SELECT count(*) AS claimed FROM pgq_claim('w1', 2);
SELECT count(*) FILTER (WHERE pgq_ack(id, 'w1')) AS acked FROM pgqueue.work_queue;
ROLLBACK;
SELECT * FROM delta;
-- nothing to claim counts nothing
SELECT pg_temp.mark();
SELECT count(*) AS claimed FROM pgq_claim('w1', queues => '{nosuch}');
SELECT * FROM delta;

--
-- nacked, failed
--
SELECT pg_temp.mark();
SELECT pgq_configure('c', max_tries => 2);
SELECT pgq_nack(id, 'w2', 'e1', '0') FROM pgq_claim('w2', 1);
SELECT * FROM delta;
SELECT pg_temp.mark();
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w2', 10);
SELECT tries, pgq_nack(id, 'w2', 'e2', '0') FROM pgqueue.queue q
 WHERE tries = 2;
SELECT * FROM delta;
-- a nack that finds no claim counts nothing
SELECT pg_temp.mark();
SELECT pgq_nack(id, 'nobody') FROM pgqueue.queue WHERE state = 'failed';
SELECT * FROM delta;

--
-- leases_stolen, and failed by lease expiry on the last try
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 2) g, pgq_push('c', jsonb_build_object('n', g));
SELECT pgq_schedule();
SELECT pg_temp.mark();
SELECT count(*) AS claimed FROM pgq_claim('w1', 2, '1 millisecond');
SELECT pg_sleep(0.01);
SELECT tries FROM pgq_claim('w2', 2, '1 millisecond');
SELECT * FROM delta;
SELECT pg_temp.mark();
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w3', 2);
SELECT state, last_error FROM pgqueue.queue;
SELECT * FROM delta;

--
-- failed by release on the last try; a plain release counts nothing
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('c1', max_tries => 1);
SELECT pgq_push('c1', '{"n": "last try"}') IS NOT NULL AS pushed;
SELECT pgq_push('c', '{"n": "more tries"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('node', 2);
SELECT pg_temp.mark();
SELECT pgq_release('node');
SELECT * FROM delta;

--
-- bad input counts nothing
--
SELECT pg_temp.mark();
SELECT pgq_push('');
SELECT pgq_push_batch('c', ARRAY['{}', NULL]::jsonb[]);
SELECT pgq_schedule(0);
SELECT pgq_claim('w1', 0);
SELECT pgq_ack(NULL, 'w1');
SELECT pgq_nack(gen_random_uuid(), 'w1', 'e', '-1 second');
SELECT * FROM delta;

-- the counters were never reset
SELECT stats_reset = :'reset0'::timestamptz AS same_reset FROM pgq_counters();

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
