-- sys5: sys1's single-table lease queue on rotating partitions: an
-- EXPERIMENT for the held-back-VACUUM workload (f), not a system users run.  It measures, with
-- the simplest queue that has the mechanics, whether rotating and
-- truncating partitions (as PgQ does its event tables) keeps a queue's dead
-- tuples and size small, and its claims fast, while a REPEATABLE READ
-- snapshot holds VACUUM back.  See bench/ROTATION.md.
--
--   jobs       partitioned by LIST (slot); each partition (jobs_<slot>) is
--              one slot of a ring.  Producers insert into the current slot
--              (a column default reads it from ring).
--   ring       one row per slot: 'current' (takes new jobs; claims visit
--              it), 'draining' (no longer takes new jobs; claims still
--              visit it), 'drained' (seen empty: claims skip it; waiting for
--              its TRUNCATE), 'free' (truncated, empty: may become current).
--
-- A rotator (CALL sys5.rotator_loop(), run in the background by the
-- harness as sys3's scheduler is) makes a new slot current every
-- jobs_per_slot ids, marks draining slots drained once they hold no row,
-- and truncates drained slots.  Its TRUNCATE waits at most 20 ms for its
-- lock: a slot that the holder locked (its SELECT count(*) FROM sys5.jobs
-- locks every partition that existed then) stays 'drained' until the hold
-- ends, and the ring grows by new partitions (CREATE TABLE + ATTACH
-- PARTITION, which takes only SHARE UPDATE EXCLUSIVE on the parent and so
-- does not wait for the holder) instead of reusing it.
--
-- Claims run through sys5.claim(): one statement per slot visited, naming
-- the partition, so that a claim locks only the slots it visits (a prepared
-- statement on the parent gets a generic plan, which locks every partition
-- when it starts: a TRUNCATE would then wait behind every claim, and every
-- claim behind a TRUNCATE that waits).  Acks (sys5.ack) name the partition
-- too.
--
-- Objects are schema-qualified because a procedure that COMMITs cannot have
-- its own SET search_path.
CREATE SCHEMA IF NOT EXISTS sys5;

CREATE TABLE sys5.ring (
    slot     int PRIMARY KEY,
    state    text NOT NULL CHECK (state IN ('current', 'draining', 'drained', 'free')),
    first_id bigint NOT NULL DEFAULT 0     -- the next id when the slot became current
);

CREATE FUNCTION sys5.current_slot() RETURNS int
LANGUAGE sql STABLE AS $$ SELECT slot FROM sys5.ring WHERE state = 'current' $$;

CREATE SEQUENCE sys5.jobs_id_seq;
CREATE TABLE sys5.jobs (
    slot        int NOT NULL DEFAULT sys5.current_slot(),
    id          bigint NOT NULL DEFAULT nextval('sys5.jobs_id_seq'),
    created_at  timestamptz DEFAULT now(),
    payload     jsonb,
    started_at  timestamptz,
    lease_until timestamptz,
    PRIMARY KEY (id, slot)
) PARTITION BY LIST (slot);

-- A new slot: a table of its own, then attached.  CREATE TABLE ... PARTITION
-- OF would take ACCESS EXCLUSIVE on the parent (and so wait for the holder
-- and stop every producer and consumer behind it); ATTACH takes SHARE
-- UPDATE EXCLUSIVE.  fillfactor 90 as sys1's.
CREATE FUNCTION sys5.add_slot() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    s int := coalesce((SELECT max(slot) + 1 FROM sys5.ring), 0);
BEGIN
    EXECUTE format('CREATE TABLE sys5.%I (LIKE sys5.jobs INCLUDING DEFAULTS) WITH (fillfactor = 90)',
                   'jobs_' || s);
    EXECUTE format('ALTER TABLE sys5.jobs ATTACH PARTITION sys5.%I FOR VALUES IN (%s)',
                   'jobs_' || s, s);
    INSERT INTO sys5.ring (slot, state) VALUES (s, 'free');
    IF to_regprocedure('sys5.regen()') IS NOT NULL THEN
        PERFORM sys5.regen();
    END IF;
    RETURN s;
END $$;


-- Claims and acks name the partition of the slot they work on, in static
-- statements (plans kept as sys1's are): sys5.regen() writes claim() and
-- ack() anew, with a branch per slot, whenever a slot is added.  Dynamic SQL
-- (EXECUTE format(...)) would plan every call, halving a consumer's speed.
CREATE FUNCTION sys5.regen() RETURNS void
LANGUAGE plpgsql AS $gen$
DECLARE
    claim text := '';
    ack text := '';
    s int;
BEGIN
    FOR s IN SELECT r.slot FROM sys5.ring r ORDER BY r.slot LOOP
        claim := claim || format($f$
        WHEN %2$s THEN RETURN QUERY
            UPDATE sys5.%1$I j SET started_at = now(), lease_until = now() + lease
             WHERE j.id = ANY (ARRAY(SELECT x.id FROM sys5.%1$I x
                                      WHERE x.lease_until IS NULL OR x.lease_until < now()
                                      ORDER BY x.id LIMIT n - got FOR UPDATE SKIP LOCKED))
            RETURNING j.slot, j.id, j.payload;$f$, 'jobs_' || s, s);
        ack := ack || format($f$
        WHEN %2$s THEN DELETE FROM sys5.%1$I j WHERE j.id = job;$f$, 'jobs_' || s, s);
    END LOOP;
    -- Claim up to n jobs under a lease: the oldest slot first, by id within
    -- a slot.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION sys5.claim(lease interval, n int DEFAULT 1)
RETURNS TABLE (slot int, id bigint, payload jsonb)
LANGUAGE plpgsql AS $b$
DECLARE
    s int;
    got int := 0;
    k int;
BEGIN
    FOR s IN SELECT r.slot FROM sys5.ring r WHERE r.state IN ('current', 'draining')
              ORDER BY r.first_id LOOP
        CASE s %s
        END CASE;
        GET DIAGNOSTICS k = ROW_COUNT;
        got := got + k;
        IF got >= n THEN
            RETURN;
        END IF;
    END LOOP;
END $b$$f$, claim);
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION sys5.ack(s int, job bigint) RETURNS void
LANGUAGE plpgsql AS $b$
BEGIN
    CASE s %s
    END CASE;
END $b$$f$, ack);
END $gen$;

