--
-- 1.2: flows.  pgq_push(..., after) and pgq_push_batch(..., after): a job
-- waits ('waiting') until the last unfinished job named in after is acked,
-- and becomes pending in the transaction of that ack (src/flow.c).  Failed
-- and retrying parents hold their children; a cancel or purge cancels the
-- waiting descendants, recursively.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.job_parents;
DELETE FROM pgqueue.queues;
SELECT pgq_configure('kids', retention => '1 day');

-- names for the jobs of this file
CREATE TEMP TABLE n (name text PRIMARY KEY, id uuid);
CREATE TEMP VIEW j AS
SELECT n.name, j.queue, j.state, j.waiting_for
  FROM pgqueue.jobs j JOIN n USING (id)
 ORDER BY n.name;
CREATE TEMP VIEW edges AS
SELECT p.name AS parent, c.name AS child
  FROM pgqueue.job_parents e
  JOIN n p ON p.id = e.parent
  JOIN n c ON c.id = e.child
 ORDER BY 1, 2;
-- schedule, claim the first job of the named job's queue, and ack it:
-- true when that was the named job
CREATE FUNCTION pg_temp.ack(job text) RETURNS boolean LANGUAGE sql AS $$
  SELECT pgq_schedule() >= 0;
  SELECT c.id = x.id AND pgq_ack(c.id, 't')
    FROM (SELECT id FROM n WHERE name = job) x,
         pgq_claim('t', 1, queues => ARRAY[(SELECT queue FROM pgqueue.queue q WHERE q.id = x.id)]) c;
$$;
-- the same, without the ack: the named job's id when it was claimed
CREATE FUNCTION pg_temp.take(job text) RETURNS uuid LANGUAGE sql AS $$
  SELECT pgq_schedule() >= 0;
  SELECT c.id
    FROM (SELECT id FROM n WHERE name = job) x,
         pgq_claim('t', 1, queues => ARRAY[(SELECT queue FROM pgqueue.queue q WHERE q.id = x.id)]) c
   WHERE c.id = x.id;
$$;

-- every job of the file cancelled (with their descendants), the names forgotten
CREATE FUNCTION pg_temp.clean() RETURNS void LANGUAGE sql AS $$
  SELECT pgq_cancel(id) FROM pgqueue.queue;
  TRUNCATE n;
$$;

-- a fan-out and a fan-in: p, three children in another queue, one job after them
INSERT INTO n VALUES ('p', pgq_push('parents', '{"n": "p"}'));
INSERT INTO n SELECT 'c' || row_number() OVER (), id
  FROM pgq_push_batch('kids', ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[],
                      after => ARRAY[(SELECT id FROM n WHERE name = 'p')]) id;
INSERT INTO n VALUES ('fanin', pgq_push('kids', '{"n": "fanin"}',
                      after => ARRAY(SELECT id FROM n WHERE name LIKE 'c%')));
SELECT * FROM j;
SELECT * FROM edges;
SELECT queue, pending, waiting FROM pgq_stats() ORDER BY queue;
-- a pass schedules p alone
SELECT pgq_schedule() AS scheduled;
SELECT * FROM j;
-- the ack of p, rolled back: its children still wait
BEGIN;
SELECT pg_temp.ack('p') AS acked;
SELECT * FROM j;
ROLLBACK;
SELECT * FROM j;
SELECT * FROM edges;
-- the ack of p: its children are pending in the ack's own transaction
BEGIN;
SELECT pg_temp.ack('p') AS acked;
SELECT * FROM j;
COMMIT;
SELECT * FROM edges;
-- the fan-in counts down with each child acked
SELECT pg_temp.ack('c1') AS acked;
SELECT * FROM j WHERE name = 'fanin';
-- two children acked in one pgq_ack_batch: counted twice, pending once
SELECT pgq_schedule() >= 0 AS scheduled;
SELECT pgq_ack_batch(ARRAY(SELECT id FROM pgq_claim('t', 10, queues => ARRAY['kids'])
                            WHERE id IN (SELECT id FROM n WHERE name IN ('c2', 'c3'))), 't') AS acked;
