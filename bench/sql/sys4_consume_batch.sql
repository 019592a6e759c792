-- sys4 batch consumer: pgq_claim up to :batch jobs (pgbench -D batch=N) under
-- a 30 s lease (transaction 1), then pgq_ack each of them (transaction 2).
SELECT count(*) AS n, coalesce(array_agg(id)::text, '{}') AS job_ids, string_agg(payload::text, ',') AS payloads
  FROM pgq_claim('bench-' || :client_id::text, :batch::int, '30 seconds') \gset
\if :n > 0
SELECT count(*) FILTER (WHERE pgq_ack(j, 'bench-' || :client_id::text)) AS acked
  FROM unnest(:job_ids::uuid[]) AS j;
\endif
