-- sys2: the same single table as sys1, but a claim deletes the job in the
-- same transaction (claim-and-delete: a worker that dies loses its job).
-- The lease columns stay, unused, so that the table is the same as sys1's.
-- Run with search_path = sys2.
CREATE SCHEMA IF NOT EXISTS sys2;
CREATE TABLE sys2.jobs (
    id          bigserial PRIMARY KEY,
    created_at  timestamptz DEFAULT now(),
    payload     jsonb,
    started_at  timestamptz,
    lease_until timestamptz
) WITH (fillfactor = 90);
