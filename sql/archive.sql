--
-- pgqueue.archive: finished jobs of the queues with a retention, written in
-- the transaction of the ack, cancel or purge that finishes them, into
-- partitions by day of expiry that the upkeep retires once past (and drops later).
--
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.archive;
DELETE FROM pgqueue.queues;

-- the archive's partitions and their bounds (not temporary: the test
-- reconnects to let a new session run the upkeep)
CREATE VIEW parts AS
SELECT c.relname ~ '^archive_[0-9]{8}$' AS named_by_day,
       EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid) AS indexed,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), $$FROM \('([^']+)'\) TO \('([^']+)'\)$$))[1]::timestamptz AS lo,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), $$FROM \('([^']+)'\) TO \('([^']+)'\)$$))[2]::timestamptz AS hi
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'pgqueue.archive'::regclass;
-- does a partition take a row that expires at t?
CREATE FUNCTION covered(t timestamptz) RETURNS boolean LANGUAGE sql AS $$
  SELECT EXISTS (SELECT 1 FROM parts WHERE t >= lo AND t < hi)
$$;
CREATE VIEW archived AS
SELECT a.queue, a.payload->>'n' AS n, a.outcome, a.priority, a.tries, a.last_error,
       a.expires - a.finished AS kept_for,
       a.finished BETWEEN now() - interval '1 minute' AND clock_timestamp() AS finished_now,
       a.tableoid::regclass::text = 'pgqueue.archive_' || to_char(a.expires AT TIME ZONE 'UTC', 'YYYYMMDD')
         AS in_its_day
  FROM pgqueue.archive a ORDER BY a.finished, a.id;

-- the setting: 0 by default, NULL keeps it
SELECT pgq_configure('kept');
SELECT queue, retention FROM pgqueue.queues;
SELECT pgq_configure('kept', retention => '2 days');
SELECT pgq_configure('kept', weight => 3);
SELECT queue, weight, retention FROM pgqueue.queues;
-- setting it made the partitions its jobs go to over the next day
SELECT count(*) > 0 AS has_parts, bool_and(named_by_day) AS named_by_day, bool_and(indexed) AS indexed,
       bool_and(hi - lo = interval '1 day') AS one_day_each,
       bool_and(lo = date_trunc('day', lo AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS utc_midnight
  FROM parts;
SELECT covered(now() + interval '2 days') AS now_plus_2_days,
       covered(now() + interval '3 days') AS now_plus_3_days;

--
-- ack: the job as it was, outcome 'acked', kept for the retention
--
SELECT pgq_push('kept', '{"n": "a1"}', priority => 7) AS a1 \gset
SELECT pgq_push('plain', '{"n": "p1"}') AS p1 \gset
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 10, '1 hour');
SELECT pgq_nack(:'a1', 'w1', 'first try failed', '0');
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w1', 10, '1 hour');
SELECT created AS a1_created FROM pgqueue.queue WHERE id = :'a1' \gset
SELECT pgq_ack(:'a1', 'w1') AS a1, pgq_ack(:'p1', 'w1') AS p1;
-- only the queue with a retention keeps its job
SELECT * FROM archived;
SELECT id = :'a1' AS same_id, created = :'a1_created' AS same_created FROM pgqueue.archive;
-- "what became of job a1"
SELECT outcome FROM pgqueue.archive WHERE id = :'a1';

-- ack_batch: the jobs of queues with a retention, in the same statement
SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('kept', jsonb_build_object('n', 'b' || g));
SELECT count(*) AS pushed FROM generate_series(1, 2) g, pgq_push('plain', jsonb_build_object('n', 'b' || g));
SELECT pgq_schedule();
SELECT pgq_ack_batch(array_agg(id), 'w2') AS acked FROM pgq_claim('w2', 10, '1 hour');
SELECT queue, n, outcome, tries FROM archived WHERE n LIKE 'b%';

-- an ack that rolls back archives nothing
SELECT pgq_push('kept', '{"n": "rolled back"}') AS rb \gset
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w3', 1, '1 hour');
BEGIN;
SELECT pgq_ack(:'rb', 'w3') AS acked;
SELECT count(*) AS archived_inside FROM pgqueue.archive WHERE id = :'rb';
ROLLBACK;
SELECT count(*) AS archived_after FROM pgqueue.archive WHERE id = :'rb';
-- a fenced-off ack archives nothing either
SELECT pgq_ack(:'rb', 'w9') AS wrong_key;
SELECT count(*) AS archived FROM pgqueue.archive WHERE id = :'rb';
SELECT pgq_ack(:'rb', 'w3') AS acked;

--
-- cancel and purge: outcomes 'cancelled' and 'purged'
--
SELECT pgq_configure('kept', max_tries => 1);
SELECT pgq_push('kept', '{"n": "c-running"}') AS cr \gset
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w4', 1, '1 hour');
SELECT pgq_push('kept', '{"n": "c-pending"}') AS cp \gset
SELECT pgq_cancel(:'cp') AS pending, pgq_cancel(:'cr') AS running;
SELECT pgq_push('kept', '{"n": "purged"}') AS pf \gset
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w4', 1, '1 hour');
SELECT pgq_nack(:'pf', 'w4', 'dead letter');
SELECT pgq_push('kept', '{"n": "purged pending"}') IS NOT NULL AS pushed;
SELECT pgq_purge('kept') AS failed, pgq_purge('kept', 'pending') AS pending;
SELECT * FROM archived WHERE outcome <> 'acked';
-- a payload stored out of line (TOAST) is archived whole, by ack and cancel
SELECT pgq_push('kept', jsonb_build_object('n', 'big', 'data',
                (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 4000) g))) AS big \gset
