-- sys2 producer: one job per transaction.
INSERT INTO jobs (payload) VALUES ('{"task": "send_email", "to": "user@example.com", "template": "welcome"}');
