-- sys4 batch producer: :batch pgq_push calls (pgbench -D batch=N) in one
-- transaction.
SELECT count(pgq_push('q', p))
  FROM (SELECT '{"task": "send_email", "to": "user@example.com", "template": "welcome"}'::jsonb AS p
          FROM generate_series(1, :batch::int)) s;
