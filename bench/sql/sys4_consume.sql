-- sys4 consumer: pgq_claim one job under a 30 s lease (transaction 1), then
-- pgq_ack it (transaction 2).  The lock key is unique per pgbench client.
SELECT count(*) AS n, min(id::text) AS job_id, min(payload::text) AS payload
  FROM pgq_claim('bench-' || :client_id::text, 1, '30 seconds') \gset
\if :n > 0
SELECT pgq_ack(:job_id::uuid, 'bench-' || :client_id::text);
\endif
