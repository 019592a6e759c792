--
-- Security: privileges through the three roles only, SECURITY DEFINER
-- functions with a fixed search_path that hostile objects cannot hijack,
-- and values that look like SQL stored verbatim.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

-- Runs one statement and says how it went: "ok: <first column>" or
-- "ERROR <sqlstate>: <message>".  SECURITY INVOKER: it runs as the current
-- role.
CREATE FUNCTION pg_temp.try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r text;
BEGIN
    EXECUTE stmt INTO r;
    RETURN 'ok: ' || coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
    RETURN 'ERROR ' || SQLSTATE || ': ' || SQLERRM;
END
$$;

--
-- The functions: SECURITY DEFINER, search_path fixed, nothing for PUBLIC
--
CREATE TEMP VIEW api AS
SELECT p.oid, p.proname::text AS name, p.oid::regprocedure::text AS signature,
       p.prosecdef, p.proconfig
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'pgqueue';
SELECT signature, prosecdef, proconfig FROM api ORDER BY name;
SELECT name,
       has_function_privilege('public', oid, 'EXECUTE') AS public,
       has_function_privilege('pgqueue_producer', oid, 'EXECUTE') AS producer,
       has_function_privilege('pgqueue_consumer', oid, 'EXECUTE') AS consumer,
       has_function_privilege('pgqueue_admin', oid, 'EXECUTE') AS admin
  FROM api ORDER BY name;
-- no ACL entry names PUBLIC (grantee 0)
SELECT count(*) AS public_grants
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid IN (SELECT oid FROM api) AND a.grantee = 0;
-- the schema and the tables: only pgqueue_admin, and only to read
SELECT r.rolname,
       has_schema_privilege(r.oid, 'pgqueue', 'USAGE') AS schema_usage,
       has_schema_privilege(r.oid, 'pgqueue', 'CREATE') AS schema_create
  FROM pg_roles r WHERE r.rolname LIKE 'pgqueue\_%' ORDER BY 1;
SELECT has_schema_privilege('public', 'pgqueue', 'USAGE') AS public_usage;
SELECT c.relname, r.rolname,
       has_table_privilege(r.oid, c.oid, 'SELECT') AS sel,
       has_table_privilege(r.oid, c.oid, 'INSERT') AS ins,
       has_table_privilege(r.oid, c.oid, 'UPDATE') AS upd,
       has_table_privilege(r.oid, c.oid, 'DELETE') AS del,
       has_table_privilege(r.oid, c.oid, 'TRUNCATE') AS trunc
  FROM pg_class c, pg_roles r
 WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind IN ('r', 'p', 'v')
   AND r.rolname LIKE 'pgqueue\_%'
 ORDER BY 1, 2;
SELECT count(*) AS public_table_grants
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'pgqueue'::regnamespace AND a.grantee = 0;
-- the roles cannot log in
SELECT rolname, rolcanlogin, rolsuper FROM pg_roles WHERE rolname LIKE 'pgqueue\_%' ORDER BY 1;
-- pgqueue_admin is a member of both other roles
SELECT pg_has_role('pgqueue_admin', 'pgqueue_producer', 'MEMBER') AS admin_produces,
       pg_has_role('pgqueue_admin', 'pgqueue_consumer', 'MEMBER') AS admin_consumes,
       pg_has_role('pgqueue_producer', 'pgqueue_consumer', 'MEMBER') AS producer_consumes,
       pg_has_role('pgqueue_consumer', 'pgqueue_producer', 'MEMBER') AS consumer_produces;

--
-- Roles of the test
--
CREATE ROLE regress_nobody;
CREATE ROLE regress_producer IN ROLE pgqueue_producer;
CREATE ROLE regress_consumer IN ROLE pgqueue_consumer;
CREATE ROLE regress_admin IN ROLE pgqueue_admin;

-- a job to work on, and one in the claim of "w0"
SELECT pgq_push('sec', '{"n": 0}') AS id0 \gset
SELECT pgq_schedule();
SELECT count(*) AS claimed FROM pgq_claim('w0', lease => '1 hour');

