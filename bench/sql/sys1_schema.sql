-- sys1: hand-rolled single-table lease queue.
-- A claim sets a lease in one transaction (sys1_consume.sql); the ack deletes
-- the row in a second transaction.  Run with search_path = sys1.
--
-- Indexes: the claim query is
--   ... WHERE lease_until IS NULL OR lease_until < now() ORDER BY id LIMIT 1
--       FOR UPDATE SKIP LOCKED
-- which the planner answers by walking the primary key in id order and
-- filtering on the lease, so the primary key is the index that matters.
-- An index on lease_until cannot serve "ORDER BY id LIMIT 1" with that OR
-- condition, and it would make every claim (which writes lease_until) a
-- non-HOT update that has to touch both indexes: a careful user leaves it
-- out.  fillfactor 90 leaves room on each page so claims can be HOT updates.
CREATE SCHEMA IF NOT EXISTS sys1;
CREATE TABLE sys1.jobs (
    id          bigserial PRIMARY KEY,
    created_at  timestamptz DEFAULT now(),
    payload     jsonb,
    started_at  timestamptz,
    lease_until timestamptz
) WITH (fillfactor = 90);