SELECT sys5.add_slot() FROM generate_series(1, 3);
SELECT sys5.regen();
UPDATE sys5.ring SET state = 'current' WHERE slot = 0;

-- Empty the system: every slot truncated, slot 0 current.
CREATE FUNCTION sys5.reset() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE sys5.jobs;
    UPDATE sys5.ring SET state = 'free', first_id = 0;
    UPDATE sys5.ring SET state = 'current' WHERE ring.slot = (SELECT min(r.slot) FROM sys5.ring r);
    PERFORM setval('sys5.jobs_id_seq', 1, false);
END $$;

-- The slot that becomes current next: a free slot that nobody holds a lock
-- on (the holder locks the slots that existed when it read the parent:
-- reusing one would leave its rows' dead tuples until the hold ends), else
-- NULL.  The slot stays locked until the caller commits.
CREATE FUNCTION sys5.next_slot() RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    s int;
BEGIN
    FOR s IN SELECT r.slot FROM sys5.ring r WHERE r.state = 'free' ORDER BY r.slot LOOP
        BEGIN
            EXECUTE format('LOCK TABLE sys5.%I IN ACCESS EXCLUSIVE MODE NOWAIT', 'jobs_' || s);
            RETURN s;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
    RETURN NULL;
END $$;

-- One step of the rotator; returns what it did, for the log.
--
-- ring mode (copy = false): every jobs_per_slot ids a new slot becomes
-- current; the old one drains as its jobs are acked (claims visit it, oldest
-- slot first), and is truncated once it is empty.
--
-- copy mode (copy = true): when the current slot's dead tuples (statistics)
-- reach jobs_per_slot and factor times its live rows, its live rows move to a
-- new current slot in one transaction that holds EXCLUSIVE on the old slot
-- (producers and consumers of that slot wait for it; the lock is waited for
-- 50 ms at most, else the move is tried again on the next step); the old
-- slot then holds only dead rows and is truncated when its lock can be had.
-- Live rows are always in one slot, so a claim visits one.
--
-- When no free slot can be had, the step adds one and changes nothing else:
-- the switch to it waits for the next step.  A producer that read the new
-- current slot in the same instant as the ATTACH committed could still have
-- the parent's partitions from before it ("no partition of relation jobs
-- found for row"): ATTACH does not wait for the producers, whose lock on the
-- parent comes before their snapshot.
CREATE FUNCTION sys5.rotate(jobs_per_slot bigint, copy boolean DEFAULT false, factor float8 DEFAULT 1)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    cur record;
    nxt int;
    s int;
    empty boolean;
    did text := '';
    next_id bigint := (SELECT last_value FROM sys5.jobs_id_seq);
    rel regclass;
BEGIN
    SELECT * INTO cur FROM sys5.ring WHERE state = 'current';
    rel := format('sys5.%I', 'jobs_' || cur.slot)::regclass;
    IF NOT copy AND next_id - cur.first_id >= jobs_per_slot THEN
        nxt := sys5.next_slot();
        IF nxt IS NULL THEN
            RETURN 'added ' || sys5.add_slot() || '; ';
        END IF;
        UPDATE sys5.ring SET state = 'draining' WHERE ring.slot = cur.slot;
        UPDATE sys5.ring SET state = 'current', first_id = next_id WHERE ring.slot = nxt;
        did := did || 'current ' || nxt || '; ';
    ELSIF copy AND pg_stat_get_dead_tuples(rel) >= greatest(jobs_per_slot, factor * pg_stat_get_live_tuples(rel)) THEN
        nxt := sys5.next_slot();
        IF nxt IS NULL THEN
            RETURN 'added ' || sys5.add_slot() || '; ';
        END IF;
        PERFORM set_config('lock_timeout', '50ms', true);
        BEGIN
            EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', rel);
        EXCEPTION WHEN lock_not_available THEN
            PERFORM set_config('lock_timeout', '0', true);
            RETURN 'move of ' || cur.slot || ' not locked; ';
        END;
        PERFORM set_config('lock_timeout', '0', true);
        EXECUTE format('INSERT INTO sys5.%I (slot, id, created_at, payload, started_at, lease_until)
                        SELECT %s, id, created_at, payload, started_at, lease_until FROM %s',
                       'jobs_' || nxt, nxt, rel);
        EXECUTE format('DELETE FROM %s', rel);
        UPDATE sys5.ring SET state = 'drained' WHERE ring.slot = cur.slot;
        UPDATE sys5.ring SET state = 'current', first_id = next_id WHERE ring.slot = nxt;
        did := did || 'moved ' || cur.slot || ' to ' || nxt || '; ';
    END IF;
    -- Draining slots that hold no row: claims stop visiting them.
    FOR s IN SELECT r.slot FROM sys5.ring r WHERE r.state = 'draining' LOOP
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM sys5.%I)', 'jobs_' || s) INTO empty;
        IF empty THEN
            UPDATE sys5.ring SET state = 'drained' WHERE ring.slot = s;
            did := did || 'drained ' || s || '; ';
        END IF;
    END LOOP;
    RETURN did;