CREATE TEMP TABLE calls (n serial, stmt text);
INSERT INTO calls (stmt) VALUES
  ($$SELECT pgq_push('sec', '{"n": 1}') IS NOT NULL$$),
  ($$SELECT count(*) FROM pgq_push_batch('sec', ARRAY['{"n": 2}']::jsonb[])$$),
  ($$SELECT pgq_schedule()$$),
  ($$SELECT count(*) FROM pgq_claim('w1')$$),
  ($$SELECT pgq_extend('$$ || :'id0' || $$', 'w1')$$),
  ($$SELECT pgq_ack('$$ || :'id0' || $$', 'w1')$$),
  ($$SELECT pgq_ack_batch(ARRAY['$$ || :'id0' || $$']::uuid[], 'w1')$$),
  ($$SELECT pgq_nack('$$ || :'id0' || $$', 'w1')$$),
  ($$SELECT pgq_release('w1')$$),
  ($$SELECT pgq_configure('sec', weight => 2)$$),
  ($$SELECT count(*) FROM pgq_stats()$$),
  ($$SELECT count(*) FROM pgq_counters()$$),
  ($$SELECT count(*) FROM pgqueue.queue$$),
  ($$SELECT count(*) FROM pgqueue.work_queue$$),
  ($$SELECT count(*) FROM pgqueue.queues$$),
  ($$INSERT INTO pgqueue.queue (id, queue) VALUES (gen_random_uuid(), 'sneaky') RETURNING queue$$),
  ($$UPDATE pgqueue.work_queue SET lock_key = 'me' RETURNING lock_key$$),
  ($$DELETE FROM pgqueue.queue RETURNING queue$$),
  -- 1.1
  ($$SELECT pgq_retry(gen_random_uuid())$$),
  ($$SELECT pgq_retry_failed('sec')$$),
  ($$SELECT pgq_cancel(gen_random_uuid())$$),
  ($$SELECT pgq_purge('sec-none')$$),
  ($$SELECT pgq_push_periodic('sec-periodic', 'p', '1 day') IS NOT NULL$$),
  ($$SELECT count(*) FROM pgqueue.jobs$$),
  ($$SELECT count(*) FROM pgqueue.archive$$),
  ($$SELECT count(*) FROM pgqueue.periodic$$),
  ($$DELETE FROM pgqueue.archive RETURNING queue$$);
GRANT SELECT ON calls TO PUBLIC;

-- a role with no grants: permission denied (42501) for every function and
-- table
SET ROLE regress_nobody;
SELECT n, pg_temp.try(stmt) AS result FROM calls ORDER BY n;
RESET ROLE;

-- a producer pushes, and nothing else
SET ROLE regress_producer;
SELECT n, pg_temp.try(stmt) AS result FROM calls ORDER BY n;
RESET ROLE;

-- a consumer claims, extends, acks, nacks and releases, and cannot push
SET ROLE regress_consumer;
SELECT n, pg_temp.try(stmt) AS result FROM calls ORDER BY n;
RESET ROLE;

-- an admin can do everything through the API, and read the tables, but
-- not write them
SET ROLE regress_admin;
SELECT n, pg_temp.try(stmt) AS result FROM calls ORDER BY n;
RESET ROLE;

-- the consumer works on what the producer pushed and the admin scheduled
SET ROLE regress_producer;
SELECT pgq_push('sec', '{"n": "from producer"}') IS NOT NULL AS pushed;
SET ROLE regress_admin;
SELECT pgq_schedule();
SET ROLE regress_consumer;
SELECT c.payload, c.tries, pgq_ack(c.id, 'consumer-1') AS acked
  FROM pgq_claim('consumer-1', 10, '1 hour') c ORDER BY c.payload::text COLLATE "C", c.tries;
RESET ROLE;
-- after all this: only the job w0 holds is left
SELECT payload, state, tries, last_error FROM pgqueue.jobs ORDER BY id;
SELECT * FROM pgqueue.queues;

--
-- Hostile objects on the caller's search_path cannot hijack the functions
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
CREATE SCHEMA regress_evil;
GRANT USAGE ON SCHEMA regress_evil TO PUBLIC;
CREATE FUNCTION regress_evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: now()';
    RETURN '1999-01-01 00:00:00+00';
END $$;
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: public.now()';
    RETURN '1999-01-01 00:00:00+00';
END $$;
CREATE FUNCTION regress_evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: clock_timestamp()';
    RETURN '2999-01-01 00:00:00+00';
END $$;
CREATE FUNCTION regress_evil.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: text = text';
    RETURN true;
