--
-- Bad input: every function rejects each bad argument with a clear error
-- and a proper SQLSTATE (22004 required NULL, 22023 out of range or empty,
-- 2202E multi-dimensional array, 54000 too large), and changes nothing.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.archive, pgqueue.periodic;
DELETE FROM pgqueue.queues;

-- a few jobs and settings that must survive every bad call: one of them
-- failed, one archived, one periodic
SELECT pgq_configure('dead', max_tries => 1);
SELECT pgq_push('dead', '{"n": 4}') AS id4 \gset
SELECT pgq_schedule(1);
SELECT count(*) AS claimed FROM pgq_claim('w2', 1, '1 hour', '{dead}');
SELECT pgq_nack(:'id4', 'w2', 'dead letter');
SELECT pgq_configure('bad', weight => 2, max_tries => 3, retention => '1 day');
SELECT pgq_push('bad', '{"n": 1}', dedup_key => 'd1') AS id1 \gset
SELECT pgq_push('bad', '{"n": 2}') IS NOT NULL AS pushed;
SELECT pgq_push('bad', '{"n": 3}') IS NOT NULL AS pushed;
SELECT pgq_schedule(2);
SELECT count(*) AS claimed FROM pgq_claim('w1', 1, '1 hour');
SELECT pgq_cancel(pgq_push('bad', '{"n": 5}')) AS archived;
SELECT pgq_push_periodic('bad', 'p', '1 day') IS NOT NULL AS periodic;

-- everything a call could change: the tables, the archive's partitions and
-- the counters
CREATE FUNCTION pg_temp.state() RETURNS text LANGUAGE sql AS $$
SELECT md5(coalesce((SELECT string_agg(q::text, '|' ORDER BY q.id) FROM pgqueue.queue q), '')
           || '#' || coalesce((SELECT string_agg(w::text, '|' ORDER BY w.id) FROM pgqueue.work_queue w), '')
           || '#' || coalesce((SELECT string_agg(s::text, '|' ORDER BY s.queue) FROM pgqueue.queues s), '')
           || '#' || coalesce((SELECT string_agg(a::text, '|' ORDER BY a.id) FROM pgqueue.archive a), '')
           || '#' || coalesce((SELECT string_agg(p::text, '|' ORDER BY p.queue, p.name) FROM pgqueue.periodic p), '')
           || '#' || (SELECT string_agg(inhrelid::regclass::text, ',' ORDER BY 1) FROM pg_inherits
                       WHERE inhparent = 'pgqueue.archive'::regclass)
           || '#' || (SELECT c::text FROM (SELECT pushed, scheduled, claimed, acked, nacked, failed,
                                                  leases_stolen, scheduler_passes
                                             FROM pgq_counters()) c))
$$;
-- Runs one statement: "ok: <first column>" or "<sqlstate>: <message>", and
-- " [CHANGED]" when the statement changed the state.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    before text := pg_temp.state();
    r text;
BEGIN
    BEGIN
        EXECUTE stmt INTO r;
        r := 'ok: ' || coalesce(r, 'NULL');
    EXCEPTION WHEN OTHERS THEN
        r := SQLSTATE || ': ' || SQLERRM;
    END;
    RETURN r || CASE WHEN pg_temp.state() = before THEN '' ELSE ' [CHANGED]' END;
END
$$;

SELECT pg_temp.state() AS state0 \gset
SELECT count(*) AS jobs, count(*) FILTER (WHERE state = 'scheduled') AS scheduled
  FROM pgqueue.queue;