END $$;

-- TRUNCATE one drained slot, waiting at most 20 ms for its lock; false when
-- the lock was not had or a row had arrived (a producer that read the
-- current slot before it changed): then it is draining again.
CREATE FUNCTION sys5.free_slot(s int) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    empty boolean;
BEGIN
    PERFORM set_config('lock_timeout', '20ms', true);
    BEGIN
        EXECUTE format('LOCK TABLE sys5.%I IN ACCESS EXCLUSIVE MODE', 'jobs_' || s);
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', '0', true);
        RETURN false;
    END;
    PERFORM set_config('lock_timeout', '0', true);
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM sys5.%I)', 'jobs_' || s) INTO empty;
    IF NOT empty THEN
        UPDATE sys5.ring SET state = 'draining' WHERE ring.slot = s;
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE sys5.%I', 'jobs_' || s);
    UPDATE sys5.ring SET state = 'free', first_id = 0 WHERE ring.slot = s;
    RETURN true;
END $$;

-- The rotator: runs until cancelled, a step every naptime seconds, each
-- step and each TRUNCATE in a transaction of its own.
CREATE PROCEDURE sys5.rotator_loop(jobs_per_slot bigint DEFAULT 5000, naptime float8 DEFAULT 0.1,
                                   copy boolean DEFAULT false, factor float8 DEFAULT 1)
LANGUAGE plpgsql AS $$
DECLARE
    s int;
BEGIN
    LOOP
        PERFORM sys5.rotate(jobs_per_slot, copy, factor);
        COMMIT;
        FOR s IN SELECT r.slot FROM sys5.ring r WHERE r.state = 'drained' ORDER BY r.slot LOOP
            PERFORM sys5.free_slot(s);
            COMMIT;
        END LOOP;
        PERFORM pg_sleep(naptime);
        COMMIT;
    END LOOP;
END $$;