END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_evil.text_eq);
CREATE FUNCTION regress_evil.uuid_eq(uuid, uuid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: uuid = uuid';
    RETURN true;
END $$;
CREATE OPERATOR regress_evil.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = regress_evil.uuid_eq);
CREATE FUNCTION regress_evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: unnest()';
END $$;
-- the operators and functions of the steal statement, which the per-job
-- calls run without SET clauses (the C code applies search_path itself)
CREATE FUNCTION regress_evil.ts_cmp(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: timestamptz comparison';
    RETURN true;
END $$;
CREATE OPERATOR regress_evil.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = regress_evil.ts_cmp);
CREATE OPERATOR regress_evil.>= (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = regress_evil.ts_cmp);
CREATE FUNCTION regress_evil.format(text, text, integer, integer) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'hijacked: format()';
    RETURN 'hijacked';
END $$;
CREATE TABLE regress_evil.queue (LIKE pgqueue.queue);
CREATE TABLE regress_evil.work_queue (LIKE pgqueue.work_queue);
CREATE TABLE regress_evil.queues (LIKE pgqueue.queues);
GRANT ALL ON ALL TABLES IN SCHEMA regress_evil TO PUBLIC;
-- a new session, so that pgqueue prepares its statements among the traps
\c -
-- temp tables named like the extension's, made by the consumer itself
SET ROLE regress_consumer;
CREATE TEMP TABLE queue (LIKE regress_evil.queue);
CREATE TEMP TABLE work_queue (LIKE regress_evil.work_queue);
RESET ROLE;

-- the traps work for ordinary SQL...
SET search_path = regress_evil, public, pg_catalog;
SELECT now() = '1999-01-01 00:00:00+00' AS trapped_now;
SELECT 'a'::text = 'b'::text AS trapped_eq;
RESET search_path;
SET search_path = public, pg_catalog;
SELECT now() = '1999-01-01 00:00:00+00' AS trapped_public_now;
RESET search_path;

-- ...but not inside pgqueue's functions, whoever calls them
SET ROLE regress_admin;
SET search_path = regress_evil, public, pg_catalog;
SELECT pgq_push('evil', '{"n": 1}', dedup_key => 'k') AS e1 \gset
SELECT pgq_push('evil', '{"n": 2}', dedup_key => 'other key') <> :'e1' AS different_key_new_job;
SELECT pgq_push('evil', '{"n": 5}', dedup_key => 'k') <> :'e1' AS same_key_new_job;
SELECT count(*) AS pushed FROM pgq_push_batch('evil', ARRAY['{"n": 3}', '{"n": 4}']::jsonb[]);
SELECT pgq_configure('evil', max_tries => 1);
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w1', 1, '1 hour');
-- a wrong key or id would match if "=" were hijacked
SELECT pgq_extend(:'e1', 'not w1') IS NULL AS extend_refused;
SELECT pgq_ack(:'e1', 'not w1') AS ack_refused;
SELECT pgq_ack('00000000-0000-7000-8000-000000000000', 'w1') AS ack_unknown_id;
SELECT pgq_ack_batch(ARRAY['00000000-0000-7000-8000-000000000000']::uuid[], 'w1') AS ack_batch_unknown;
SELECT pgq_nack(:'e1', 'not w1') IS NULL AS nack_refused;
SELECT pgq_release('not w1') AS release_refused;
SELECT queue, pending, scheduled, in_flight, failed FROM pgq_stats();
SELECT count(*) AS claimed FROM pgq_claim('w2', 10, '1 hour', '{evil}');
SELECT pgq_ack(:'e1', 'w1') AS ack_by_holder;
SELECT count(*) AS rows FROM pgq_counters();
-- a steal: the lease of w3 runs out on its only try; w4's claim fails that
-- job and takes nothing else (the live leases of w2 are not expired)
SELECT pgq_configure('evil2', max_tries => 1);
SELECT pgq_push('evil2', '{"n": 6}') AS e6 \gset
SELECT pgq_schedule();
SELECT payload FROM pgq_claim('w3', 1, '1 millisecond', '{evil2}');
SELECT pg_catalog.pg_sleep(0.01);
SELECT count(*) AS claimed FROM pgq_claim('w4', 10, '1 hour');
RESET search_path;
RESET ROLE;
SELECT state, last_error FROM pgqueue.queue WHERE id = :'e6';
-- the jobs are in pgqueue's tables with real timestamps, none in the traps
SELECT j.payload, j.state, j.tries, q.dedup_key,
       j.created BETWEEN pg_catalog.now() - interval '1 hour' AND pg_catalog.now() AS real_created,
       j.run_after BETWEEN pg_catalog.now() - interval '1 hour' AND pg_catalog.now() AS real_run_after
  FROM pgqueue.jobs j JOIN pgqueue.queue q USING (id) ORDER BY id;
SELECT lock_key, lock_timeout > pg_catalog.now() AND lock_timeout < pg_catalog.now() + interval '2 hours' AS real_lease
  FROM pgqueue.work_queue ORDER BY batch_order;
