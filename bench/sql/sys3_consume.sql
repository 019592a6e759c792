-- sys3 consumer: claim one scheduled job from work_queue under a 30 s lease
-- (transaction 1), then ack it by deleting it from queue, which cascades to
-- work_queue (transaction 2).
WITH claimed AS (
    UPDATE work_queue SET started_at = now(), lease_until = now() + interval '30 seconds'
     WHERE id = (SELECT id FROM work_queue
                  WHERE lease_until IS NULL OR lease_until < now()
                  ORDER BY id LIMIT 1
                  FOR UPDATE SKIP LOCKED)
    RETURNING id)
SELECT count(*) AS n, coalesce(max(c.id), 0) AS job_id, max(q.payload::text) AS payload
  FROM claimed c JOIN queue q ON q.id = c.id \gset
\if :n > 0
DELETE FROM queue WHERE id = :job_id;
\endif
