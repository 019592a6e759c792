--
-- pgq_claim: what it hands out, in what order, what it sets, the queues
-- filter, max_items and wait.  (Expired leases: lease.sql.)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- nothing to claim
SELECT * FROM pgq_claim('w1');

-- claim never schedules: a pending job is not handed out
SELECT pgq_push('a', '{"n": 1}') IS NOT NULL AS pushed;
SELECT count(*) AS claimed FROM pgq_claim('w1');
SELECT state FROM pgqueue.queue;

-- scheduled -> claimed: tries 1, version bumped, lease of 30 s by default
SELECT pgq_push('a', '{"n": 2}') IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": 3}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT queue, payload, tries, version,
       lock_timeout > now() + interval '29 seconds' AS lease_30s_from,
       lock_timeout <= clock_timestamp() + interval '30 seconds' AS lease_30s_to
  FROM pgq_claim('w1');
-- the job stays 'scheduled' and in work_queue, now under w1's lease; its
-- attempt count and version live in its work_queue row while it is there
SELECT q.payload, q.state, w.tries, w.version,
       w.lock_key, w.started IS NOT NULL AS started,
       w.lock_timeout > clock_timestamp() AS leased
  FROM pgqueue.queue q JOIN pgqueue.work_queue w USING (id) ORDER BY w.batch_order;

-- the claim returns what the tables hold
CREATE TEMP TABLE got AS SELECT * FROM pgq_claim('w2', lease => '1 hour');
SELECT g.queue = q.queue AS same_queue, g.payload = q.payload AS same_payload,
       g.tries = w.tries AS same_tries, g.version = w.version AS same_version,
       g.lock_timeout = w.lock_timeout AS same_lock_timeout,
       w.lock_key, g.lock_timeout > now() + interval '59 minutes' AS lease_1h
  FROM got g JOIN pgqueue.queue q USING (id) JOIN pgqueue.work_queue w USING (id);
DROP TABLE got;

-- a job under a live lease is not handed out again, to anyone
SELECT payload FROM pgq_claim('w3', 10);
SELECT count(*) AS claimed FROM pgq_claim('w3', 10);
SELECT count(*) AS claimed FROM pgq_claim('w1', 10);
SELECT w.lock_key, q.payload, w.tries FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id)
 ORDER BY w.batch_order;

--
-- order: scheduling order (created, batch_order), whatever the priority of
-- later passes
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('a', '{"n": "low, first pass"}', priority => -5) IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT pgq_push('a', '{"n": "high, second pass"}', priority => 100) IS NOT NULL AS pushed;
SELECT pgq_push('b', '{"n": "b, second pass"}', priority => 50) IS NOT NULL AS pushed;
SELECT pgq_push('a', '{"n": "higher, second pass"}', priority => 101) IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload->>'n' AS n, tries FROM pgq_claim('w1', 1);
SELECT payload->>'n' AS n, tries FROM pgq_claim('w1', 10);

--
-- max_items
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed FROM generate_series(1, 7) g, pgq_push('m', jsonb_build_object('n', g));
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1', 3);
SELECT payload FROM pgq_claim('w2', max_items => 2);
SELECT payload FROM pgq_claim('w3', 100);
SELECT count(*) AS claimed FROM pgq_claim('w4', 10000);
SELECT lock_key, count(*) FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;

-- the largest claim: 10,000 jobs, each row the job it names, in scheduling
-- order (priorities make that order differ from the order of the ids)
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed
  FROM generate_series(0, 6) p,
       pgq_push_batch('big', ARRAY(SELECT jsonb_build_object('p', p, 'n', g)
                                    FROM generate_series(1, 1430) g), priority => p);
SELECT pgq_schedule(10000);
CREATE TEMP TABLE got AS
  SELECT row_number() OVER () AS k, * FROM pgq_claim('w5', 10000, '1 hour');
SELECT count(*) AS claimed, count(DISTINCT id) AS distinct_ids,
       count(*) FILTER (WHERE g.payload = q.payload AND g.tries = 1 AND w.tries = 1
                          AND g.version = w.version
                          AND g.lock_timeout = w.lock_timeout AND w.lock_key = 'w5') AS matching,
       bool_and(w.batch_order = g.k) AS in_scheduling_order,
       bool_and((g.payload->>'p')::int = q.priority) AS payload_is_the_jobs
  FROM got g JOIN pgqueue.queue q USING (id) JOIN pgqueue.work_queue w USING (id);
