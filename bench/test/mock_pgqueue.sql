-- NOT pgqueue.  A small plpgsql stand-in with pgqueue's SQL API (DESIGN.md),
-- used only by `bash bench/run.sh --mock-pgqueue` to exercise the sys4
-- scripts and the harness when the real extension is not installed.  Its
-- scheduler is a 1-second polling loop (no wake-up on push) and its figures
-- say nothing about pgqueue.  Loaded into the bench database's public schema.
CREATE SCHEMA pgqueue;
CREATE TYPE pgqueue.job_state AS ENUM ('pending', 'retry', 'scheduled', 'failed');

CREATE TABLE pgqueue.queue (
    id        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq       bigserial,                  -- stands in for the time-ordered uuid
    created   timestamptz NOT NULL DEFAULT clock_timestamp(),
    version   int NOT NULL DEFAULT 0,
    queue     text NOT NULL,
    state     pgqueue.job_state NOT NULL DEFAULT 'pending',
    tries     int NOT NULL DEFAULT 0,
    priority  int NOT NULL DEFAULT 0,
    run_after timestamptz NOT NULL DEFAULT now(),
    payload   jsonb NOT NULL DEFAULT '{}',
    dedup_key text,
    last_error text
);
CREATE INDEX ON pgqueue.queue (seq) WHERE state IN ('pending', 'retry');

CREATE TABLE pgqueue.work_queue (
    id           uuid PRIMARY KEY REFERENCES pgqueue.queue (id) ON DELETE CASCADE,
    queue        text NOT NULL,
    created      timestamptz NOT NULL DEFAULT clock_timestamp(),
    version      int NOT NULL DEFAULT 0,
    batch_order  int NOT NULL DEFAULT 0,
    started      timestamptz,
    lock_key     text,
    lock_timeout timestamptz
);
CREATE INDEX ON pgqueue.work_queue (created, batch_order);

CREATE FUNCTION pgq_push(queue text, payload jsonb DEFAULT '{}',
                         run_after timestamptz DEFAULT NULL,
                         priority int DEFAULT 0, dedup_key text DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO pgqueue.queue (queue, payload, run_after, priority, dedup_key)
    VALUES ($1, $2, coalesce($3, now()), $4, $5)
    RETURNING id
$$;

CREATE FUNCTION pgq_push_batch(queue text, payloads jsonb[],
                               run_after timestamptz DEFAULT NULL,
                               priority int DEFAULT 0)
RETURNS SETOF uuid LANGUAGE sql AS $$
    INSERT INTO pgqueue.queue (queue, payload, run_after, priority)
    SELECT $1, p, coalesce($3, now()), $4 FROM unnest($2) AS p
    RETURNING id
$$;

CREATE FUNCTION pgq_schedule(max_items int DEFAULT 100)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    moved int;
BEGIN
    WITH marked AS (
        UPDATE pgqueue.queue q SET state = 'scheduled'
         WHERE q.id = ANY (ARRAY(SELECT x.id FROM pgqueue.queue x
                                  WHERE x.state IN ('pending', 'retry')
                                    AND x.run_after <= clock_timestamp()
                                  ORDER BY x.seq LIMIT max_items
                                  FOR UPDATE SKIP LOCKED))
        RETURNING q.id, q.queue, q.version, q.seq)
    INSERT INTO pgqueue.work_queue (id, queue, version, batch_order)
    SELECT m.id, m.queue, m.version, row_number() OVER (ORDER BY m.seq) FROM marked m;
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END $$;

CREATE FUNCTION pgq_claim(lock_key text, max_items int DEFAULT 1,
                          lease interval DEFAULT '30 seconds',
                          queues text[] DEFAULT NULL,
                          wait interval DEFAULT '0')
RETURNS TABLE (id uuid, queue text, payload jsonb, tries int, version int,
               lock_timeout timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    deadline timestamptz := clock_timestamp() + wait;
    k text := lock_key;
    l interval := lease;
    n int := max_items;
    qs text[] := queues;
BEGIN
    LOOP
        RETURN QUERY
        WITH c AS (
            UPDATE pgqueue.work_queue w
               SET lock_key = k, started = clock_timestamp(),
                   lock_timeout = clock_timestamp() + l, version = w.version + 1
             WHERE w.id = ANY (ARRAY(SELECT x.id FROM pgqueue.work_queue x
                             WHERE (x.lock_timeout IS NULL OR x.lock_timeout < clock_timestamp())
                               AND (qs IS NULL OR x.queue = ANY (qs))
                             ORDER BY x.created, x.batch_order
                             LIMIT n FOR UPDATE SKIP LOCKED))
            RETURNING w.id, w.version, w.lock_timeout),
        u AS (
            UPDATE pgqueue.queue q SET tries = q.tries + 1, version = c.version
              FROM c WHERE q.id = c.id
            RETURNING q.id, q.queue, q.payload, q.tries)
        SELECT u.id, u.queue, u.payload, u.tries, c.version, c.lock_timeout
          FROM u JOIN c ON c.id = u.id;
        IF FOUND OR clock_timestamp() >= deadline THEN
            RETURN;
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
END $$;

CREATE FUNCTION pgq_ack(id uuid, lock_key text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgqueue.queue q
     WHERE q.id = $1
       AND EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = $1 AND w.lock_key = $2);
    RETURN FOUND;
END $$;

CREATE FUNCTION pgq_ack_batch(ids uuid[], lock_key text)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    DELETE FROM pgqueue.queue q
     WHERE q.id = ANY ($1)
       AND EXISTS (SELECT 1 FROM pgqueue.work_queue w WHERE w.id = q.id AND w.lock_key = $2);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION pgq_stats()
RETURNS TABLE (queue text, pending bigint, retry bigint, scheduled bigint,
               in_flight bigint, failed bigint, oldest_ready timestamptz)
LANGUAGE sql AS $$
    SELECT q.queue,
           count(*) FILTER (WHERE q.state = 'pending'),
           count(*) FILTER (WHERE q.state = 'retry'),
           count(*) FILTER (WHERE q.state = 'scheduled'
                              AND (w.lock_timeout IS NULL OR w.lock_timeout < clock_timestamp())),
           count(*) FILTER (WHERE q.state = 'scheduled' AND w.lock_timeout >= clock_timestamp()),
           count(*) FILTER (WHERE q.state = 'failed'),
           min(q.created) FILTER (WHERE q.state IN ('pending', 'retry'))
      FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w ON w.id = q.id
     GROUP BY q.queue
$$;

-- The stand-in for the background worker: run by the harness in the
-- background, cancelled at the end of each run.
CREATE PROCEDURE pgqueue.mock_scheduler_loop(max_items int DEFAULT 100, naptime float8 DEFAULT 1.0)
LANGUAGE plpgsql AS $$
DECLARE
    moved int;
BEGIN
    LOOP
        moved := public.pgq_schedule(max_items);
        COMMIT;
        IF moved < max_items THEN
            PERFORM pg_sleep(naptime);
            COMMIT;     -- so that the next pass runs in a fresh transaction (now())
        END IF;
    END LOOP;
END $$;
