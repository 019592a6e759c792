-- sys1 batch consumer: claim up to :batch jobs (pgbench -D batch=N) under a
-- 30 s lease (transaction 1), then ack them all (transaction 2).
-- id = ANY (ARRAY(SELECT ... FOR UPDATE SKIP LOCKED)) makes the locking subquery
-- an InitPlan run once, the outer lookup a primary-key scan; the usual
-- IN (SELECT ...) can get a hash semi-join over a seq scan of the whole
-- table as its prepared (generic) plan.
WITH claimed AS (
    UPDATE jobs SET started_at = now(), lease_until = now() + interval '30 seconds'
     WHERE id = ANY (ARRAY(SELECT id FROM jobs
                          WHERE lease_until IS NULL OR lease_until < now()
                          ORDER BY id LIMIT :batch::int
                          FOR UPDATE SKIP LOCKED))
    RETURNING id, payload)
SELECT count(*) AS n, coalesce(array_agg(id)::text, '{}') AS job_ids, string_agg(payload::text, ',') AS payloads FROM claimed \gset
\if :n > 0
DELETE FROM jobs WHERE id = ANY (:job_ids::bigint[]);
\endif
