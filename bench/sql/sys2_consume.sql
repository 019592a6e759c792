-- sys2 consumer: claim and delete one job in ONE transaction.
WITH claimed AS (
    DELETE FROM jobs
     WHERE id = (SELECT id FROM jobs
                  WHERE lease_until IS NULL OR lease_until < now()
                  ORDER BY id LIMIT 1
                  FOR UPDATE SKIP LOCKED)
    RETURNING id, payload)
SELECT count(*) AS n, coalesce(max(id), 0) AS job_id, max(payload::text) AS payload FROM claimed;
