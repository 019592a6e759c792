--
-- 1.2: groups.  pgq_push(..., group_key) and pgq_push_batch(...,
-- group_key) put a job in a group of its queue; pgq_configure(...,
-- group_max_in_flight): at most that many jobs of one group are scheduled,
-- running or in retry at once (0: no limit).  The scheduling pass serves a
-- grouped queue's groups in turn (src/schedule.c).
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
TRUNCATE pgqueue.rate_windows;

-- the jobs in flight (scheduled, running or in retry) of queue g, by group
CREATE TEMP VIEW in_flight AS
SELECT queue, group_key, string_agg(payload->>'n', ',' ORDER BY (payload->>'n')::int) AS jobs,
       count(*) AS n
  FROM pgqueue.jobs
 WHERE state IN ('scheduled', 'running', 'retry')
 GROUP BY queue, group_key
 ORDER BY queue, group_key NULLS FIRST;
-- claim everything released to w1 and ack it, in claim order
CREATE FUNCTION pg_temp.ack_all(q text) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(c.payload->>'n', ',' ORDER BY c.o)
    FROM (SELECT payload, pgq_ack(id, 'w1') AS acked, row_number() OVER () AS o
            FROM pgq_claim('w1', 1000, queues => ARRAY[q])) c
$$;

-- the setting, its default, NULL keeps it
SELECT pgq_configure('g', group_max_in_flight => 1);
SELECT queue, group_max_in_flight FROM pgqueue.queues ORDER BY queue;
SELECT pgq_configure('g', weight => 2);
SELECT pgq_configure('other');
SELECT queue, weight, group_max_in_flight FROM pgqueue.queues ORDER BY queue;

-- bad input (22023, 22004): nothing is pushed or changed
SELECT pgq_configure('g', group_max_in_flight => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('g', '{}', group_key => '');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('g', '{}', group_key => repeat('x', 257));
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('g', '{}', dedup_key => 'd', group_key => '');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('g', ARRAY['{}'::jsonb], group_key => '');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('g', ARRAY['{}'::jsonb], group_key => repeat('é', 129));
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('g', '{}', after => ARRAY[NULL]::uuid[], group_key => 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('g', ARRAY['{}'::jsonb], after => ARRAY[NULL]::uuid[], group_key => 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('g', '{}', priority => NULL, group_key => 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS jobs FROM pgqueue.queue;
SELECT queue, group_max_in_flight FROM pgqueue.queues WHERE queue = 'g';

-- 256 bytes is the most; the key is in the jobs view, last
SELECT pgq_push('other', '{}', group_key => repeat('x', 256)) AS id1 \gset
SELECT length(group_key) FROM pgqueue.jobs WHERE id = :'id1';
SELECT count(*) FROM pgq_push_batch('other', ARRAY['{}'::jsonb, '{}'], group_key => 'b');
SELECT left(group_key, 3) AS group_key, length(group_key), count(*)
  FROM pgqueue.jobs GROUP BY group_key ORDER BY group_key;
SELECT pgq_push('other', '{}', dedup_key => 'd1', group_key => 'c') AS id2 \gset
SELECT group_key, dedup_key FROM pgqueue.queue WHERE id = :'id2';
-- the same dedup_key in another group: the live job wins, its group kept
SELECT pgq_push('other', '{}', dedup_key => 'd1', group_key => 'z') = :'id2' AS same_job;
SELECT group_key FROM pgqueue.queue WHERE id = :'id2';
SELECT attname FROM pg_attribute
 WHERE attrelid = 'pgqueue.jobs'::regclass AND attnum > 0 ORDER BY attnum DESC LIMIT 1;
TRUNCATE pgqueue.queue;

--
-- Limit 1: a group's jobs one at a time, in order (priority, then push
-- order); the groups in turn.
--
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 3) n;
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'b')) FROM generate_series(11, 13) n;
SELECT pgq_push('g', '{"n": 4}', priority => 5, group_key => 'a') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT * FROM in_flight;
-- a second pass releases nothing: both groups are full
SELECT pgq_schedule();
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT * FROM in_flight;
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT * FROM in_flight;
SELECT count(*) AS left FROM pgqueue.queue WHERE queue = 'g';

