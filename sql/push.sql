--
-- pgq_push and pgq_push_batch: new jobs are 'pending', dedup_key,
-- transactions, ids.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- one job with every default
SELECT pgq_push('mail') IS NOT NULL AS pushed;
SELECT queue, state, tries, version, priority, payload, dedup_key, last_error,
       run_after = created AS due_at_push, created <= now() AS created_before_now
  FROM pgqueue.queue;
-- pushing schedules nothing: work_queue stays empty
SELECT count(*) AS in_work_queue FROM pgqueue.work_queue;

-- every kind of JSON is a payload, stored as given; JSON null is not SQL NULL
SELECT pgq_push('kinds', p) IS NOT NULL AS pushed
  FROM (VALUES ('{"to": "a@example.com", "n": [1, 2.5, true, null]}'::jsonb),
               ('[1, "two", {"three": 3}]'), ('42'), ('"just text"'),
               ('null'), ('{}'), ('{"ключ": "значение ✓ é"}')) v(p);
SELECT payload, jsonb_typeof(payload) AS type FROM pgqueue.queue
 WHERE queue = 'kinds' ORDER BY id;

-- run_after and priority are stored; run_after NULL means now
SELECT pgq_push('opts', '{"n": "later"}', now() + interval '1 hour', 7) IS NOT NULL AS pushed;
SELECT pgq_push('opts', '{"n": "earlier"}', now() - interval '1 hour', -3) IS NOT NULL AS pushed;
SELECT pgq_push('opts', '{"n": "null run_after"}', NULL) IS NOT NULL AS pushed;
SELECT payload->>'n' AS n, priority, state,
       run_after > now() + interval '59 minutes' AS in_an_hour,
       run_after < now() - interval '59 minutes' AS an_hour_ago,
       run_after = created AS at_push
  FROM pgqueue.queue WHERE queue = 'opts' ORDER BY id;
-- named arguments
SELECT pgq_push(queue => 'opts', priority => 2, payload => '{"n": "named"}') IS NOT NULL AS pushed;
SELECT payload, priority FROM pgqueue.queue WHERE payload = '{"n": "named"}';

-- ids are UUIDv7 (version 7, variant 10) and grow in push order
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE substr(id::text, 15, 1) = '7') AS version_7,
       count(*) FILTER (WHERE substr(id::text, 20, 1) IN ('8', '9', 'a', 'b')) AS variant_10
  FROM pgqueue.queue;
CREATE TEMP TABLE pushed_ids (n int, id uuid);
INSERT INTO pushed_ids SELECT g, pgq_push('order', jsonb_build_object('n', g))
  FROM generate_series(1, 50) g;
SELECT bool_and(id > prev) AS ids_increase
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev FROM pushed_ids) s
 WHERE prev IS NOT NULL;
SELECT count(*) AS matching FROM pushed_ids p JOIN pgqueue.queue q USING (id)
 WHERE q.payload->>'n' = p.n::text;

-- transactional: a rolled-back push leaves nothing
SELECT count(*) AS jobs_before FROM pgqueue.queue;
BEGIN;
SELECT pgq_push('rolled-back') IS NOT NULL AS pushed;
SELECT count(*) AS inside FROM pgqueue.queue WHERE queue = 'rolled-back';
ROLLBACK;
SELECT count(*) AS jobs_after FROM pgqueue.queue;
BEGIN;
SELECT pgq_push('committed') IS NOT NULL AS pushed;
COMMIT;
SELECT count(*) AS committed FROM pgqueue.queue WHERE queue = 'committed';
-- a push in a savepoint that is rolled back leaves nothing either
BEGIN;
SAVEPOINT s;
SELECT pgq_push('committed', '{"savepoint": true}') IS NOT NULL AS pushed;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS committed FROM pgqueue.queue WHERE queue = 'committed';

--
-- dedup_key: one live job per (queue, dedup_key)
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_push('dd', '{"v": 1}', dedup_key => 'k1') AS id1 \gset
-- pending: the same id back, nothing added, the first payload kept
SELECT pgq_push('dd', '{"v": 2}', dedup_key => 'k1') = :'id1' AS same_id;
SELECT count(*) AS jobs, min(payload::text) AS payload FROM pgqueue.queue;
-- the key is per queue, and jobs without a key never collide
SELECT pgq_push('other', '{"v": 3}', dedup_key => 'k1') <> :'id1' AS new_id;
SELECT pgq_push('dd', '{"v": 4}') <> :'id1' AS new_id;
SELECT pgq_push('dd', '{"v": 5}', dedup_key => 'k2') <> :'id1' AS new_id;
SELECT queue, dedup_key, payload FROM pgqueue.queue ORDER BY id;
-- twice in one transaction: one job
BEGIN;
SELECT pgq_push('dd', '{"v": 6}', dedup_key => 'k3') AS id3 \gset
SELECT pgq_push('dd', '{"v": 7}', dedup_key => 'k3') = :'id3' AS same_id;
COMMIT;
SELECT count(*) AS k3_jobs FROM pgqueue.queue WHERE dedup_key = 'k3';

