--
-- 1.2: rate limits.  pgq_configure(..., rate_limit, rate_period): the
-- scheduling pass releases at most rate_limit jobs of the queue into
-- work_queue in any window of rate_period (src/rate.c); released jobs are
-- what counts.
--
TRUNCATE pgqueue.queue, pgqueue.work_queue;
DELETE FROM pgqueue.queues;
TRUNCATE pgqueue.rate_windows;

CREATE TEMP VIEW released AS
SELECT queue, count(*) AS in_work_queue FROM pgqueue.work_queue GROUP BY queue ORDER BY queue;
CREATE TEMP VIEW window_total AS
SELECT queue, (SELECT sum(c) FROM unnest(counts) c) AS counted FROM pgqueue.rate_windows ORDER BY queue;

-- the settings, their defaults, NULL keeps them
SELECT pgq_configure('rl', rate_limit => 3, rate_period => '1 minute');
SELECT queue, rate_limit, rate_period FROM pgqueue.queues ORDER BY queue;
SELECT pgq_configure('rl', weight => 2);
SELECT queue, weight, rate_limit, rate_period FROM pgqueue.queues ORDER BY queue;
SELECT pgq_configure('other');
SELECT queue, rate_limit, rate_period FROM pgqueue.queues ORDER BY queue;

-- a backlog of 10 beside an unlimited queue: 3 go, the free queue's 5 all go
SELECT count(pgq_push('rl', jsonb_build_object('n', n))) AS pushed FROM generate_series(1, 10) n;
SELECT count(pgq_push('free', jsonb_build_object('n', n))) AS pushed FROM generate_series(1, 5) n;
SELECT pgq_schedule();
SELECT * FROM released;
SELECT * FROM window_total;
-- the window is full for a minute: nothing more
SELECT pgq_schedule();
SELECT * FROM released;

-- a released job that is nacked used its share: ready again, not released
SELECT pgq_nack(id, 'w1', 'x', retry_in => '0') FROM pgq_claim('w1', 1, queues => '{rl}');
SELECT pgq_schedule();
SELECT * FROM released;
SELECT state, count(*) FROM pgqueue.queue WHERE queue = 'rl' GROUP BY state ORDER BY state;

-- 0 removes the limit: the rest go at once
SELECT pgq_configure('rl', rate_limit => 0);
SELECT pgq_schedule();
SELECT * FROM released;

-- a pass that rolls back released nothing and counted nothing
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.rate_windows;
SELECT pgq_configure('rl', rate_limit => 2);
SELECT count(pgq_push('rl', jsonb_build_object('n', n))) AS pushed FROM generate_series(1, 10) n;
BEGIN;
SELECT pgq_schedule();
ROLLBACK;
SELECT * FROM window_total;
SELECT pgq_schedule();
SELECT * FROM released;
SELECT * FROM window_total;

-- a new rate_period: the old window's releases count as made now
SELECT pgq_configure('rl', rate_limit => 3, rate_period => '2 minutes');
SELECT pgq_schedule();
SELECT * FROM released;
SELECT queue, period, (SELECT sum(c) FROM unnest(counts) c) AS counted FROM pgqueue.rate_windows;

-- the window moves: a short period frees its releases
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.rate_windows;
SELECT pgq_configure('rl', rate_limit => 2, rate_period => '100 milliseconds');
SELECT count(pgq_push('rl', jsonb_build_object('n', n))) AS pushed FROM generate_series(1, 5) n;
SELECT pgq_schedule();
SELECT pg_sleep(0.25);
SELECT pgq_schedule();
SELECT pg_sleep(0.25);
SELECT pgq_schedule();
SELECT * FROM released;
-- 256 buckets and the newest
SELECT array_length(counts, 1) AS buckets, period FROM pgqueue.rate_windows;

-- a clock stepped back (NTP, a VM restored, a promoted standby whose clock
-- lags): the window a pass wrote before the step lies ahead of the clock,
-- here by about an hour.  The queue waits one period, not until the clock
-- gets there again: the window's releases count as made now.
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.rate_windows;
SELECT count(pgq_push('rl', jsonb_build_object('n', n))) AS pushed FROM generate_series(1, 5) n;
SELECT pgq_schedule();
UPDATE pgqueue.rate_windows SET newest = newest + 10000000;
SELECT pg_sleep(0.25);
SELECT pgq_schedule();
SELECT * FROM window_total;
SELECT pg_sleep(0.25);
SELECT pgq_schedule();
SELECT * FROM released;

-- bad input: 22023, nothing changed
SELECT pgq_configure('rl', rate_limit => -1);
SELECT pgq_configure('rl', rate_period => '1 month');
\set VERBOSITY sqlstate
SELECT pgq_configure('rl', rate_period => '9 milliseconds');
SELECT pgq_configure('rl', rate_period => '1 day 1 second');
SELECT pgq_configure('rl', rate_period => '-1 second');
SELECT pgq_configure('rl', rate_period => '1 year');
SELECT pgq_configure('rl', rate_limit => -2147483648);
\set VERBOSITY default
SELECT queue, rate_limit, rate_period FROM pgqueue.queues WHERE queue = 'rl';
-- the edges are taken
SELECT pgq_configure('edge', rate_limit => 2147483647, rate_period => '10 milliseconds');
SELECT pgq_configure('edge', rate_period => '1 day');
SELECT queue, rate_limit, rate_period FROM pgqueue.queues WHERE queue = 'edge';
-- the table's own checks, for writes behind the API's back
UPDATE pgqueue.queues SET rate_limit = -1 WHERE queue = 'edge';
UPDATE pgqueue.queues SET rate_period = '1 millisecond' WHERE queue = 'edge';

DROP VIEW released, window_total;
TRUNCATE pgqueue.queue, pgqueue.work_queue, pgqueue.rate_windows;
DELETE FROM pgqueue.queues;