--
-- What the errors look like (message, detail, SQLSTATE)
--
SELECT pgq_push(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push(repeat('x', 129));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgq_claim('w1', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgq_claim('w1', lease => '-1 second');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgq_claim('w1', queues => '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM pgq_claim('w1', queues => '{{a,b},{c,d}}');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_nack(:'id1', 'w1', 'e', '-1 hour');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_push('bad', '"x"', 'infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT pgq_configure('bad', weight => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('bad', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 10001)));
\echo :LAST_ERROR_SQLSTATE
-- and nothing changed
SELECT pg_temp.state() = :'state0' AS unchanged;

--
-- Every bad argument of every function
--
CREATE TEMP TABLE bad (n serial, call text);
INSERT INTO bad (call) VALUES
  -- pgq_push
  ($$pgq_push(NULL)$$),
  ($$pgq_push(NULL, '{}')$$),
  ($$pgq_push('')$$),
  ($$pgq_push(repeat('x', 129))$$),
  ($$pgq_push(repeat('é', 65))$$),
  ($$pgq_push(repeat('🚀', 33))$$),
  ($$pgq_push(repeat('x', 100000))$$),
  ($$pgq_push('bad', NULL)$$),
  ($$pgq_push('bad', '{}', 'infinity')$$),
  ($$pgq_push('bad', '{}', '-infinity')$$),
  ($$pgq_push('bad', '{}', NULL, NULL)$$),
  ($$pgq_push('bad', '{}', dedup_key => '')$$),
  ($$pgq_push('bad', '{}', dedup_key => repeat('k', 257))$$),
  ($$pgq_push($x$x'); DROP TABLE pgqueue.queue; --$x$ || repeat('-', 100))$$),
  -- pgq_push_batch
  ($$pgq_push_batch(NULL, ARRAY['{}']::jsonb[])$$),
  ($$pgq_push_batch('', ARRAY['{}']::jsonb[])$$),
  ($$pgq_push_batch(repeat('x', 129), ARRAY['{}']::jsonb[])$$),
  ($$pgq_push_batch('bad', NULL)$$),
  ($$pgq_push_batch('bad', ARRAY['{}', NULL]::jsonb[])$$),
  ($$pgq_push_batch('bad', ARRAY[['{}', '{}'], ['{}', '{}']]::jsonb[])$$),
  ($$pgq_push_batch('bad', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, 10001)))$$),
  ($$pgq_push_batch('bad', ARRAY['{}']::jsonb[], 'infinity')$$),
  ($$pgq_push_batch('bad', ARRAY['{}']::jsonb[], NULL, NULL)$$),
  -- pgq_schedule
  ($$pgq_schedule(NULL)$$),
  ($$pgq_schedule(0)$$),
  ($$pgq_schedule(-1)$$),
  ($$pgq_schedule(10001)$$),
  ($$pgq_schedule(2147483647)$$),
  ($$pgq_schedule(-2147483648)$$),
  -- pgq_claim
  ($$pgq_claim(NULL)$$),
  ($$pgq_claim('')$$),
  ($$pgq_claim(repeat('w', 257))$$),
  ($$pgq_claim('w1', NULL)$$),
  ($$pgq_claim('w1', 0)$$),
  ($$pgq_claim('w1', -1)$$),
  ($$pgq_claim('w1', 10001)$$),
  ($$pgq_claim('w1', 2147483647)$$),
  ($$pgq_claim('w1', 1, NULL)$$),
  ($$pgq_claim('w1', 1, '0')$$),
  ($$pgq_claim('w1', 1, '-1 second')$$),
  ($$pgq_claim('w1', 1, '-1 microsecond')$$),
  ($$pgq_claim('w1', 1, '1000 years')$$),
  ($$pgq_claim('w1', 1, '8 days')$$),
  ($$pgq_claim('w1', 1, '7 days 00:00:00.000001')$$),
  ($$pgq_claim('w1', 1, '1 month')$$),
  ($$pgq_claim('w1', 1, '178000000 years')$$),
  ($$pgq_claim('w1', 1, '-178000000 years')$$),
  ($$pgq_claim('w1', 1, '1 day -25:00:00')$$),
  ($$pgq_claim('w1', queues => '{}')$$),
  ($$pgq_claim('w1', queues => ARRAY['bad', NULL])$$),
  ($$pgq_claim('w1', queues => ARRAY['bad', ''])$$),
  ($$pgq_claim('w1', queues => ARRAY['bad', repeat('x', 129)])$$),
  ($$pgq_claim('w1', queues => '{{a,b},{c,d}}')$$),
  ($$pgq_claim('w1', queues => (SELECT array_agg('q' || g) FROM generate_series(1, 101) g))$$),
  ($$pgq_claim('w1', wait => NULL)$$),
  ($$pgq_claim('w1', wait => '-1 second')$$),
  ($$pgq_claim('w1', wait => '61 seconds')$$),
  ($$pgq_claim('w1', wait => '1 hour')$$),
  ($$pgq_claim('w1', wait => '1000 years')$$),
  -- pgq_extend
  ($$pgq_extend(NULL, 'w1')$$),
  ($$pgq_extend(:'id1', NULL)$$),
  ($$pgq_extend(:'id1', '')$$),
  ($$pgq_extend(:'id1', repeat('w', 257))$$),
  ($$pgq_extend(:'id1', 'w1', NULL)$$),
  ($$pgq_extend(:'id1', 'w1', '0')$$),
  ($$pgq_extend(:'id1', 'w1', '-1 second')$$),
  ($$pgq_extend(:'id1', 'w1', '1000 years')$$),
  ($$pgq_extend(:'id1', 'w1', '8 days')$$),
  -- pgq_ack
  ($$pgq_ack(NULL, 'w1')$$),
  ($$pgq_ack(:'id1', NULL)$$),
  ($$pgq_ack(:'id1', '')$$),
  ($$pgq_ack(:'id1', repeat('w', 257))$$),
  -- pgq_ack_batch
  ($$pgq_ack_batch(NULL, 'w1')$$),
  ($$pgq_ack_batch(ARRAY[:'id1']::uuid[], NULL)$$),
  ($$pgq_ack_batch(ARRAY[:'id1']::uuid[], '')$$),
  ($$pgq_ack_batch(ARRAY[:'id1']::uuid[], repeat('w', 257))$$),
  ($$pgq_ack_batch(ARRAY[[:'id1'], [:'id1']]::uuid[], 'w1')$$),
  ($$pgq_ack_batch((SELECT array_agg(:'id1'::uuid) FROM generate_series(1, 10001)), 'w1')$$),
  -- pgq_nack
  ($$pgq_nack(NULL, 'w1')$$),
  ($$pgq_nack(:'id1', NULL)$$),
  ($$pgq_nack(:'id1', '')$$),
  ($$pgq_nack(:'id1', repeat('w', 257))$$),
  ($$pgq_nack(:'id1', 'w1', 'e', '-1 second')$$),
  ($$pgq_nack(:'id1', 'w1', 'e', '-1 microsecond')$$),
  ($$pgq_nack(:'id1', 'w1', 'e', '366 days')$$),
  -- twelve calendar months are a year: past the cap with 5 days more
  ($$pgq_nack(:'id1', 'w1', 'e', '12 mon 5 days')$$),
  ($$pgq_nack(:'id1', 'w1', 'e', '1000 years')$$),
  ($$pgq_nack(:'id1', 'w1', 'e', '178000000 years')$$),
  -- pgq_release
  ($$pgq_release(NULL)$$),
  ($$pgq_release('')$$),
  ($$pgq_release(repeat('w', 257))$$),
  -- pgq_configure
  ($$pgq_configure(NULL)$$),
  ($$pgq_configure(NULL, weight => 5)$$),
  ($$pgq_configure('')$$),
  ($$pgq_configure(repeat('x', 129))$$),
  ($$pgq_configure('bad', weight => 0)$$),
  ($$pgq_configure('bad', weight => -1)$$),
  ($$pgq_configure('bad', weight => 10001)$$),
  ($$pgq_configure('bad', max_in_flight => -1)$$),
  ($$pgq_configure('bad', max_in_flight => -2147483648)$$),
  ($$pgq_configure('bad', max_tries => 0)$$),
  ($$pgq_configure('bad', max_tries => -5)$$),
  ($$pgq_configure('bad', retention => '-1 second')$$),
  ($$pgq_configure('bad', retention => '-1 microsecond')$$),
  ($$pgq_configure('bad', retention => '366 days')$$),
  ($$pgq_configure('bad', retention => '13 mons')$$),
  ($$pgq_configure('bad', retention => '1000 years')$$),
  ($$pgq_configure('bad', retention => '178000000 years')$$),
  ($$pgq_configure('bad', weight => 0, retention => '30 days')$$),
  -- pgq_retry, pgq_retry_failed
  ($$pgq_retry(NULL)$$),
  ($$pgq_retry_failed(NULL)$$),
  ($$pgq_retry_failed('')$$),
  ($$pgq_retry_failed(repeat('x', 129))$$),
  -- pgq_cancel
  ($$pgq_cancel(NULL)$$),
  -- pgq_purge
  ($$pgq_purge(NULL)$$),
  ($$pgq_purge(NULL, 'pending')$$),
  ($$pgq_purge('')$$),
  ($$pgq_purge(repeat('x', 129))$$),
  ($$pgq_purge('dead', NULL)$$),
  ($$pgq_purge('dead', '')$$),
  ($$pgq_purge('bad', 'scheduled')$$),
  ($$pgq_purge('bad', 'running')$$),
  ($$pgq_purge('dead', 'FAILED')$$),
  ($$pgq_purge('dead', 'failed ')$$),
  ($$pgq_purge('bad', 'acked')$$),
  -- pgq_push_periodic
  ($$pgq_push_periodic(NULL, 'p2', '1 day')$$),
  ($$pgq_push_periodic('', 'p2', '1 day')$$),
  ($$pgq_push_periodic(repeat('x', 129), 'p2', '1 day')$$),
  ($$pgq_push_periodic('bad', NULL, '1 day')$$),
  ($$pgq_push_periodic('bad', '', '1 day')$$),
  ($$pgq_push_periodic('bad', repeat('n', 225), '1 day')$$),
  ($$pgq_push_periodic('bad', 'p2', NULL)$$),
  ($$pgq_push_periodic('bad', 'p2', '0')$$),
  ($$pgq_push_periodic('bad', 'p2', '-1 hour')$$),
  ($$pgq_push_periodic('bad', 'p2', '999 milliseconds')$$),
  ($$pgq_push_periodic('bad', 'p2', '1 month')$$),
  ($$pgq_push_periodic('bad', 'p2', '1 year')$$),
  ($$pgq_push_periodic('bad', 'p2', '366 days')$$),
  ($$pgq_push_periodic('bad', 'p2', '1000000 years')$$),
  ($$pgq_push_periodic('bad', 'p2', '1 day', NULL)$$),
  ($$pgq_push_periodic('bad', 'p2', '1 day', '{}', NULL)$$);
-- psql variables are not expanded inside dollar quotes: put the id in
UPDATE bad SET call = replace(call, ':''id1''', quote_literal(:'id1'));

SELECT n, regexp_replace(call, '[0-9a-f]{8}-[0-9a-f-]{27}', '<id1>', 'g') AS call,
       pg_temp.try('SELECT (' || call || ')::text') AS result
  FROM bad ORDER BY n;

-- nothing changed, and nothing is pending to be counted at commit
SELECT pg_temp.state() = :'state0' AS unchanged;
SELECT count(*) AS jobs, count(*) FILTER (WHERE state = 'scheduled') AS scheduled
  FROM pgqueue.queue;

--
-- The limits themselves are accepted
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_push(repeat('x', 128), dedup_key => repeat('k', 256)) IS NOT NULL AS pushed;
SELECT pgq_push(repeat('é', 64)) IS NOT NULL AS pushed;
SELECT pgq_push(repeat('🚀', 32)) IS NOT NULL AS pushed;
SELECT octet_length(queue) AS queue_bytes, length(queue) AS queue_chars,
       octet_length(dedup_key) AS key_bytes
  FROM pgqueue.queue ORDER BY id;
SELECT pgq_configure(repeat('x', 128), weight => 10000, max_in_flight => 2147483647, max_tries => 2147483647);
SELECT pgq_configure(repeat('é', 64), weight => 1, max_in_flight => 0, max_tries => 1000);
SELECT pgq_schedule(10000);
SELECT pgq_schedule(1);
SELECT count(*) AS claimed
  FROM pgq_claim(repeat('w', 256), 10000, '7 days',
                 (SELECT array_agg(q) FROM (SELECT repeat('x', 128) UNION ALL
                                            SELECT 'q' || g FROM generate_series(1, 99) g) s (q)),
                 '60 seconds');
SELECT lock_timeout > now() + interval '6 days 23 hours' AS seven_days
  FROM pgqueue.work_queue WHERE lock_key = repeat('w', 256);
SELECT pgq_extend(id, repeat('w', 256), '1 microsecond') IS NOT NULL AS extended
  FROM pgqueue.work_queue WHERE lock_key = repeat('w', 256);
SELECT count(*) AS claimed FROM pgq_claim('w2', 3, '1 microsecond');
SELECT pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w2', 3, '1 hour');
SELECT pgq_nack(id, 'w2', repeat('e', 100000), '365 days') FROM pgqueue.work_queue
 WHERE lock_key = 'w2' AND queue = repeat('é', 64);
SELECT pgq_nack(id, 'w2', NULL, '0') FROM pgqueue.work_queue
 WHERE lock_key = 'w2' AND queue = repeat('🚀', 32);
SELECT pgq_ack_batch((SELECT array_agg(id) FROM pgqueue.work_queue) ||
                     (SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 9999)), 'w2');
SELECT pgq_release(repeat('w', 256));
SELECT left(queue, 3) AS queue, state, tries, octet_length(last_error) AS error_bytes,
       run_after > now() + interval '364 days' AS in_a_year
  FROM pgqueue.queue ORDER BY queue COLLATE "C";
-- an empty batch and an empty ack list are fine
SELECT count(*) AS pushed FROM pgq_push_batch('bad', '{}');
SELECT pgq_ack_batch('{}', 'w1') AS acked;
-- the longest retention and the shortest and longest periods
SELECT pgq_configure('longest', retention => '365 days');
-- months count as calendar months, as the deadline adds them: 12 months and
-- 5 days is more than 365 days, whatever the date
SELECT pgq_configure('longest', retention => '12 mons 5 days');
SELECT retention FROM pgqueue.queues WHERE queue = 'longest';
SELECT pgq_push_periodic('longest', 'once', '365 days') IS NOT NULL AS periodic;
SELECT pgq_push_periodic('longest', 'often', '1 second') IS NOT NULL AS periodic;

--
-- pgqueue.max_payload_size: superuser-settable, 16MB by default
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SHOW pgqueue.max_payload_size;
SET pgqueue.max_payload_size = '1kB';
SHOW pgqueue.max_payload_size;
SELECT pgq_push('big', jsonb_build_object('s', repeat('x', 900))) IS NOT NULL AS pushed_900_chars;
SELECT pgq_push('big', jsonb_build_object('s', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM pgq_push_batch('big', ARRAY[jsonb_build_object('s', repeat('x', 10)),
                                                 jsonb_build_object('s', repeat('x', 2000))]);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS jobs FROM pgqueue.queue;
RESET pgqueue.max_payload_size;
SELECT pgq_push('big', jsonb_build_object('s', repeat('x', 2000))) IS NOT NULL AS pushed_2000_chars;
SELECT count(*) AS jobs FROM pgqueue.queue;
-- the default limit: 16MB
SELECT pgq_push('big', jsonb_build_object('s', repeat('x', 17 * 1024 * 1024)));
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS jobs FROM pgqueue.queue;
-- out of its range: 22023 (the message, which names the range, gives its
-- units from PostgreSQL 16 on; the range is read from pg_settings)
SELECT min_val, max_val, unit FROM pg_settings WHERE name = 'pgqueue.max_payload_size';
\set VERBOSITY sqlstate
SET pgqueue.max_payload_size = 0;
SET pgqueue.max_payload_size = '2GB';
\set VERBOSITY default
-- not for ordinary roles
CREATE ROLE regress_setter;
SET ROLE regress_setter;
SET pgqueue.max_payload_size = '1MB';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE regress_setter;
SHOW pgqueue.max_payload_size;

TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.archive, pgqueue.periodic;
DELETE FROM pgqueue.queues;

--
-- Checks and deadlines use one arithmetic, timestamptz + interval, where a
-- month is a calendar month: an interval with months is accepted as a lease
-- exactly when now plus it lies after now and at most 7 days later
-- (whatever month this runs in).
--
SELECT iv,
       pg_temp.try(format('SELECT count(*) FROM pgq_claim(%L, 1, %L, ARRAY[%L])',
                          'w9', iv, 'nothing here')) LIKE 'ok:%'
         = (now() + iv::interval > now() AND now() + iv::interval <= now() + interval '7 days')
         AS consistent
  FROM unnest(ARRAY['1 mon -23 days', '1 mon -24 days', '1 mon -28 days', '1 mon -29 days',
                    '1 mon -30 days', '1 mon -31 days', '-1 mon 35 days']) AS iv;
