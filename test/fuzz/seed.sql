-- Jobs in every state for the fuzzers (test/fuzz/run.sh): pending, delayed,
-- retry, scheduled, running (live lease), expired lease, failed; queue
-- settings (weights, caps, paused, max_tries, retention), archive rows of
-- every outcome, periodic marks, dedup keys.  Run as a superuser in a
-- database with pgqueue installed; the scheduler may be running.
\set ON_ERROR_STOP 1
SELECT pgq_configure('fz_a', weight => 3);
SELECT pgq_configure('fz_b', max_in_flight => 5, max_tries => 2);
SELECT pgq_configure('fz_paused', paused => true);
SELECT pgq_configure('fz_arch', retention => '1 day', max_tries => 1);
SELECT pgq_configure('fz_one', max_tries => 1);
SELECT pgq_configure(repeat('q', 128), weight => 10000, max_in_flight => 1);

-- pending, some delayed, priorities, dedup keys, odd payloads
SELECT count(*) FROM (
  SELECT pgq_push(q, jsonb_build_object('n', i, 'q', q), NULL, (i % 7) - 3,
                  CASE WHEN i % 5 = 0 THEN 'k' || i END)
    FROM unnest(ARRAY['fz_a', 'fz_b', 'fz_paused', 'fz_arch', 'fz_one', 'fz_c',
                      repeat('q', 128), 'fz é ✓', 'fz''quote"', 'fz;drop']) q,
         generate_series(1, 30) i) s;
SELECT pgq_push('fz_c', '{"later": true}', now() + interval '1 day') FROM generate_series(1, 5);
SELECT pgq_push('fz_c', '[1, [2, [3, {"x": null}]]]'::jsonb, now() + interval '1000 years');
SELECT count(*) FROM pgq_push_batch('fz_d', ARRAY(SELECT jsonb_build_object('b', i) FROM generate_series(1, 50) i));
SELECT pgq_push_periodic('fz_c', 'every-minute', '1 minute', '{"periodic": 1}');
SELECT pgq_push_periodic('fz_arch', 'hourly', '1 hour');

-- scheduled
SELECT pgq_schedule(10000);
-- running (a live lease), an expired lease, released
SELECT count(*) FROM pgq_claim('fz-holder-1', 20, '1 hour');
SELECT count(*) FROM pgq_claim('fz-holder-2', 10, '1 hour', ARRAY['fz_b', 'fz_arch', 'fz_one']);
SELECT count(*) FROM pgq_claim('fz-expired', 10, '1 millisecond');
SELECT count(*) FROM pgq_claim('fz-released', 5, '1 hour');
SELECT pgq_release('fz-released');
-- retry and failed: nack what fz-holder-2 holds (fz_one and fz_arch fail
-- on their first try)
SELECT pgq_nack(id, 'fz-holder-2', 'seed error ' || id, '1 hour')
  FROM pgqueue.work_queue WHERE lock_key = 'fz-holder-2';
-- archive rows: acked, cancelled, purged
SELECT count(*) FROM (SELECT pgq_claim('fz-acker', 5, '1 hour', ARRAY['fz_arch'])) s;
SELECT pgq_ack(id, 'fz-acker') FROM pgqueue.work_queue WHERE lock_key = 'fz-acker';
SELECT pgq_cancel(id) FROM (SELECT id FROM pgqueue.queue WHERE queue = 'fz_arch' AND state = 'pending' LIMIT 2) s;
SELECT pgq_purge('fz_arch', 'failed');
-- more failed jobs to retry later, and jobs pushed after the pass
SELECT count(*) FROM (SELECT pgq_claim('fz-holder-3', 5, '1 hour', ARRAY['fz_one'])) s;
SELECT pgq_nack(id, 'fz-holder-3', repeat('e', 1000)) FROM pgqueue.work_queue WHERE lock_key = 'fz-holder-3';
SELECT pgq_push('fz_e', jsonb_build_object('late', i)) FROM generate_series(1, 20) i;
SELECT pg_sleep(0.01);

-- plain tables for sqlsmith to join against: ids and keys of real jobs
CREATE TABLE fz_ids AS SELECT id, queue, lock_key FROM pgqueue.jobs;
CREATE TABLE fz_vals (i int, t text, j jsonb, iv interval, ts timestamptz, a text[]);
INSERT INTO fz_vals VALUES
  (0, '', '{}', '0', '-infinity', '{}'),
  (-1, 'fz_a', 'null', '-1 microsecond', 'infinity', '{fz_a,NULL}'),
  (10001, repeat('x', 129), '[[[[[]]]]]', '178000000 years', '294276-12-31 23:59:59+00', '{{a},{b}}'),
  (2147483647, 'fz-holder-1', '"s"', '1 mon -29 days', now(), '{fz_b}');
SELECT state, count(*) FROM pgqueue.jobs GROUP BY 1 ORDER BY 1;
SELECT outcome, count(*) FROM pgqueue.archive GROUP BY 1 ORDER BY 1;