-- scheduled, then claimed: still the same job
SELECT pgq_schedule();
SELECT state FROM pgqueue.queue WHERE id = :'id1';
SELECT pgq_push('dd', '{"v": 8}', dedup_key => 'k1') = :'id1' AS same_id;
SELECT count(*) AS claimed FROM pgq_claim('w1', 10, queues => '{dd}');
SELECT pgq_push('dd', '{"v": 9}', dedup_key => 'k1') = :'id1' AS same_id;
-- nacked into retry: still the same job
SELECT pgq_nack(:'id1', 'w1', 'try again', '1 hour');
SELECT pgq_push('dd', '{"v": 10}', dedup_key => 'k1') = :'id1' AS same_id;
SELECT count(*) AS k1_jobs FROM pgqueue.queue WHERE queue = 'dd' AND dedup_key = 'k1';

-- a failed job does not block a new one with its key
SELECT pgq_configure('dd', max_tries => 1);
SELECT pgq_nack(id, 'w1', 'fatal') FROM pgqueue.queue WHERE dedup_key = 'k2';
SELECT pgq_push('dd', '{"v": 11}', dedup_key => 'k2') AS new_k2 \gset
SELECT state, payload FROM pgqueue.queue WHERE dedup_key = 'k2' ORDER BY id;
-- and the new one blocks a third
SELECT pgq_push('dd', '{"v": 12}', dedup_key => 'k2') = :'new_k2' AS same_id;

-- an acked job frees its key
SELECT pgq_ack(id, 'w1') FROM pgqueue.queue WHERE dedup_key = 'k3';
SELECT count(*) AS k3_jobs FROM pgqueue.queue WHERE dedup_key = 'k3';
SELECT pgq_push('dd', '{"v": 13}', dedup_key => 'k3') <> :'id3' AS new_id;
SELECT state, payload FROM pgqueue.queue WHERE dedup_key = 'k3';

-- every job of the dedup tests
SELECT queue, dedup_key, state, payload FROM pgqueue.queue ORDER BY id;

--
-- pgq_push_batch: one pending job per payload, ids in payload order
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
CREATE TEMP TABLE batch AS
SELECT b.id, b.n
  FROM pgq_push_batch('batch', ARRAY['{"n": 1}', '{"n": 2}', '[3]', '"four"', '{"n": 5}']::jsonb[])
       WITH ORDINALITY AS b (id, n);
SELECT b.n, q.payload, q.state, q.priority, q.run_after = q.created AS due_now
  FROM batch b JOIN pgqueue.queue q USING (id) ORDER BY b.n;
SELECT bool_and(id > prev) AS ids_increase
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev FROM batch) s
 WHERE prev IS NOT NULL;
-- run_after and priority apply to every job of the batch
SELECT count(*) AS pushed
  FROM pgq_push_batch('batch2', ARRAY['{}', '{}', '{}']::jsonb[],
                      '2100-01-01 00:00:00+00', 9);
SELECT count(*) AS jobs, min(priority) AS min_prio, max(priority) AS max_prio,
       bool_and(run_after = '2100-01-01 00:00:00+00') AS delayed
  FROM pgqueue.queue WHERE queue = 'batch2';
-- an empty batch pushes nothing
SELECT count(*) AS pushed FROM pgq_push_batch('batch3', '{}'::jsonb[]);
SELECT count(*) AS jobs FROM pgqueue.queue WHERE queue = 'batch3';
-- the largest batch allowed
SELECT count(*) AS pushed
  FROM pgq_push_batch('big', (SELECT array_agg(jsonb_build_object('i', g))
                                FROM generate_series(1, 10000) g));
SELECT count(*) AS jobs, count(DISTINCT payload) AS distinct_payloads
  FROM pgqueue.queue WHERE queue = 'big';
-- payloads large enough to be compressed and stored out of line come
-- back whole, each with its own id
SELECT count(*) AS pushed, count(DISTINCT b) AS ids
  FROM pgq_push_batch('toast', (SELECT array_agg(jsonb_build_object('i', g,
                                  'r', repeat('pgqueue ', 1000),
                                  's', (SELECT string_agg(md5(g::text || ':' || x), '')
                                          FROM generate_series(1, 300) x)))
                                  FROM generate_series(1, 50) g)) AS b;
SELECT count(*) AS jobs,
       bool_and(payload->>'s' = (SELECT string_agg(md5((payload->>'i') || ':' || x), '')
                                   FROM generate_series(1, 300) x)
                AND payload->>'r' = repeat('pgqueue ', 1000)) AS whole,
       bool_and(pg_column_size(payload) < octet_length(payload::text)) AS compressed
  FROM pgqueue.queue WHERE queue = 'toast';
SELECT count(*) > 0 AS stored_out_of_line
  FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid
 WHERE c.oid IN (SELECT relid FROM pg_partition_tree('pgqueue.queue')) AND pg_relation_size(t.oid) > 0;
-- a rolled-back batch leaves nothing
BEGIN;
SELECT count(*) AS pushed FROM pgq_push_batch('gone', ARRAY['{}', '{}']::jsonb[]);
ROLLBACK;
SELECT count(*) AS jobs FROM pgqueue.queue WHERE queue = 'gone';

SELECT queue, state, count(*) FROM pgqueue.queue GROUP BY 1, 2 ORDER BY 1, 2;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
