-- sys3: the "seed" two-table design written by hand in SQL/plpgsql.
--   queue       every unfinished job; producers insert here ('pending').
--   work_queue  what the scheduler released to workers, one row per job.
-- A scheduler loop (CALL sys3.scheduler_loop(), run in the background by the
-- harness) moves up to 100 ready jobs per pass from queue to work_queue with
-- FOR UPDATE SKIP LOCKED, polls again at once when the pass was full and
-- otherwise sleeps 1 second.  Consumers claim from work_queue under a lease
-- (transaction 1) and ack by deleting the job from both tables (transaction
-- 2: the delete from queue cascades to work_queue).
-- Objects are schema-qualified because a procedure that COMMITs cannot have
-- its own SET search_path.
CREATE SCHEMA IF NOT EXISTS sys3;

CREATE TABLE sys3.queue (
    id          bigserial PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    state       text NOT NULL DEFAULT 'pending',      -- pending | scheduled
    run_after   timestamptz NOT NULL DEFAULT now(),
    payload     jsonb
);
-- What the scheduler looks for: ready jobs, oldest first.
CREATE INDEX queue_pending_idx ON sys3.queue (id) WHERE state = 'pending';

CREATE TABLE sys3.work_queue (
    id          bigint PRIMARY KEY REFERENCES sys3.queue (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),   -- when scheduled
    started_at  timestamptz,
    lease_until timestamptz
) WITH (fillfactor = 90);

-- One scheduling pass: returns how many jobs it moved.  clock_timestamp(),
-- not now(): inside the looping procedure a transaction starts at the
-- previous COMMIT, so its now() can lag behind the jobs' run_after.
CREATE FUNCTION sys3.schedule_pass(max_items int DEFAULT 100) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    moved int;
BEGIN
    WITH marked AS (
        UPDATE sys3.queue q SET state = 'scheduled'
         WHERE q.id = ANY (ARRAY(SELECT id FROM sys3.queue
                                  WHERE state = 'pending' AND run_after <= clock_timestamp()
                                  ORDER BY id
                                  LIMIT max_items
                                  FOR UPDATE SKIP LOCKED))
        RETURNING q.id)
    INSERT INTO sys3.work_queue (id) SELECT id FROM marked ORDER BY id;
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END $$;

-- The polling scheduler: runs until cancelled.
CREATE PROCEDURE sys3.scheduler_loop(max_items int DEFAULT 100, naptime float8 DEFAULT 1.0)
LANGUAGE plpgsql AS $$
DECLARE
    moved int;
BEGIN
    LOOP
        moved := sys3.schedule_pass(max_items);
        COMMIT;
        IF moved < max_items THEN
            PERFORM pg_sleep(naptime);
            COMMIT;     -- so that the next pass runs in a fresh transaction (now())
        END IF;
    END LOOP;
END $$;