--
-- A job waiting to retry holds its group until it is acked; then the
-- next goes.
--
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 3) n;
SELECT pgq_schedule();
SELECT pgq_nack(id, 'w1', 'boom', retry_in => '3 seconds') FROM pgq_claim('w1', 10, queues => '{g}');
SELECT * FROM in_flight;
SELECT pgq_schedule();
SELECT * FROM in_flight;
-- due again: the job in retry goes first, still alone (a pass that found
-- every group full waits for a place to be freed, or for the first job
-- not yet due: this one's retry)
SELECT pg_sleep(3);
SELECT pgq_schedule();
SELECT state, payload->>'n' AS n, tries FROM pgqueue.jobs WHERE state <> 'pending' ORDER BY n;
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT * FROM in_flight;

-- a job in retry that is cancelled frees its group
SELECT pgq_nack(id, 'w1', 'boom', retry_in => '1 hour') FROM pgq_claim('w1', 10, queues => '{g}');
SELECT pgq_schedule();
SELECT * FROM in_flight;
SELECT pgq_cancel(id) FROM pgqueue.queue WHERE state = 'retry';
SELECT pgq_schedule();
SELECT * FROM in_flight;

-- a job that fails on its last try frees its group
SELECT pgq_configure('g', max_tries => 1);
SELECT pgq_nack(id, 'w1', 'dead') FROM pgq_claim('w1', 10, queues => '{g}');
SELECT * FROM in_flight;
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(5, 6) n;
SELECT pgq_schedule();
SELECT * FROM in_flight;
-- a scheduled job that is cancelled frees its group too
SELECT pgq_cancel(id) FROM pgqueue.jobs WHERE state IN ('scheduled', 'running');
SELECT pgq_schedule();
SELECT * FROM in_flight;
SELECT pgq_configure('g', max_tries => 5);
TRUNCATE pgqueue.queue, pgqueue.work_queue;

--
-- Limit 2; no limit (0); jobs without a group are one group among the
-- others and have no limit.
--
SELECT pgq_configure('g', group_max_in_flight => 2);
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 5) n;
SELECT count(pgq_push('g', jsonb_build_object('n', n))) FROM generate_series(21, 24) n;
SELECT pgq_schedule();
SELECT * FROM in_flight;
SELECT pgq_schedule();
SELECT * FROM in_flight;
-- the groups take turns in a pass: a pass of 3 takes a job of a, one
-- without a group, then a's second (the round goes on from a, served last)
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 5) n;
SELECT count(pgq_push('g', jsonb_build_object('n', n))) FROM generate_series(21, 24) n;
SELECT pgq_schedule(3);
SELECT * FROM in_flight;
SELECT pgq_configure('g', group_max_in_flight => 0);
SELECT pgq_schedule();
SELECT * FROM in_flight;
TRUNCATE pgqueue.queue, pgqueue.work_queue;

--
-- Fairness: a group's backlog of 1000 does not delay another group's
-- first job beyond the first pass, whatever the pass's size.
--
-- 1000 jobs of group big, then one of group small
CREATE FUNCTION pg_temp.backlog() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM pgq_push_batch('g', (SELECT array_agg(jsonb_build_object('n', n))
                                              FROM generate_series(1, 1000) n),
                                      group_key => 'big');
  SELECT count(pgq_push('g', '{"n": 5000}', group_key => 'small'));
$$;
SELECT pgq_configure('g', group_max_in_flight => 1000);
SELECT pg_temp.backlog();
SELECT pgq_schedule(10);
SELECT group_key, count(*) FROM pgqueue.jobs WHERE state IN ('scheduled', 'running')
 GROUP BY group_key ORDER BY group_key;