SELECT md5(payload::text) AS big_md5, pg_column_size(payload) > 100000 AS out_of_line
  FROM pgqueue.queue WHERE id = :'big' \gset
SELECT :'out_of_line' AS out_of_line;
SELECT pgq_schedule();
SELECT count(*) FROM pgq_claim('w5', 1, '1 hour');
SELECT pgq_ack(:'big', 'w5') AS acked;
SELECT md5(payload::text) = :'big_md5' AS same_payload FROM pgqueue.archive WHERE id = :'big';
SELECT pgq_cancel(pgq_push('kept', (SELECT payload FROM pgqueue.archive WHERE id = :'big'))) AS cancelled;
SELECT count(*) FILTER (WHERE md5(payload::text) = :'big_md5') AS both_whole FROM pgqueue.archive;

-- a queue without a retention: cancelled and purged, not archived
SELECT pgq_push('plain', '{"n": "pc"}') AS pc \gset
SELECT pgq_push('plain', '{"n": "pp"}') IS NOT NULL AS pushed;
SELECT pgq_cancel(:'pc') AS cancelled, pgq_purge('plain', 'pending') AS purged;
SELECT count(*) AS plain_archived FROM pgqueue.archive WHERE queue = 'plain';

--
-- a changed retention counts for jobs finished after the change; 0 stops
-- archiving; rows already archived keep their expiry
--
SELECT pgq_configure('kept', retention => '36 hours');
SELECT pgq_push('kept', '{"n": "shorter"}') AS sh \gset
SELECT pgq_cancel(:'sh');
SELECT pgq_configure('kept', retention => '0');
SELECT pgq_push('kept', '{"n": "not kept"}') AS nk \gset
SELECT pgq_cancel(:'nk');
SELECT n, outcome, kept_for, in_its_day FROM archived WHERE n IN ('a1', 'shorter', 'not kept');

--
-- A write whose day has no partition (nothing ran the upkeep for a day)
-- makes it
--
SELECT pgq_configure('kept', retention => '10 days');
SELECT 'pgqueue.archive_' || to_char((now() + interval '10 days') AT TIME ZONE 'UTC', 'YYYYMMDD') AS part \gset
DROP TABLE :part;
SELECT covered(now() + interval '10 days') AS covered_before;
SELECT pgq_push('kept', '{"n": "made its day"}') AS md \gset
SELECT pgq_cancel(:'md');
SELECT covered(now() + interval '10 days') AS covered_after;
SELECT n, in_its_day FROM archived WHERE n = 'made its day';
SELECT indexed FROM parts WHERE now() + interval '10 days' >= lo AND now() + interval '10 days' < hi;

