-- sys2 batch consumer: claim and delete up to :batch jobs (pgbench -D batch=N)
-- in ONE transaction.
-- id = ANY (ARRAY(SELECT ... FOR UPDATE SKIP LOCKED)) makes the locking subquery
-- an InitPlan run once, the outer lookup a primary-key scan; the usual
-- IN (SELECT ...) can get a hash semi-join over a seq scan of the whole
-- table as its prepared (generic) plan.
WITH claimed AS (
    DELETE FROM jobs
     WHERE id = ANY (ARRAY(SELECT id FROM jobs
                          WHERE lease_until IS NULL OR lease_until < now()
                          ORDER BY id LIMIT :batch::int
                          FOR UPDATE SKIP LOCKED))
    RETURNING id, payload)
SELECT count(*) AS n, coalesce(array_agg(id)::text, '{}') AS job_ids, string_agg(payload::text, ',') AS payloads FROM claimed;
