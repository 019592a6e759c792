-- sys3 batch consumer: claim up to :batch scheduled jobs (pgbench -D batch=N)
-- under a 30 s lease (transaction 1), then ack them all (transaction 2).
-- id = ANY (ARRAY(SELECT ... FOR UPDATE SKIP LOCKED)) makes the locking subquery
-- an InitPlan run once, the outer lookup a primary-key scan; the usual
-- IN (SELECT ...) can get a hash semi-join over a seq scan of the whole
-- table as its prepared (generic) plan.
WITH claimed AS (
    UPDATE work_queue SET started_at = now(), lease_until = now() + interval '30 seconds'
     WHERE id = ANY (ARRAY(SELECT id FROM work_queue
                          WHERE lease_until IS NULL OR lease_until < now()
                          ORDER BY id LIMIT :batch::int
                          FOR UPDATE SKIP LOCKED))
    RETURNING id)
SELECT count(*) AS n, coalesce(array_agg(c.id)::text, '{}') AS job_ids, string_agg(q.payload::text, ',') AS payloads
  FROM claimed c JOIN queue q ON q.id = c.id \gset
\if :n > 0
DELETE FROM queue WHERE id = ANY (:job_ids::bigint[]);
\endif