-- and the order of the work_queue: the groups interleave
SELECT pgq_push('g', '{"n": 5001}', group_key => 'small') IS NOT NULL AS pushed;
SELECT pgq_push('g', '{"n": 6000}', group_key => 'tiny') IS NOT NULL AS pushed;
SELECT pgq_schedule(4);
SELECT q.group_key, q.payload->>'n' AS n
  FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
 ORDER BY w.created, w.batch_order OFFSET 10;

-- the same with limit 1
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('g', group_max_in_flight => 1);
SELECT pg_temp.backlog();
SELECT pgq_schedule(1000);
SELECT * FROM in_flight;

-- a queue without the setting ignores the groups: push order
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(pgq_push('plain', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 3) n;
SELECT pgq_schedule();
SELECT * FROM in_flight;

-- a rolled-back pass released nothing; the next releases the same
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 3) n;
BEGIN;
SELECT pgq_schedule();
ROLLBACK;
SELECT pgq_schedule();
SELECT * FROM in_flight;

-- a pass that found every group full waits for a place to be freed: a
-- commit that frees one, or its own transaction's (an ack before it)
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(pgq_push('g', jsonb_build_object('n', n), group_key => 'a')) FROM generate_series(1, 3) n;
SELECT pgq_schedule();
SELECT pgq_schedule();
BEGIN;
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
COMMIT;
SELECT pgq_schedule();
SELECT pg_temp.ack_all('g') AS acked;
SELECT pgq_schedule();
SELECT * FROM in_flight;

-- many groups with keys of every length, over many pages of the index:
-- a pass's walk steps from page to page and from group to group; each
-- pass releases one job of every group, then the next
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(pgq_push('g', jsonb_build_object('n', n),
                      group_key => repeat(chr(65 + g % 26), 1 + (g * 37) % 240) || g))
  FROM generate_series(1, 300) g, generate_series(1, 3) n;
SELECT pgq_schedule(1000) AS released;
SELECT count(*) AS groups, max(n) AS most FROM in_flight;
SELECT pg_temp.ack_all('g') IS NOT NULL AS acked;
SELECT pgq_schedule(1000) AS released;
SELECT count(*) AS groups, max(n) AS most, min(jobs) AS n FROM in_flight;
SELECT pg_temp.ack_all('g') IS NOT NULL AS acked;
SELECT pgq_schedule(1000) AS released;
SELECT count(*) AS groups, max(n) AS most, min(jobs) AS n FROM in_flight;
SELECT pg_temp.ack_all('g') IS NOT NULL AS acked;
SELECT pgq_schedule(1000) AS released;

-- the index of groups holds every version of a row with a group and no
-- other (rows without a group skip it, whatever pushes or passes write
-- them with), and no other index is taken for it, not even one whose name
-- ends the same and comes first: amcheck's heapallindexed, after pushes
-- and passes of both
TRUNCATE pgqueue.queue, pgqueue.work_queue;
CREATE INDEX queue_0_by_group_idx ON pgqueue.queue_0 (queue, id);
REINDEX INDEX CONCURRENTLY pgqueue.queue_0_group_idx;
SELECT count(pgq_push('g', jsonb_build_object('n', n),
                      group_key => CASE WHEN n % 3 > 0 THEN 'k' || n % 5 END))
  FROM generate_series(1, 60) n;
SELECT pgq_schedule(7) AS released;
SELECT pgq_schedule(1000) AS released;
SELECT pg_temp.ack_all('g') IS NOT NULL AS acked;
SELECT pgq_schedule(1000) AS released;
CREATE EXTENSION amcheck;
SELECT count(*) > 0 AS checked
  FROM pg_class c, LATERAL bt_index_check(c.oid, true)
 WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind = 'i'
   AND (c.relname LIKE '%\_group\_idx' OR c.relname LIKE 'queue\_0\_%');
DROP EXTENSION amcheck;
DROP INDEX pgqueue.queue_0_by_group_idx;
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