SELECT * FROM j;
SELECT * FROM edges;
SELECT pg_temp.ack('fanin') AS acked;

-- after: NULL, empty, unknown ids, acked jobs and repeats
SELECT pg_temp.clean();
INSERT INTO n VALUES ('null', pgq_push('q', '{}', after => NULL));
INSERT INTO n VALUES ('empty', pgq_push('q', '{}', after => '{}'));
INSERT INTO n VALUES ('unknown', pgq_push('q', '{}', after => ARRAY['00000000-0000-0000-0000-000000000001'::uuid]));
SELECT * FROM j;
SELECT pgq_purge('q', 'pending') AS purged;
INSERT INTO n VALUES ('done', pgq_push('q', '{}'));
SELECT pg_temp.ack('done') AS acked;
INSERT INTO n VALUES ('after_done', pgq_push('q', '{}', after => ARRAY[(SELECT id FROM n WHERE name = 'done')]));
INSERT INTO n VALUES ('twice_p', pgq_push('tp', '{}'));
INSERT INTO n VALUES ('twice', pgq_push('q', '{}', after => ARRAY[(SELECT id FROM n WHERE name = 'twice_p'),
                                                            (SELECT id FROM n WHERE name = 'twice_p')]));
SELECT * FROM j;
SELECT pg_temp.ack('twice_p') AS acked;
SELECT * FROM j WHERE name = 'twice';
SELECT pgq_purge('q', 'pending') AS purged;

-- a parent that retries, fails and is retried holds its child; priority and run_after stay the child's
SELECT pg_temp.clean();
SELECT pgq_configure('q', max_tries => 2);
INSERT INTO n VALUES ('p', pgq_push('q', '{"n": "p"}'));
INSERT INTO n VALUES ('child', pgq_push('kids', '{"n": "child"}', priority => 7,
                      run_after => '2000-01-01', after => ARRAY[(SELECT id FROM n WHERE name = 'p')]));
SELECT pgq_nack(pg_temp.take('p'), 't', 'boom', '0') AS nacked;
SELECT * FROM j;
SELECT pgq_nack(pg_temp.take('p'), 't', 'boom', '0') AS nacked;
SELECT * FROM j;
SELECT pgq_retry((SELECT id FROM n WHERE name = 'p')) AS retried;
SELECT pg_temp.ack('p') AS acked;
SELECT name, state, priority, run_after FROM pgqueue.jobs JOIN n USING (id);
SELECT pg_temp.ack('child') AS acked;

-- a chain and a diamond: the cancel of the root cancels every waiting descendant, once
SELECT pg_temp.clean();
INSERT INTO n VALUES ('root', pgq_push('q', '{}'));
INSERT INTO n VALUES ('a', pgq_push('kids', '{"n": "a"}', after => ARRAY[(SELECT id FROM n WHERE name = 'root')]));
INSERT INTO n VALUES ('b', pgq_push('kids', '{"n": "b"}', after => ARRAY[(SELECT id FROM n WHERE name = 'root')]));
INSERT INTO n VALUES ('d', pgq_push('kids', '{"n": "d"}', after => ARRAY(SELECT id FROM n WHERE name IN ('a', 'b'))));
INSERT INTO n VALUES ('e', pgq_push('kids', '{"n": "e"}', after => ARRAY[(SELECT id FROM n WHERE name = 'd')]));
INSERT INTO n VALUES ('other', pgq_push('q', '{}'));
INSERT INTO n VALUES ('f', pgq_push('kids', '{"n": "f"}', after => ARRAY(SELECT id FROM n WHERE name IN ('other', 'd'))));
SELECT * FROM j;
SELECT count(*) AS edges FROM edges;
SELECT pgq_schedule() >= 0 AS scheduled;
SELECT pgq_cancel((SELECT id FROM n WHERE name = 'root')) AS cancelled;
SELECT * FROM j;
SELECT * FROM edges;
SELECT payload->>'n' AS job, outcome,
       last_error = 'parent job ' || (SELECT id FROM n WHERE name = 'root') || ' was cancelled' AS names_root,
       last_error ~ '^parent job [-0-9a-f]{36} was cancelled$' AS names_a_parent
  FROM pgqueue.archive WHERE queue = 'kids' AND outcome = 'cancelled' ORDER BY 1;
