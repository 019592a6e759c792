--
-- The operator API of 1.1: pgq_retry, pgq_retry_failed, pgq_cancel and
-- pgq_purge, on jobs in every state, and their answers for a job that is
-- missing or in another state.  (The archive rows they write: archive.sql;
-- races: specs/*cancel*, specs/retry_race.)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.archive;
DELETE FROM pgqueue.queues;

-- raw rows, and what pgqueue.jobs says
CREATE TEMP VIEW raw AS
SELECT q.queue, q.payload->>'n' AS n, q.state, q.tries, q.last_error,
       w.id IS NOT NULL AS in_work_queue, w.lock_key, w.tries AS w_tries
  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
 ORDER BY q.queue, q.id;
CREATE TEMP VIEW states AS
SELECT j.queue, j.payload->>'n' AS n, j.state, j.tries, j.last_error, j.lock_key
  FROM pgqueue.jobs j ORDER BY j.queue, j.id;
-- every work_queue row has its job, which is 'scheduled', and the reverse
CREATE FUNCTION pg_temp.mismatches() RETURNS bigint LANGUAGE sql AS $$
  SELECT (SELECT count(*) FROM pgqueue.work_queue w
           WHERE NOT EXISTS (SELECT 1 FROM pgqueue.queue q
                              WHERE q.id = w.id AND q.state = 'scheduled'))
       + (SELECT count(*) FROM pgqueue.queue q
           WHERE q.state = 'scheduled'
             AND NOT EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id))
$$;

-- One job of queue q in each state: failed (out of tries), retry, running
-- (held by w1), expired (held by w2 under a lease that ran out), scheduled
-- (not claimed) and pending.  Each is claimed alone, so that it is the one
-- the claim takes.  Returns their ids.
CREATE FUNCTION pg_temp.every_state(q text)
RETURNS TABLE (failed uuid, retry uuid, running uuid, expired uuid, scheduled uuid, pending uuid)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgq_configure(q, max_tries => 1);
    failed := pgq_push(q, '{"n": "failed"}');
    PERFORM pgq_schedule();
    PERFORM pgq_nack(c.id, 'w1', 'out of tries') FROM pgq_claim('w1', 1, '1 hour', ARRAY[q]) c;
    PERFORM pgq_configure(q, max_tries => 3);
    retry := pgq_push(q, '{"n": "retry"}');
    PERFORM pgq_schedule();
    PERFORM pgq_nack(c.id, 'w1', 'later', '1 hour') FROM pgq_claim('w1', 1, '1 hour', ARRAY[q]) c;
    running := pgq_push(q, '{"n": "running"}');
    PERFORM pgq_schedule();
    PERFORM pgq_claim('w1', 1, '1 hour', ARRAY[q]);
    expired := pgq_push(q, '{"n": "expired"}');
    PERFORM pgq_schedule();
    PERFORM pgq_claim('w2', 1, '1 millisecond', ARRAY[q]);
    scheduled := pgq_push(q, '{"n": "scheduled"}');
    PERFORM pgq_schedule();
    pending := pgq_push(q, '{"n": "pending"}');
    PERFORM pg_sleep(0.01);
    RETURN NEXT;
END
$$;

SELECT * FROM pg_temp.every_state('op') \gset
SELECT * FROM states;

--
-- pgq_retry: only a failed job, back to pending, due now, tries 0,
-- last_error kept
--
SELECT pgq_retry(:'pending') AS pending, pgq_retry(:'retry') AS retry,
       pgq_retry(:'scheduled') AS scheduled, pgq_retry(:'running') AS running,
       pgq_retry(:'expired') AS expired, pgq_retry(gen_random_uuid()) AS missing;
SELECT version AS version_failed FROM pgqueue.queue WHERE id = :'failed' \gset
SELECT pgq_retry(:'failed') AS failed;
SELECT state, tries, last_error, run_after BETWEEN now() - interval '1 minute' AND now() AS due_now,
       version > :version_failed AS new_version
  FROM pgqueue.queue WHERE id = :'failed';
SELECT pgq_retry(:'failed') AS again;
SELECT * FROM states;
SELECT pg_temp.mismatches();

--
-- pgq_retry_failed: every failed job of one queue
--
SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('dead', jsonb_build_object('n', g));
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_schedule();
SELECT count(*) AS failed FROM pgq_claim('w3', 10, '1 hour', '{dead}') c, pgq_nack(c.id, 'w3', 'no luck') n
 WHERE n = 'failed';
-- 'op' has no failed job left (its one was retried above)
SELECT pgq_retry_failed('op') AS op, pgq_retry_failed('nosuchqueue') AS nosuchqueue;
SELECT * FROM states;
SELECT pgq_retry_failed('dead') AS dead;
SELECT pgq_retry_failed('dead') AS again;
SELECT * FROM states;
-- they run again, each with its full tries
SELECT pgq_schedule();
SELECT payload->>'n' AS n, tries FROM pgq_claim('w3', 10, '1 hour', '{dead}') ORDER BY 1;
SELECT count(*) AS failed FROM pgqueue.work_queue w, pgq_nack(w.id, 'w3', 'no luck again') n
 WHERE w.queue = 'dead' AND n = 'failed';
SELECT pgq_retry_failed('dead') AS dead;
SELECT * FROM raw;
SELECT pg_temp.mismatches();

--
-- A failed job whose dedup_key a live job holds stays failed, as a push of
-- that key would add nothing; of failed jobs sharing a key, only the
-- newest goes back
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('dk', max_tries => 1);
SELECT pgq_push('dk', '{"n": "old"}', dedup_key => 'k') AS old \gset
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w4', 1, '1 hour');
SELECT pgq_nack(:'old', 'w4', 'failed once');
SELECT pgq_push('dk', '{"n": "new"}', dedup_key => 'k') AS new \gset
SELECT pgq_retry(:'old') AS while_new_is_live;
SELECT pgq_retry_failed('dk') AS retried;
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w4', 1, '1 hour');
SELECT pgq_nack(:'new', 'w4', 'failed too');
-- now two failed jobs hold 'k': retry_failed takes the newest only
SELECT pgq_retry_failed('dk') AS retried;
SELECT n, state, last_error FROM states WHERE queue = 'dk';
SELECT pgq_retry(:'old') AS old_while_new_is_live;
-- a push of 'k' finds the retried job
SELECT pgq_push('dk', '{"n": "third"}', dedup_key => 'k') = :'new' AS same_job;

--
-- pgq_cancel: a job in any state; the holder of a running one is fenced off
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT * FROM pg_temp.every_state('op') \gset
SELECT * FROM states;

SELECT pgq_cancel(:'pending') AS pending;
SELECT pgq_cancel(:'retry') AS retry;
SELECT pgq_cancel(:'failed') AS failed;
SELECT pgq_cancel(:'scheduled') AS scheduled;
SELECT * FROM states;
-- a running job: gone, and its holder gets false/NULL
SELECT pgq_cancel(:'running') AS running;
SELECT pgq_ack(:'running', 'w1') AS ack, pgq_extend(:'running', 'w1') AS extend,
       pgq_nack(:'running', 'w1', 'x') AS nack;
-- a job whose lease ran out, not yet taken by another claim
SELECT pgq_cancel(:'expired') AS expired;
SELECT pgq_ack(:'expired', 'w2') AS ack;
-- nothing left; a second cancel and an unknown id are false
SELECT count(*) AS jobs FROM pgqueue.queue;
SELECT count(*) AS work_queue_rows FROM pgqueue.work_queue;
SELECT pgq_cancel(:'running') AS again, pgq_cancel(gen_random_uuid()) AS missing;
-- a claim finds nothing
SELECT count(*) AS claimed FROM pgq_claim('w3', 10);

-- cancelling a job of a queue at its max_in_flight frees its place
SELECT pgq_configure('cap', max_in_flight => 1);
SELECT pgq_push('cap', '{"n": "c1"}') AS c1 \gset
SELECT pgq_push('cap', '{"n": "c2"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT pgq_schedule();
SELECT n, state FROM states WHERE queue = 'cap';
SELECT pgq_cancel(:'c1') AS c1;
SELECT pgq_schedule();
SELECT n, state FROM states WHERE queue = 'cap';

-- a cancel in a transaction that rolls back changes nothing
BEGIN;
SELECT pgq_cancel(id) AS cancelled FROM pgqueue.queue WHERE queue = 'cap';
ROLLBACK;
SELECT n, state FROM states WHERE queue = 'cap';
SELECT pg_temp.mismatches();

--
-- pgq_purge: every job of a queue in one state (failed by default)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_configure('pu', max_tries => 1);
SELECT count(*) AS pushed FROM generate_series(1, 4) g, pgq_push('pu', jsonb_build_object('n', 'f' || g));
SELECT pgq_schedule();
SELECT count(*) AS failed FROM pgq_claim('w1', 10, '1 hour') c, pgq_nack(c.id, 'w1', 'no') n
 WHERE n = 'failed';
SELECT pgq_configure('pu', max_tries => 5);
SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('pu', jsonb_build_object('n', 'r' || g));
SELECT pgq_schedule();
SELECT count(*) AS retry FROM pgq_claim('w1', 10, '1 hour') c, pgq_nack(c.id, 'w1', 'later', '1 hour') n
 WHERE n = 'retry';
SELECT count(*) AS pushed FROM generate_series(1, 2) g, pgq_push('pu', jsonb_build_object('n', 's' || g));
SELECT pgq_schedule();
SELECT count(*) AS running FROM pgq_claim('w1', 1, '1 hour');
SELECT count(*) AS pushed FROM generate_series(1, 2) g, pgq_push('pu', jsonb_build_object('n', 'p' || g));
-- a job of another queue, untouched by purges of 'pu'
SELECT pgq_push('other', '{"n": "o1"}') IS NOT NULL AS pushed;
SELECT state, count(*) FROM pgqueue.jobs WHERE queue = 'pu' GROUP BY state ORDER BY state;

SELECT pgq_purge('pu') AS failed;
SELECT pgq_purge('pu', 'failed') AS again;
SELECT pgq_purge('pu', 'retry') AS retry;
SELECT pgq_purge('pu', 'pending') AS pending;
SELECT pgq_purge('nosuchqueue', 'pending') AS nosuchqueue;
SELECT state, count(*) FROM pgqueue.jobs WHERE queue = 'pu' GROUP BY state ORDER BY state;
-- jobs in work_queue are not purged: cancel them
SELECT pgq_purge('pu', 'scheduled');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_purge('pu', 'running');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS cancelled FROM pgqueue.queue q, pgq_cancel(q.id) c WHERE q.queue = 'pu' AND c;
SELECT * FROM raw;
SELECT pg_temp.mismatches();

TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.archive;
DELETE FROM pgqueue.queues;
