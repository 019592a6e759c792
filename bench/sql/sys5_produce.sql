-- sys5 producer: one job per transaction, into the current slot (the column
-- default).
INSERT INTO jobs (payload) VALUES ('{"task": "send_email", "to": "user@example.com", "template": "welcome"}');
