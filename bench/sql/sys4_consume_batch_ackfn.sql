-- sys4 batch consumer, used when pgq_ack_batch(uuid[], text) exists: pgq_claim
-- up to :batch jobs (pgbench -D batch=N) under a 30 s lease (transaction 1),
-- then ack them all with one pgq_ack_batch call (transaction 2).
SELECT count(*) AS n, coalesce(array_agg(id)::text, '{}') AS job_ids, string_agg(payload::text, ',') AS payloads
  FROM pgq_claim('bench-' || :client_id::text, :batch::int, '30 seconds') \gset
\if :n > 0
SELECT pgq_ack_batch(:job_ids::uuid[], 'bench-' || :client_id::text);
\endif
