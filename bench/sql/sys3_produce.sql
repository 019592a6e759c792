-- sys3 producer: one job per transaction into the queue table.
INSERT INTO queue (payload) VALUES ('{"task": "send_email", "to": "user@example.com", "template": "welcome"}');