--
-- The upkeep retires the partitions whose days have passed, and only those
-- pgqueue names (archive_...): detached and made members of the extension
-- (pg_dump leaves them out), then dropped by a later run once no snapshot
-- from before is left (src/retire.c).  pgq_schedule runs it (once a minute
-- per session; a new session at its first call) when no scheduler does
-- (here pgqueue.enabled is off), and only outside a transaction block.
--
CREATE TABLE pgqueue.archive_20200101 PARTITION OF pgqueue.archive
  FOR VALUES FROM ('2020-01-01 00:00+00') TO ('2020-01-02 00:00+00');
CREATE TABLE pgqueue.old_by_hand PARTITION OF pgqueue.archive
  FOR VALUES FROM ('2020-02-01 00:00+00') TO ('2020-02-01 12:00+00');
INSERT INTO pgqueue.archive (id, queue, payload, priority, tries, created, finished, outcome, expires)
VALUES (gen_random_uuid(), 'kept', '{"n": "expired"}', 0, 1, '2019-12-30', '2019-12-31', 'acked', '2020-01-01 10:00+00'),
       (gen_random_uuid(), 'kept', '{"n": "expired too"}', 0, 1, '2020-01-30', '2020-01-31', 'acked', '2020-02-01 01:00+00');
SELECT count(*) FILTER (WHERE hi <= now()) AS past FROM parts;
SELECT count(*) FILTER (WHERE hi > now()) AS future FROM parts \gset
SELECT count(*) AS rows_before FROM pgqueue.archive;
\c
-- in a transaction block: no upkeep (its locks would last to the commit)
BEGIN;
SELECT pgq_schedule();
SELECT count(*) FILTER (WHERE hi <= now()) AS past FROM parts;
COMMIT;
SELECT pgq_schedule();
SELECT count(*) FILTER (WHERE hi <= now()) AS past,
       count(*) FILTER (WHERE hi > now()) = :future AS future_kept
  FROM parts;
SELECT count(*) AS rows_after FROM pgqueue.archive;
-- retired, not dropped yet (pgq_schedule retired it in its own transaction)
SELECT c.relispartition AS partition, d.deptype AS member
  FROM pg_class c
  LEFT JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
                       AND d.refclassid = 'pg_extension'::regclass
 WHERE c.oid = 'pgqueue.archive_20200101'::regclass;
-- dropped by a later call (retried every second while retired tables wait)
DO $$
BEGIN
    FOR i IN 1 .. 100 LOOP
        PERFORM pgq_schedule();
        EXIT WHEN to_regclass('pgqueue.archive_20200101') IS NULL;
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT to_regclass('pgqueue.archive_20200101') AS dropped, to_regclass('pgqueue.old_by_hand') AS not_ours_kept;
-- and keeps the days the retentions in use need over the next day
SELECT covered(now() + interval '10 days') AS ten_days,
       covered(now() + interval '11 days') AS eleven_days;

--
-- DROP EXTENSION takes the partitions with it
--
DROP VIEW archived;
DROP VIEW parts CASCADE;
DROP EXTENSION pgqueue;
SELECT count(*) AS left_over FROM pg_class
 WHERE relname LIKE 'archive%' AND relnamespace IN (SELECT oid FROM pg_namespace WHERE nspname = 'pgqueue');
SELECT count(*) AS schema_left FROM pg_namespace WHERE nspname = 'pgqueue';
CREATE EXTENSION pgqueue;
SELECT count(*) AS parts FROM pg_inherits WHERE inhparent = 'pgqueue.archive'::regclass;
DROP FUNCTION covered(timestamptz);
