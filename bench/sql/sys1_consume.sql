-- sys1 consumer: claim one job under a 30 s lease (transaction 1), then ack it
-- by deleting it (transaction 2).  An empty poll does nothing more.
WITH claimed AS (
    UPDATE jobs SET started_at = now(), lease_until = now() + interval '30 seconds'
     WHERE id = (SELECT id FROM jobs
                  WHERE lease_until IS NULL OR lease_until < now()
                  ORDER BY id LIMIT 1
                  FOR UPDATE SKIP LOCKED)
    RETURNING id, payload)
SELECT count(*) AS n, coalesce(max(id), 0) AS job_id, max(payload::text) AS payload FROM claimed \gset
\if :n > 0
DELETE FROM jobs WHERE id = :job_id;
\endif
