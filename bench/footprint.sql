-- bench/footprint.sql: the live footprint per job, compacted, of pgqueue and
-- of system 1 (bench/ROTATION.md).  Run as a superuser with psql in an empty
-- database of a server where pgqueue is installed (the library need not be
-- preloaded: it calls pgq_schedule itself); it leaves its tables there.
--   psql -d footprint -f bench/footprint.sql
\set payload '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'
CREATE EXTENSION IF NOT EXISTS pgqueue;
-- the bytes of a table and its indexes, its partitions' when it has them
CREATE FUNCTION pg_temp.bytes(t regclass) RETURNS bigint LANGUAGE sql AS
  $$ SELECT coalesce((SELECT sum(pg_total_relation_size(relid))::bigint
                        FROM pg_partition_tree(t) WHERE isleaf), pg_total_relation_size(t)) $$;
\ir sql/sys1_schema.sql
INSERT INTO sys1.jobs (payload) SELECT :'payload'::jsonb FROM generate_series(1, 100000);
DO $$ BEGIN FOR i IN 1..10 LOOP PERFORM count(*) FROM pgq_push_batch($q$q$q$, array(SELECT $p${"task": "send_email", "to": "user@example.com", "template": "welcome"}$p$::jsonb FROM generate_series(1, 10000))); END LOOP; END $$;
VACUUM FULL pgqueue.queue;
SELECT 'pgqueue 100k pending' AS what, pg_temp.bytes('pgqueue.queue') + pg_temp.bytes('pgqueue.work_queue') AS bytes;
DO $$ BEGIN WHILE pgq_schedule(10000) > 0 LOOP END LOOP; END $$;
VACUUM FULL pgqueue.queue; VACUUM FULL pgqueue.work_queue;
SELECT 'pgqueue 100k scheduled' AS what, pg_temp.bytes('pgqueue.queue') + pg_temp.bytes('pgqueue.work_queue') AS bytes,
       pg_temp.bytes('pgqueue.queue') AS queue_bytes, pg_temp.bytes('pgqueue.work_queue') AS work_bytes;
VACUUM FULL sys1.jobs;
SELECT 'sys1 100k' AS what, pg_temp.bytes('sys1.jobs') AS bytes;