SELECT (SELECT count(*) FROM regress_evil.queue) AS evil_queue,
       (SELECT count(*) FROM regress_evil.work_queue) AS evil_work_queue,
       (SELECT count(*) FROM regress_evil.queues) AS evil_queues;
SET ROLE regress_consumer;
SELECT (SELECT count(*) FROM pg_temp.queue) AS temp_queue,
       (SELECT count(*) FROM pg_temp.work_queue) AS temp_work_queue;
DROP TABLE pg_temp.queue, pg_temp.work_queue;
RESET ROLE;
DROP SCHEMA regress_evil CASCADE;
DROP FUNCTION public.now();

--
-- Values that look like SQL are data: stored verbatim, harmless
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
CREATE TEMP TABLE nasty (n int, s text);
INSERT INTO nasty VALUES
  (1, $$x'); DROP TABLE pgqueue.queue; --$$),
  (2, $$'; DELETE FROM pgqueue.work_queue; --$$),
  (3, $$" OR "1"="1$$),
  (4, $$' OR '1'='1$$),
  (5, $$back\slash\\ and \'quote$$),
  (6, E'tab\there, newline\nthere'),
  (7, $$$1 %s %I %L $$),
  (8, 'очередь 队列 🚀 ü'),
  (9, $$%$$),
  (10, $$_$$),
  (11, $$Robert'); DROP TABLE students;--$$),
  (12, $${"a": 1}$$);
-- as queue names, with payloads, dedup keys and lock keys made of them
SELECT n, pgq_push(s, jsonb_build_object('s', s, 'n', n), dedup_key => s) IS NOT NULL AS pushed
  FROM nasty ORDER BY n;
-- the same again: the dedup keys match exactly, nothing new
SELECT count(*) FILTER (WHERE pgq_push(s, '{}', dedup_key => s) = q.id) AS same_id
  FROM nasty JOIN pgqueue.queue q ON q.queue = nasty.s;
SELECT count(*) AS jobs FROM pgqueue.queue;
-- stored exactly as given
SELECT count(*) FILTER (WHERE q.queue = s AND q.dedup_key = s AND q.payload->>'s' = s) AS verbatim
  FROM nasty JOIN pgqueue.queue q ON (q.payload->>'n')::int = nasty.n;
SELECT n, octet_length(s) = octet_length(q.queue) AS same_bytes
  FROM nasty JOIN pgqueue.queue q ON (q.payload->>'n')::int = nasty.n ORDER BY n;
SELECT count(*) AS configured FROM nasty, pgq_configure(s, max_tries => 1);
SELECT count(*) AS queues FROM pgqueue.queues q JOIN nasty ON q.queue = nasty.s;
SELECT pgq_schedule();
-- each queue name as a claim filter and as a lock key finds just its job
SELECT n, (SELECT string_agg(c.payload->>'n', ',') FROM pgq_claim(s, 10, '1 hour', ARRAY[s]) c) AS claimed
  FROM nasty ORDER BY n;
SELECT count(*) FILTER (WHERE w.lock_key = q.queue) AS keyed_by_own_name
  FROM pgqueue.work_queue w JOIN pgqueue.queue q USING (id);
-- nack with the text as the error (failed: max_tries 1), or release it
SELECT n, pgq_nack(q.id, s, s) FROM nasty JOIN pgqueue.queue q ON q.queue = s
 WHERE n % 2 = 0 ORDER BY n;
SELECT n, pgq_release(s) FROM nasty WHERE n % 2 = 1 ORDER BY n;
SELECT n, q.state,
       CASE WHEN n % 2 = 0 THEN q.last_error = s
            ELSE q.last_error = 'released by ' || s || ' on try 1 of 1' END AS error_verbatim
  FROM nasty JOIN pgqueue.queue q ON q.queue = s ORDER BY n;
SELECT queue = (SELECT s FROM nasty WHERE n = 8) AS unicode_name, failed
  FROM pgq_stats() WHERE queue LIKE 'очередь%';
-- nothing was dropped or deleted
SELECT to_regclass('pgqueue.queue') IS NOT NULL AS queue_exists,
       to_regclass('pgqueue.work_queue') IS NOT NULL AS work_queue_exists,
       (SELECT count(*) FROM pgqueue.queue) AS jobs,
       (SELECT count(*) FROM pgqueue.queues) AS settings;

TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
DROP ROLE regress_nobody, regress_producer, regress_consumer, regress_admin;