SELECT pgq_cancel((SELECT id FROM n WHERE name = 'other')) AS cancelled;

-- the cancel of a waiting job: its own edges go, its other parents go on
SELECT pg_temp.clean();
INSERT INTO n VALUES ('p1', pgq_push('q', '{}'));
INSERT INTO n VALUES ('p2', pgq_push('q', '{}'));
INSERT INTO n VALUES ('w', pgq_push('q', '{}', after => ARRAY(SELECT id FROM n WHERE name IN ('p1', 'p2'))));
SELECT pgq_cancel((SELECT id FROM n WHERE name = 'w')) AS cancelled;
SELECT * FROM j;
SELECT * FROM edges;
SELECT pg_temp.ack('p1') AS acked, pg_temp.ack('p2') AS acked;

-- pgq_purge: failed parents (their children cancelled), and waiting jobs
SELECT pg_temp.clean();
SELECT pgq_configure('q', max_tries => 1);
INSERT INTO n VALUES ('p', pgq_push('q', '{}'));
INSERT INTO n VALUES ('child', pgq_push('kids', '{"n": "purged child"}', after => ARRAY[(SELECT id FROM n WHERE name = 'p')]));
INSERT INTO n VALUES ('grandchild', pgq_push('kids', '{"n": "purged grandchild"}', after => ARRAY[(SELECT id FROM n WHERE name = 'child')]));
SELECT pgq_nack(pg_temp.take('p'), 't', 'boom', '0') AS nacked;
SELECT * FROM j;
SELECT pgq_purge('q', 'failed') AS purged;
SELECT * FROM j;
SELECT payload->>'n' AS job, outcome, last_error LIKE 'parent job % was purged' AS names_purged,
       last_error LIKE 'parent job % was cancelled' AS names_cancelled
  FROM pgqueue.archive WHERE payload->>'n' LIKE 'purged%' ORDER BY 1;
INSERT INTO n VALUES ('p2', pgq_push('q', '{}'));
INSERT INTO n VALUES ('w1', pgq_push('kids', '{"n": "waiting 1"}', after => ARRAY[(SELECT id FROM n WHERE name = 'p2')]));
INSERT INTO n VALUES ('w2', pgq_push('kids', '{"n": "waiting 2"}', after => ARRAY[(SELECT id FROM n WHERE name = 'w1')]));
SELECT pgq_purge('kids', 'waiting') AS purged;
SELECT * FROM j;
SELECT * FROM edges;
SELECT payload->>'n' AS job, outcome FROM pgqueue.archive WHERE payload->>'n' LIKE 'waiting%' ORDER BY 1;
SELECT pgq_cancel((SELECT id FROM n WHERE name = 'p2')) AS cancelled;

-- a dedup push: a new job waits; the live job of its key is returned unchanged
SELECT pg_temp.clean();
INSERT INTO n VALUES ('p', pgq_push('q', '{}'));
INSERT INTO n VALUES ('dedup', pgq_push('q', '{}', dedup_key => 'k', after => ARRAY[(SELECT id FROM n WHERE name = 'p')]));
SELECT pgq_push('q', '{}', dedup_key => 'k', after => ARRAY[(SELECT id FROM n WHERE name = 'p')])
       = (SELECT id FROM n WHERE name = 'dedup') AS same_job;
