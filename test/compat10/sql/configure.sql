--
-- pgq_configure: per-queue settings (weight, max_in_flight, max_tries,
-- paused), NULL keeps a setting, and what each setting does.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;

CREATE TEMP VIEW settings AS
SELECT queue, weight, max_in_flight, max_tries, paused FROM pgqueue.queues ORDER BY queue;

-- a queue without a row has the defaults; configure with only a name
-- creates the row with the defaults
SELECT pgq_configure('q');
SELECT * FROM settings;
-- each argument alone; the others are kept
SELECT pgq_configure('q', weight => 7);
SELECT * FROM settings;
SELECT pgq_configure('q', max_in_flight => 20);
SELECT * FROM settings;
SELECT pgq_configure('q', max_tries => 9);
SELECT * FROM settings;
SELECT pgq_configure('q', paused => true);
SELECT * FROM settings;
-- all NULL: nothing changes
SELECT pgq_configure('q', NULL, NULL, NULL, NULL);
SELECT * FROM settings;
-- several at once, positionally
SELECT pgq_configure('q', 2, 0, 1, false);
SELECT * FROM settings;
-- the limits are accepted
SELECT pgq_configure('limits', weight => 10000, max_in_flight => 2147483647, max_tries => 2147483647);
SELECT pgq_configure('limits', weight => 1, max_in_flight => 0, max_tries => 1);
SELECT * FROM settings;
-- out of range: an error, and the settings stay as they were
SELECT pgq_configure('q', weight => 0);
SELECT pgq_configure('q', max_in_flight => -1, weight => 3);
SELECT pgq_configure('q', max_tries => 0);
SELECT pgq_configure('new', weight => 10001);
SELECT * FROM settings;
-- configure is transactional
BEGIN;
SELECT pgq_configure('q', weight => 99);
SELECT pgq_configure('rolled-back');
ROLLBACK;
SELECT * FROM settings;
-- a queue can be configured before it has jobs, and the settings stay when
-- its jobs are gone
SELECT queue FROM pgq_stats();

--
-- paused: the queue is not scheduled; jobs already scheduled stay claimable
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_push('p', '{"n": "before pause"}') IS NOT NULL AS pushed;
SELECT pgq_schedule();
SELECT pgq_configure('p', paused => true);
SELECT count(*) AS pushed FROM generate_series(1, 3) g, pgq_push('p', jsonb_build_object('n', g));
SELECT pgq_push('other', '{"n": "other"}') IS NOT NULL AS pushed;
-- only the other queue is scheduled
SELECT pgq_schedule();
SELECT queue, state, count(*) FROM pgqueue.queue GROUP BY 1, 2 ORDER BY 1, 2;
SELECT queue, payload FROM pgq_claim('w1', 10) ORDER BY queue;
SELECT queue, pending, scheduled, in_flight FROM pgq_stats();
-- retry jobs of a paused queue wait too
SELECT pgq_nack(id, 'w1', 'later', '0') FROM pgqueue.work_queue WHERE queue = 'p';
SELECT pgq_schedule();
SELECT queue, state, count(*) FROM pgqueue.queue GROUP BY 1, 2 ORDER BY 1, 2;
-- unpaused: scheduled by the next pass
SELECT pgq_configure('p', paused => false);
SELECT pgq_schedule();
SELECT queue, state, count(*) FROM pgqueue.queue GROUP BY 1, 2 ORDER BY 1, 2;

--
-- max_in_flight: caps all of the queue's rows in work_queue, claimed or not
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
SELECT pgq_configure('cap', max_in_flight => 3);
SELECT count(*) AS pushed FROM generate_series(1, 10) g, pgq_push('cap', jsonb_build_object('n', g));
SELECT count(*) AS pushed FROM generate_series(1, 10) g, pgq_push('free', jsonb_build_object('n', g));
SELECT pgq_schedule();
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
-- full: a pass adds nothing, even with unclaimed rows only
SELECT pgq_schedule();
-- claimed rows still count
SELECT count(*) AS claimed FROM pgq_claim('w1', 2, queues => '{cap}');
SELECT pgq_schedule();
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
-- an ack frees a place, and the next pass fills it
SELECT pgq_ack(id, 'w1') FROM pgqueue.work_queue
 WHERE id = (SELECT id FROM pgqueue.work_queue WHERE lock_key = 'w1' ORDER BY batch_order LIMIT 1);
SELECT pgq_schedule();
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
-- a nack frees a place too, and so does a failure
SELECT pgq_nack(id, 'w1', 'retry', '1 hour') FROM pgqueue.work_queue WHERE lock_key = 'w1';
SELECT pgq_schedule();
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
SELECT pgq_configure('cap', max_tries => 1);
SELECT count(*) AS claimed FROM pgq_claim('w1', 1, queues => '{cap}');
SELECT pgq_nack(id, 'w1', 'fatal') FROM pgqueue.work_queue WHERE lock_key = 'w1';
SELECT pgq_schedule();
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;
-- many passes never exceed the cap
SELECT count(*) AS passes FROM generate_series(1, 5) g, pgq_schedule(1);
SELECT count(*) AS cap_in_work_queue FROM pgqueue.work_queue WHERE queue = 'cap';
-- a lower cap does not take rows back, it only stops new ones
SELECT pgq_configure('cap', max_in_flight => 1);
SELECT pgq_schedule();
SELECT count(*) AS cap_in_work_queue FROM pgqueue.work_queue WHERE queue = 'cap';
SELECT count(*) FILTER (WHERE pgq_ack(c.id, 'w2')) AS acked
  FROM pgq_claim('w2', 10, queues => '{cap}') c;
SELECT pgq_schedule();
SELECT count(*) AS cap_in_work_queue FROM pgqueue.work_queue WHERE queue = 'cap';
-- 0 removes the cap
SELECT pgq_configure('cap', max_in_flight => 0);
SELECT pgq_schedule();
SELECT queue, state, count(*) FROM pgqueue.queue GROUP BY 1, 2 ORDER BY 1, 2;
-- the cap also bounds a single pass, in both of its rounds (the second
-- round offers what the small queue left over)
TRUNCATE pgqueue.queue, pgqueue.work_queue;
SELECT pgq_configure('cap', max_in_flight => 4);
SELECT count(*) AS pushed FROM generate_series(1, 50) g, pgq_push('cap', jsonb_build_object('n', g));
SELECT pgq_push('tiny') IS NOT NULL AS pushed;
SELECT pgq_schedule(100);
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY 1 ORDER BY 1;

--
-- weight and max_tries: see schedule.sql, ack_nack.sql and lease.sql
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
