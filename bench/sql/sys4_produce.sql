-- sys4 producer: one pgq_push per transaction.
SELECT pgq_push('q', '{"task": "send_email", "to": "user@example.com", "template": "welcome"}');
