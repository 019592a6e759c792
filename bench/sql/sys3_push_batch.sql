-- sys3 batch producer: :batch jobs (pgbench -D batch=N) in one transaction.
INSERT INTO queue (payload)
SELECT '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'::jsonb
  FROM generate_series(1, :batch::int);
