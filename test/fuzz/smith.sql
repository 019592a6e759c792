-- For sqlsmith's database (test/fuzz/run.sh), after seed.sql.  sqlsmith
-- calls functions it finds in pg_proc, but not set-returning ones, and picks
-- among ~3,000 functions: pgqueue's 13 scalar ones would come up in about 1
-- query of 100.  These SQL wrappers, several of each, pass sqlsmith's
-- arguments (NULLs, column values of pgqueue's own tables, constants)
-- straight to every pgqueue function, set-returning ones included, so that
-- a large share of its queries reach pgqueue's C code.
\set ON_ERROR_STOP 1
DO $$
DECLARE
    i int;
BEGIN
    FOR i IN 1..20 LOOP
        EXECUTE format($f$
CREATE FUNCTION fz_push_%1$s(q text, p jsonb, ra timestamptz, pr int, dk text) RETURNS uuid
  LANGUAGE sql AS 'SELECT pgq_push(q, p, ra, pr, dk)';
CREATE FUNCTION fz_push_batch_%1$s(q text, ps jsonb[], ra timestamptz, pr int) RETURNS bigint
  LANGUAGE sql AS 'SELECT count(*) FROM pgq_push_batch(q, ps, ra, pr)';
CREATE FUNCTION fz_claim_%1$s(k text, n int, lease interval, qs text[], w interval) RETURNS bigint
  LANGUAGE sql AS 'SELECT count(*) FROM pgq_claim(k, n, lease, qs, least(w, interval ''10 milliseconds''))';
CREATE FUNCTION fz_claim_ids_%1$s(k text, n int) RETURNS uuid[]
  LANGUAGE sql AS 'SELECT array_agg(id) FROM pgq_claim(k, n, interval ''2 seconds'')';
CREATE FUNCTION fz_extend_%1$s(id uuid, k text, lease interval) RETURNS timestamptz
  LANGUAGE sql AS 'SELECT pgq_extend(id, k, lease)';
CREATE FUNCTION fz_ack_%1$s(id uuid, k text) RETURNS boolean
  LANGUAGE sql AS 'SELECT pgq_ack(id, k)';
CREATE FUNCTION fz_ack_batch_%1$s(ids uuid[], k text) RETURNS int
  LANGUAGE sql AS 'SELECT pgq_ack_batch(ids, k)';
CREATE FUNCTION fz_nack_%1$s(id uuid, k text, e text, r interval) RETURNS text
  LANGUAGE sql AS 'SELECT pgq_nack(id, k, e, r)';
CREATE FUNCTION fz_release_%1$s(k text) RETURNS int
  LANGUAGE sql AS 'SELECT pgq_release(k)';
CREATE FUNCTION fz_configure_%1$s(q text, w int, m int, t int, p boolean, r interval) RETURNS void
  LANGUAGE sql AS 'SELECT pgq_configure(q, w, m, t, p, r)';
CREATE FUNCTION fz_schedule_%1$s(n int) RETURNS int
  LANGUAGE sql AS 'SELECT pgq_schedule(n)';
CREATE FUNCTION fz_stats_%1$s() RETURNS jsonb
  LANGUAGE sql AS 'SELECT jsonb_agg(s) FROM pgq_stats() s';
CREATE FUNCTION fz_counters_%1$s() RETURNS jsonb
  LANGUAGE sql AS 'SELECT to_jsonb(c) FROM pgq_counters() c';
CREATE FUNCTION fz_retry_%1$s(id uuid) RETURNS boolean
  LANGUAGE sql AS 'SELECT pgq_retry(id)';
CREATE FUNCTION fz_retry_failed_%1$s(q text) RETURNS bigint
  LANGUAGE sql AS 'SELECT pgq_retry_failed(q)';
CREATE FUNCTION fz_cancel_%1$s(id uuid) RETURNS boolean
  LANGUAGE sql AS 'SELECT pgq_cancel(id)';
CREATE FUNCTION fz_purge_%1$s(q text, s text) RETURNS bigint
  LANGUAGE sql AS 'SELECT pgq_purge(q, s)';
CREATE FUNCTION fz_push_periodic_%1$s(q text, n text, p interval, pl jsonb, pr int) RETURNS uuid
  LANGUAGE sql AS 'SELECT pgq_push_periodic(q, n, p, pl, pr)';
$f$, i);
    END LOOP;
END
$$;
-- views whose every read calls pgqueue (the set-returning functions too)
CREATE VIEW fz_claimed AS SELECT * FROM pgq_claim('smith-view', 2, '1 second');
CREATE VIEW fz_stats AS SELECT * FROM pgq_stats();
CREATE VIEW fz_counters AS SELECT * FROM pgq_counters();
CREATE VIEW fz_held AS SELECT id, lock_key, queue FROM pgqueue.work_queue WHERE lock_key IS NOT NULL;
