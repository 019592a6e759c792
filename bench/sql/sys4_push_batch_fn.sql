-- sys4 batch producer, used when pgq_push_batch(text, jsonb[]) exists: :batch
-- jobs (pgbench -D batch=N) in one call, one transaction.
SELECT count(*)
  FROM pgq_push_batch('q', array(SELECT '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'::jsonb
                                   FROM generate_series(1, :batch::int)));