-- the highest priority came first, and its jobs by push order
SELECT k, payload FROM got WHERE k IN (1, 2, 1430, 1431, 10000) ORDER BY k;
DROP TABLE got;

--
-- the queues filter
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT count(*) AS pushed
  FROM unnest('{a,b,c}'::text[]) q, generate_series(1, 3) g,
       pgq_push(q, jsonb_build_object('q', q, 'n', g));
SELECT pgq_schedule();
SELECT queue, payload FROM pgq_claim('w1', 2, queues => '{b}');
SELECT queue, payload FROM pgq_claim('w1', 10, queues => ARRAY['c', 'a']) ORDER BY queue, payload;
-- no such queue, or nothing left there: nothing
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{nosuch}');
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{a,c}');
-- a name given twice counts once
SELECT queue, payload FROM pgq_claim('w1', 10, queues => '{b,b,b}');
SELECT count(*) AS claimed FROM pgq_claim('w1', 10);
SELECT queue, count(*) FILTER (WHERE lock_key = 'w1') AS held_by_w1
  FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;
-- the filter is an exact match: no patterns, no case folding
SELECT pgq_push('Mixed.Case%', '{}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{mixed.case%}');
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{Mixed.Case_}');
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{Mixed%}');
SELECT queue FROM pgq_claim('w1', 10, queues => '{Mixed.Case%}');

--
-- a claim is transactional: rolled back, the job is claimable again and
-- tries/version are as before
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('t', '{"n": 1}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
BEGIN;
SELECT payload, tries, version FROM pgq_claim('w1');
ROLLBACK;
SELECT w.lock_key, w.tries, w.version FROM pgqueue.work_queue w;
SELECT payload, tries, version FROM pgq_claim('w2');

--
-- wait
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
-- nothing claimable: returns empty after about the wait
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgq_claim('w1', wait => '0.2 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '0.2 seconds' AS waited_enough,
       clock_timestamp() - :'t0'::timestamptz < interval '10 seconds' AS not_forever;
-- with a queues filter too
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgq_claim('w1', 5, '1 minute', '{x,y}', '0.2 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '0.2 seconds' AS waited_enough;
-- something claimable: returns at once, not after the wait
SELECT pgq_push('x', '{"n": "ready"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT clock_timestamp() AS t0 \gset
SELECT payload FROM pgq_claim('w1', wait => '30 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '10 seconds' AS returned_early;
-- a lease that runs out while waiting: the wait ends with the stolen job
-- (the 'ready' job is held by w1 for 30 s: not claimable meanwhile)
SELECT pgq_push('x', '{"n": "short lease"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1', lease => '300 milliseconds');
SELECT clock_timestamp() AS t0 \gset
SELECT payload, tries FROM pgq_claim('w2', wait => '30 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '10 seconds' AS returned_early;
-- a job in another queue does not end a filtered wait
SELECT pgq_push('y', '{"n": "other queue"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgq_claim('w1', queues => '{x}', wait => '0.2 seconds');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '0.2 seconds' AS waited_enough;
-- wait 0 is the default: no waiting
SELECT clock_timestamp() AS t0 \gset
SELECT count(*) AS claimed FROM pgq_claim('w1', queues => '{x}', wait => '0');
SELECT clock_timestamp() - :'t0'::timestamptz < interval '10 seconds' AS returned_early;

--
-- claims start their index scans at a lower bound kept in shared memory;
-- a row made claimable behind the API's back (a manual UPDATE, which moves
-- no bound) is still found within a second, when a full scan checks it
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('m', '{"n": "manual"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1');
SELECT count(*) AS claimed FROM pgq_claim('w2');
UPDATE pgqueue.work_queue SET lock_key = NULL, lock_timeout = NULL, started = NULL;
SELECT pg_sleep(1.1);
SELECT payload, tries FROM pgq_claim('w2');

--
-- a job row removed behind the API's back: the claim that meets its work
-- row deletes it (with a warning) and takes the next job
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('orph', '{"n": 1}') IS NOT NULL AND pgq_push('orph', '{"n": 2}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
DELETE FROM pgqueue.queue WHERE payload = '{"n": 1}';
\set VERBOSITY sqlstate
SELECT id IS NOT NULL AS got, payload FROM pgq_claim('w1', 2, '1 min', ARRAY['orph']);
\set VERBOSITY default
SELECT count(*) AS work_rows FROM pgqueue.work_queue WHERE queue = 'orph';

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
