-- A pgqueue worker in psql alone: a PL/pgSQL loop that claims, works and
-- acks, committing after each step (a DO block may COMMIT when psql is not
-- inside a transaction block).
--
--   psql "host=/var/run/postgresql dbname=app user=job_runner" \
--        -v queue=emails -f examples/psql_worker.sql
--
-- Variables: queue (default emails); wait, seconds a claim blocks (default
-- 5); max_idle, stop after that many empty claims in a row (default 0:
-- never; stop it with Ctrl-C).  The work here is a NOTICE per job; a job
-- whose payload has "fail" raises instead, is nacked with the message, and is
-- retried with backoff until it is out of tries.  Connect straight to the
-- server: through PgBouncer's transaction pooling the settings below (which
-- the loop reads back) may land on another server connection.
\set ON_ERROR_STOP on
\if :{?queue}
\else
\set queue emails
\endif
\if :{?wait}
\else
\set wait 5
\endif
\if :{?max_idle}
\else
\set max_idle 0
\endif

SELECT set_config('pgq_example.queue', :'queue', false) AS queue,
       set_config('pgq_example.wait', :'wait', false) AS wait,
       set_config('pgq_example.max_idle', :'max_idle', false) AS max_idle,
       set_config('pgq_example.lock_key', 'psql:' || pg_backend_pid(), false) AS lock_key;

DO $worker$
DECLARE
    q        text := current_setting('pgq_example.queue');
    key      text := current_setting('pgq_example.lock_key');
    wait     interval := make_interval(secs => current_setting('pgq_example.wait')::float8);
    max_idle int := current_setting('pgq_example.max_idle')::int;
    idle     int := 0;
    j        record;
BEGIN
    LOOP
        SELECT * INTO j FROM pgq_claim(key, 1, '30 seconds', ARRAY[q], wait);
        COMMIT;                                   -- the claim stands on its own
        IF j.id IS NULL THEN
            idle := idle + 1;
            EXIT WHEN max_idle > 0 AND idle >= max_idle;
            CONTINUE;
        END IF;
        idle := 0;
        BEGIN
            -- the work; it commits together with its ack
            IF j.payload ? 'fail' THEN
                RAISE EXCEPTION 'asked to fail: %', j.payload->>'fail';
            END IF;
            RAISE NOTICE 'job % done (try %): %', j.id, j.tries, j.payload;
            PERFORM pgq_ack(j.id, key);
        EXCEPTION WHEN OTHERS THEN                -- the work rolled back: give the job back
            PERFORM pgq_nack(j.id, key, SQLSTATE || ': ' || SQLERRM);
            RAISE NOTICE 'job % failed (try %): %', j.id, j.tries, SQLERRM;
        END;
        COMMIT;
    END LOOP;
END
$worker$;
