-- pgqueue's batch loop in one statement, for bench/clients.sh: claim up to
-- :batch jobs (pgbench -D batch=N) under a 30 s lease and ack them all with
-- one pgq_ack_batch: one round trip and one transaction per loop.  Valid in
-- one statement: each pgq_* call starts its writes with a new command id and
-- snapshot (src/tables.c), so the ack sees the claim of the same statement;
-- the aggregate runs the claim to its end before the ack.  A claim that
-- finds nothing acks an empty array (0).  The lock key is unique per client.
SELECT pgq_ack_batch(coalesce(array_agg(id), '{}'), 'bench-' || :client_id::text)
  FROM pgq_claim('bench-' || :client_id::text, :batch::int, '30 seconds');