SELECT * FROM j;
SELECT * FROM edges;
SELECT pg_temp.ack('p') AS acked;
SELECT * FROM j;
SELECT pg_temp.ack('dedup') AS acked;

-- a parent and its child pushed in one transaction (the ordinary use)
SELECT pg_temp.clean();
BEGIN;
INSERT INTO n VALUES ('p', pgq_push('q', '{}'));
INSERT INTO n VALUES ('child', pgq_push('q', '{}', after => ARRAY[(SELECT id FROM n WHERE name = 'p')]));
SELECT * FROM j;
COMMIT;
SELECT pg_temp.ack('p') AS acked;
SELECT * FROM j;
SELECT pg_temp.ack('child') AS acked;
SELECT count(*) AS left_over FROM pgqueue.job_parents;

-- bad input
SELECT pgq_push('q', '{}', after => ARRAY[NULL]::uuid[]);
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('q', '{}', after => ARRAY[['00000000-0000-0000-0000-000000000001'::uuid]]);
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('q', '{}', after => ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 1001)));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('q', ARRAY['{}']::jsonb[], after => ARRAY[NULL]::uuid[]);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('q', ARRAY['{}']::jsonb[],
                                    after => ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 1001)));
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_purge('q', 'running');
\echo :LAST_ERROR_SQLSTATE
-- 1,000 parents are allowed
SELECT pgq_push('q', '{}', after => ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 1000))) IS NOT NULL AS pushed;
SELECT state, count(*) FROM pgqueue.jobs GROUP BY state ORDER BY state;
-- no edge was left behind
SELECT pg_temp.clean();
SELECT count(*) AS edges FROM pgqueue.job_parents;

-- flows and groups: a waiting job is not in flight for its group; a child
-- made pending by its parent's ack takes its turn in its group
SELECT pgq_configure('grouped', group_max_in_flight => 1);
INSERT INTO n VALUES ('gp', pgq_push('q', '{}'));
INSERT INTO n VALUES ('gw', pgq_push('grouped', '{"n": "waits"}', group_key => 'g1',
                                     after => ARRAY[(SELECT id FROM n WHERE name = 'gp')]));
INSERT INTO n VALUES ('gb', pgq_push('grouped', '{"n": "pending"}', group_key => 'g1'));
SELECT pgq_schedule() >= 0 AS scheduled;
SELECT name, state, group_key FROM pgqueue.jobs JOIN n USING (id) WHERE name LIKE 'g%' ORDER BY name;
SELECT pg_temp.ack('gp') AS acked;
SELECT pgq_schedule() >= 0 AS scheduled;
-- gw is pending, held back while gb of its group is in flight
SELECT name, state FROM pgqueue.jobs JOIN n USING (id) WHERE name LIKE 'g%' ORDER BY name;
SELECT pg_temp.ack('gb') AS acked;
SELECT pgq_schedule() >= 0 AS scheduled;
SELECT name, state FROM pgqueue.jobs JOIN n USING (id) WHERE name LIKE 'g%' ORDER BY name;
SELECT pg_temp.ack('gw') AS acked;
SELECT pg_temp.clean();

-- in the transaction that creates the extension (which adds the label
-- 'waiting' to job_state by ALTER TYPE, whose new labels PostgreSQL 15
-- and 16 refuse to read before the commit), pgq_stats() and a dedup push
-- work
BEGIN;
DROP EXTENSION pgqueue CASCADE;
CREATE EXTENSION pgqueue;
SELECT queue, pending, waiting FROM pgq_stats();
SELECT pgq_push('fresh', '{}', dedup_key => 'k') = pgq_push('fresh', '{}', dedup_key => 'k') AS one_job;
SELECT queue, pending, waiting FROM pgq_stats();
ROLLBACK;
SELECT count(*) AS jobs FROM pgqueue.queue;
