--
-- Version 1.1's row layout: no foreign key between the tables, a job's
-- attempt count and version live in its work_queue row while it is there
-- (a claim writes only that row) and go back to the job row when it leaves,
-- pgqueue.jobs shows the merged truth, and no path of the API leaves a
-- work_queue row without its job or a 'scheduled' job without its row.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- no foreign key any more; work_queue has tries
SELECT count(*) AS foreign_keys FROM pg_constraint
 WHERE conrelid IN ('pgqueue.work_queue'::regclass, 'pgqueue.queue'::regclass)
   AND contype = 'f';
SELECT attname, format_type(atttypid, atttypmod) AS type, attnotnull
  FROM pg_attribute
 WHERE attrelid = 'pgqueue.work_queue'::regclass AND attname = 'tries';

-- the two tables agree: every work_queue row has its job, which is
-- 'scheduled', and every 'scheduled' job has its row
CREATE FUNCTION pg_temp.mismatches() RETURNS bigint LANGUAGE sql AS $$
  SELECT (SELECT count(*) FROM pgqueue.work_queue w
           WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queue q
                              WHERE q.id = w.id AND q.state = 'scheduled'))
       + (SELECT count(*) FROM pgqueue.queue q
           WHERE q.state = 'scheduled'
             AND NOT EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id))
$$;

-- raw rows of the job, and what pgqueue.jobs says
CREATE TEMP VIEW raw AS
SELECT q.payload->>'n' AS n, q.state, q.tries AS q_tries, q.version AS q_version,
       w.tries AS w_tries, w.version AS w_version, w.lock_key
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.id;

SELECT pgq_configure('l', max_tries => 4);
SELECT pgq_push('l', '{"n": 1}') AS id1 \gset
SELECT pgq_push('l', '{"n": 2}') AS id2 \gset
SELECT * FROM raw;
SELECT n, state, tries, max_tries FROM pgqueue.jobs j, LATERAL (SELECT j.payload->>'n' AS n) x ORDER BY id;

-- scheduling copies the job's tries and version into its work_queue row
SELECT pgq_schedule();
SELECT * FROM raw;
SELECT pg_temp.mismatches();

-- a claim writes only the work_queue row: the job row keeps tries 0
CREATE TEMP TABLE versions (n text, version int);
INSERT INTO versions SELECT payload->>'n', version FROM pgq_claim('w1', 2, '1 hour');
SELECT * FROM raw;
SELECT j.payload->>'n' AS n, j.state, j.tries, j.lock_key FROM pgqueue.jobs j ORDER BY j.id;

-- nack: tries and version go back to the job row
SELECT pgq_nack(:'id1', 'w1', 'boom', '0');
SELECT * FROM raw;
SELECT pg_temp.mismatches();

-- scheduled again: the count goes on from the job row
SELECT pgq_schedule();
INSERT INTO versions SELECT payload->>'n', version FROM pgq_claim('w2', 1, '1 millisecond');
SELECT * FROM raw;

-- release of a job not on its last try: claimable again, the job row
-- brought up to date
SELECT pg_sleep(0.01);
SELECT pgq_release('w2');
SELECT * FROM raw;

-- a steal: w3's lease of 1 ms runs out and w4 takes the job
INSERT INTO versions SELECT payload->>'n', version FROM pgq_claim('w3', 1, '1 millisecond');
SELECT pg_sleep(0.01);
INSERT INTO versions SELECT payload->>'n', version FROM pgq_claim('w4', 1, '1 hour');
SELECT * FROM raw;

-- the version returned grows with every claim of the job, across
-- reschedules
SELECT n, array_agg(version ORDER BY version) AS versions,
       count(DISTINCT version) = count(*) AS all_distinct
  FROM versions GROUP BY n ORDER BY n;

-- the last try runs out: failed by the next claim, tries written back
SELECT pgq_extend(:'id1', 'w4', '1 millisecond') IS NOT NULL AS extended;
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w5', 1);
SELECT * FROM raw;
SELECT pg_temp.mismatches();
SELECT j.payload->>'n' AS n, j.state, j.tries, j.max_tries, j.last_error FROM pgqueue.jobs j ORDER BY j.id;

-- ack removes both rows
SELECT pgq_ack(:'id2', 'w1') AS acked;
SELECT * FROM raw;
SELECT pg_temp.mismatches();

-- every state in pgqueue.jobs
SELECT pgq_push('s', '{"n": "pending"}', run_after => now() + interval '1 hour') IS NOT NULL AS pushed;
SELECT pgq_push('s', '{"n": "scheduled"}') IS NOT NULL AS pushed;
SELECT pgq_push('s', '{"n": "running"}', priority => 1) IS NOT NULL AS pushed;
SELECT pgq_push('s', '{"n": "retry"}', priority => 2) IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w6', 'later', '1 hour') FROM pgq_claim('w6', 1);
SELECT payload->>'n' AS n FROM pgq_claim('w7', 1, '1 hour');
SELECT j.payload->>'n' AS n, j.state, j.tries, j.lock_key, j.last_error
  FROM pgqueue.jobs j WHERE j.queue = 's' ORDER BY j.payload->>'n';
SELECT pg_temp.mismatches();

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
