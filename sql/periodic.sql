--
-- pgq_push_periodic(queue, name, period, payload, priority): the job of
-- the current period, at most one per period however often the period
-- fires, even after that job has finished.  (With pg_cron on a real
-- server: t/010_pg_cron.pl.)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.periodic;
DELETE FROM pgqueue.queues;

-- the start of the current period, as the dedup_key spells it (UTC)
CREATE FUNCTION pg_temp.period_key(name text, period interval) RETURNS text LANGUAGE sql AS $$
  SELECT name || '@' || to_char(date_bin(period, now(), '2000-01-01 00:00+00') AT TIME ZONE 'UTC',
                                'YYYY-MM-DD"T"HH24:MI:SS"Z"')
$$;

-- Each test runs in one transaction, so that now() (the firing time) cannot
-- cross a period boundary between its calls.
BEGIN;
SELECT pgq_push_periodic('reports', 'hourly', '1 hour', '{"kind": "hourly"}', priority => 3) AS first \gset
SELECT pgq_push_periodic('reports', 'hourly', '1 hour', '{"kind": "hourly"}', priority => 3) = :'first'
       AS fired_twice_same_job;
SELECT queue, payload, priority, state, dedup_key = pg_temp.period_key('hourly', '1 hour') AS key_is_period
  FROM pgqueue.queue;
SELECT queue, name, period_start = date_bin('1 hour', now(), '2000-01-01 00:00+00') AS this_period,
       job = :'first' AS its_job
  FROM pgqueue.periodic;
-- the job runs and is acked; the same period fires again: nothing new
SELECT pgq_schedule();
SELECT pgq_ack(id, 'w1') AS acked FROM pgq_claim('w1');
SELECT count(*) AS jobs FROM pgqueue.queue;
SELECT pgq_push_periodic('reports', 'hourly', '1 hour', '{"kind": "hourly"}') = :'first'
       AS after_ack_same_job;
SELECT count(*) AS jobs FROM pgqueue.queue;
-- other names and other queues are periodic jobs of their own
SELECT pgq_push_periodic('reports', 'daily', '1 day', '{"kind": "daily"}') <> :'first' AS other_name;
SELECT pgq_push_periodic('mail', 'hourly', '1 hour') <> :'first' AS other_queue;
SELECT queue, payload, dedup_key = pg_temp.period_key('daily', '1 day') AS daily_key
  FROM pgqueue.queue WHERE queue = 'reports';
COMMIT;

-- the next period pushes the next job (periods of one second)
SELECT pgq_push_periodic('ticks', 'tick', '1 second') AS t1 \gset
SELECT pg_sleep(1.1);
SELECT pgq_push_periodic('ticks', 'tick', '1 second') AS t2 \gset
SELECT :'t1' <> :'t2' AS new_job;
SELECT count(*) AS ticks, count(DISTINCT dedup_key) AS keys FROM pgqueue.queue WHERE queue = 'ticks';
SELECT job = :'t2' AS marks_last FROM pgqueue.periodic WHERE queue = 'ticks';

-- a period older than the last one pushed (a firing that comes late)
-- pushes nothing and returns NULL
UPDATE pgqueue.periodic SET period_start = now() + interval '1 day' WHERE queue = 'ticks';
SELECT pgq_push_periodic('ticks', 'tick', '1 second') IS NULL AS late;
SELECT count(*) AS ticks FROM pgqueue.queue WHERE queue = 'ticks';

-- a live job that already holds the period's key (pushed by hand) is the
-- period's job
BEGIN;
SELECT pgq_push('byhand', '{}', dedup_key => pg_temp.period_key('p', '1 day')) AS byhand \gset
SELECT pgq_push_periodic('byhand', 'p', '1 day') = :'byhand' AS same_job;
COMMIT;

-- a firing that rolls back leaves the period to the next firing
BEGIN;
SELECT pgq_push_periodic('rb', 'r', '1 day') IS NOT NULL AS pushed;
ROLLBACK;
SELECT count(*) AS marks FROM pgqueue.periodic WHERE queue = 'rb';
SELECT pgq_push_periodic('rb', 'r', '1 day') IS NOT NULL AS pushed;
SELECT count(*) AS jobs FROM pgqueue.queue WHERE queue = 'rb';

-- periods: whole lengths (no months), from one second to 365 days
SELECT pgq_push_periodic('x', 'm', '1 month');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push_periodic('x', 's', '0.5 seconds');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push_periodic('x', 'y', '366 days');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push_periodic('x', 'n', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push_periodic('x', repeat('n', 225), '1 day');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push_periodic('x', repeat('n', 224), '365 days') IS NOT NULL AS longest_name;
SELECT octet_length(dedup_key) AS key_bytes FROM pgqueue.queue WHERE queue = 'x';

TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.periodic;
