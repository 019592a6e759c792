-- sys2 batch producer: :batch jobs (pgbench -D batch=N) in one transaction.
INSERT INTO jobs (payload)
SELECT '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'::jsonb
  FROM generate_series(1, :batch::int);
