-- Consistency of pgqueue's tables, as DESIGN.md and pgqueue--1.1.sql define
-- them.  Every query returns one line per violation and nothing when the
-- tables are consistent (the fuzzers fail on any line).  Run in one
-- REPEATABLE READ transaction so that all of them see one snapshot.
BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
-- 1. every work_queue row has its job, in state 'scheduled', same queue
SELECT 'work_queue row without a scheduled job: ' || w.id || ' job state ' || coalesce(q.state::text, 'missing')
  FROM pgqueue.work_queue w LEFT JOIN pgqueue.queue q ON q.id = w.id
 WHERE q.id IS NULL OR q.state <> 'scheduled' OR q.queue <> w.queue
UNION ALL
-- 2. every scheduled job has its work_queue row
SELECT 'scheduled job without a work_queue row: ' || q.id
  FROM pgqueue.queue q
 WHERE q.state = 'scheduled' AND NOT EXISTS (SELECT FROM pgqueue.work_queue w WHERE w.id = q.id)
UNION ALL
-- 3. a lease is all or nothing: lock_key, started, lock_timeout together;
--    a held row has been tried at least once, and its try count and
--    version never fall behind the job row's
SELECT 'work_queue lease half set: ' || w.id
  FROM pgqueue.work_queue w
 WHERE (w.lock_key IS NULL) <> (w.lock_timeout IS NULL) OR (w.lock_key IS NULL) <> (w.started IS NULL)
UNION ALL
SELECT 'held work_queue row with tries < 1: ' || w.id
  FROM pgqueue.work_queue w WHERE w.lock_key IS NOT NULL AND w.tries < 1
UNION ALL
SELECT 'work_queue tries/version behind the job row: ' || w.id || ' ' || w.tries || '/' || q.tries || ' ' || w.version || '/' || q.version
  FROM pgqueue.work_queue w JOIN pgqueue.queue q ON q.id = w.id
 WHERE w.tries < q.tries OR w.version < q.version
UNION ALL
SELECT 'lease before its start: ' || w.id
  FROM pgqueue.work_queue w WHERE w.lock_timeout <= w.started
UNION ALL
-- 4. tries, versions, names and keys within bounds
SELECT 'job with negative tries or version: ' || q.id
  FROM pgqueue.queue q WHERE q.tries < 0 OR q.version < 0
UNION ALL
SELECT 'pending job with tries <> 0: ' || q.id || ' tries ' || q.tries
  FROM pgqueue.queue q WHERE q.state = 'pending' AND q.tries <> 0
UNION ALL
SELECT 'retry or failed job never tried: ' || q.id || ' ' || q.state
  FROM pgqueue.queue q WHERE q.state IN ('retry', 'failed') AND q.tries < 1
UNION ALL
SELECT 'queue name out of 1-128 bytes: ' || q.id
  FROM pgqueue.queue q WHERE octet_length(q.queue) NOT BETWEEN 1 AND 128
UNION ALL
SELECT 'dedup_key out of 1-256 bytes: ' || q.id
  FROM pgqueue.queue q WHERE octet_length(q.dedup_key) NOT BETWEEN 1 AND 256
UNION ALL
SELECT 'lock_key out of 1-256 bytes: ' || w.id
  FROM pgqueue.work_queue w WHERE octet_length(w.lock_key) NOT BETWEEN 1 AND 256
UNION ALL
SELECT 'job due at an infinite time: ' || q.id
  FROM pgqueue.queue q WHERE NOT isfinite(q.run_after) OR NOT isfinite(q.created)
UNION ALL
SELECT 'lease at an infinite time: ' || w.id
  FROM pgqueue.work_queue w WHERE NOT isfinite(w.lock_timeout) OR NOT isfinite(w.started)
UNION ALL
SELECT 'payload over the size limit: ' || q.id
  FROM pgqueue.queue q
 WHERE pg_column_size(q.payload) > pg_size_bytes(current_setting('pgqueue.max_payload_size')) + 1024
UNION ALL
-- 5. dedup: at most one live job per (queue, dedup_key) (the unique index
--    says so; this checks the index agrees with the heap)
SELECT 'two live jobs with one dedup_key: ' || queue || ' ' || dedup_key
  FROM pgqueue.queue
 WHERE dedup_key IS NOT NULL AND state <> 'failed'
 GROUP BY queue, dedup_key HAVING count(*) > 1
UNION ALL
-- 6. the archive: a finished job is no longer a job, finishes once, and
--    each row is in the partition of its expiry day (rows go straight into
--    partitions, bypassing the partition routing)
SELECT 'archived job still in pgqueue.queue: ' || a.id
  FROM pgqueue.archive a JOIN pgqueue.queue q ON q.id = a.id
UNION ALL
SELECT 'job archived twice: ' || a.id
  FROM pgqueue.archive a GROUP BY a.id HAVING count(*) > 1
UNION ALL
SELECT 'archive row in the wrong partition: ' || a.id || ' in ' || a.tableoid::regclass::text
  FROM pgqueue.archive a
 WHERE a.tableoid::regclass::text <> 'pgqueue.archive_' || to_char(a.expires AT TIME ZONE 'UTC', 'YYYYMMDD')
UNION ALL
SELECT 'archive row expiring outside finished + 0..365 days: ' || a.id
  FROM pgqueue.archive a
 WHERE a.expires <= a.finished OR a.expires > a.finished + interval '366 days'
UNION ALL
SELECT 'archive row with tries < 0: ' || a.id
  FROM pgqueue.archive a WHERE a.tries < 0
UNION ALL
-- 7. the view: one row per job, with a valid state
SELECT 'pgqueue.jobs disagrees with pgqueue.queue: ' || (SELECT count(*) FROM pgqueue.jobs) || ' <> ' || (SELECT count(*) FROM pgqueue.queue)
 WHERE (SELECT count(*) FROM pgqueue.jobs) <> (SELECT count(*) FROM pgqueue.queue)
UNION ALL
SELECT 'pgqueue.jobs state invalid: ' || id || ' ' || state
  FROM pgqueue.jobs WHERE state NOT IN ('pending', 'retry', 'scheduled', 'running', 'failed')
UNION ALL
-- 8. pgq_stats() counts what the tables hold
SELECT 'pgq_stats() ' || coalesce(s.queue, t.queue) || ': ' || row(s.pending, s.retry, s.scheduled + s.in_flight, s.failed)::text
       || ' <> tables ' || row(t.pending, t.retry, t.sched, t.failed)::text
  FROM (SELECT * FROM pgq_stats()) s
  FULL JOIN (SELECT queue, count(*) FILTER (WHERE state = 'pending') AS pending,
                    count(*) FILTER (WHERE state = 'retry') AS retry,
                    count(*) FILTER (WHERE state = 'scheduled') AS sched,
                    count(*) FILTER (WHERE state = 'failed') AS failed
               FROM pgqueue.queue GROUP BY queue) t ON t.queue = s.queue
 WHERE t.queue IS NULL AND (s.pending, s.retry, s.scheduled, s.in_flight, s.failed) <> (0, 0, 0, 0, 0)
    OR s.queue IS NULL
    OR (s.pending, s.retry, s.scheduled + s.in_flight, s.failed) <> (t.pending, t.retry, t.sched, t.failed);
COMMIT;
