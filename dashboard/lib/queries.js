'use strict';
/*
 * Every SQL statement the dashboard runs.  Values always travel as
 * parameters ($1, $2, ...); the only text put together here is fixed SQL
 * from this file and the extension's schema name, quoted as an identifier.
 *
 * Nothing here counts a whole queue: counts stop at a cap (countCap,
 * 10,000 by default) and lists are pages of a keyset walk along an index
 * of the extension (see LISTS), so a page costs the same with 100 jobs in
 * a queue as with a million.
 */

/* The job lists of a queue page, one per state (and the archive).
 *
 * A list is one or more segments walked one after the other; a segment is
 * a walk along one index, resumed after the last row shown (its key).  key
 * are SQL expressions in the index's order, each with the type its text
 * form is cast back to; desc walks the index backwards.  Keys travel as text
 * (a JavaScript Date would lose the microseconds of a timestamptz).
 *
 * where is what the index answers; filter, when there is one, is what it
 * cannot (the state among the ready jobs, the queue among the leases): a
 * page then walks at most WALK_BUDGET index entries, and a page that found
 * fewer rows than asked still ends at the last entry it walked, so the next
 * page goes on from there.  No page costs more than that walk, whatever the
 * size of the queue.
 *
 * pending, retry: queue_ready_idx (queue, -priority, run_after, id) WHERE
 *   state IN ('pending', 'retry'), the scheduler's own order.
 * scheduled: jobs in work_queue not held by a live lease: first those
 *   whose lease ran out (work_queue_lease_idx, by deadline), then those
 *   never claimed or released (work_queue_queue_ready_idx, in claim order).
 * running: held by a live lease (work_queue_lease_idx, by deadline).
 * failed: the queue's failed jobs by id (time-ordered): the failed jobs of
 *   the queue through queue_failed_idx, sorted.
 * archive: the archive's rows of the queue, newest id first (archive_id_idx).
 * waiting (1.2, flows): jobs waiting for parents.  No index of the queue
 *   holds them (none of its indexes has the state 'waiting'); every one of
 *   them has an open edge in pgqueue.job_parents, so the walk goes along
 *   the distinct children of job_parents_child_idx, by id, each looked up
 *   by its primary key, the queue and the state filtered.
 */
const WALK_BUDGET = 2000;

const JOB_COLUMNS = `
       q.id::text AS id, q.priority, q.run_after::text AS run_after,
       q.created::text AS created, q.last_error,
       pg_catalog.left(q.payload::text, 160) AS payload_head`;

const QUEUE_COLUMNS = `${JOB_COLUMNS}, q.tries, q.state::text AS state`;

const WORK_COLUMNS = `${JOB_COLUMNS},
       w.tries, w.lock_key, w.lock_timeout::text AS lock_timeout,
       w.created::text AS scheduled_at,
       CASE WHEN w.lock_timeout >= pg_catalog.clock_timestamp() THEN 'running'
            ELSE 'scheduled' END AS state`;

/* The distinct children of the open edges, by id: the waiting jobs of all
 * queues (1.2).  A condition on child is pushed down into the DISTINCT. */
const CHILDREN = '(SELECT DISTINCT p.child FROM pgqueue.job_parents p) c';

/* The row of one job, by id, as a subquery of its own for a LATERAL join:
 * its LIMIT keeps the planner from turning the join into one that reads
 * the whole table (a merge or hash join along the primary key), which it
 * would choose while the tables are small. */
function probe(from, alias, id) {
	return `(SELECT * FROM ${from} ${alias}_ WHERE ${alias}_.id = ${id} LIMIT 1) ${alias}`;
}

const READY_KEY = [['-(q.priority::bigint)', 'bigint'], ['q.run_after', 'timestamptz'], ['q.id', 'uuid']];
const WORK_FROM = 'pgqueue.work_queue w JOIN pgqueue.queue q ON q.id = w.id';

const LISTS = {
	pending: [{
		select: QUEUE_COLUMNS, from: 'pgqueue.queue q',
		where: "q.queue = $1 AND q.state IN ('pending', 'retry')",
		filter: "q.state = 'pending'",
		key: READY_KEY,
	}],
	retry: [{
		select: QUEUE_COLUMNS, from: 'pgqueue.queue q',
		where: "q.queue = $1 AND q.state IN ('pending', 'retry')",
		filter: "q.state = 'retry'",
		key: READY_KEY,
	}],
	scheduled: [{
		select: WORK_COLUMNS, from: WORK_FROM,
		where: 'w.lock_timeout < pg_catalog.clock_timestamp()',
		filter: 'w.queue = $1',
		key: [['w.lock_timeout', 'timestamptz'], ['w.id', 'uuid']],
	}, {
		select: WORK_COLUMNS, from: WORK_FROM,
		where: 'w.queue = $1 AND w.lock_timeout IS NULL',
		key: [['w.created', 'timestamptz'], ['w.batch_order', 'int'], ['w.id', 'uuid']],
	}],
	running: [{
		select: WORK_COLUMNS, from: WORK_FROM,
		where: 'w.lock_timeout >= pg_catalog.clock_timestamp()',
		filter: 'w.queue = $1',
		key: [['w.lock_timeout', 'timestamptz'], ['w.id', 'uuid']],
	}],
	failed: [{
		select: QUEUE_COLUMNS, from: 'pgqueue.queue q',
		where: "q.queue = $1 AND q.state = 'failed'",
		key: [['q.id', 'uuid']],
	}],
	waiting: [{
		select: `${QUEUE_COLUMNS}, coalesce(q.waiting_for, 0) AS waiting_for`,
		from: `${CHILDREN} CROSS JOIN LATERAL ${probe('pgqueue.queue', 'q', 'c.child')}`,
		where: 'true',
		filter: "q.queue = $1 AND q.state = 'waiting'",
		key: [['c.child', 'uuid']],
	}],
	archive: [{
		select: `a.id::text AS id, a.priority, a.tries, a.created::text AS created,
		         a.finished::text AS finished, a.outcome, a.last_error,
		         pg_catalog.left(a.payload::text, 160) AS payload_head,
		         'archived'::text AS state`,
		from: 'pgqueue.archive a',
		where: 'true',
		filter: 'a.queue = $1',
		key: [['a.id', 'uuid']],
		desc: true,
	}],
};

/*
 * The statement for one page of one segment: the first page (no key) or
 * the page after a key.  Parameters: $1 the queue, $2 the number of rows
 * wanted, $3 the walk budget (filtered segments only), then one per key
 * column.  The row comparison (k1, k2, ...) > (...) is an index condition
 * of the walk, so a page deep in a large queue reads no more than the first.
 *
 * A filtered segment returns the rows that pass the filter (hit), at most
 * $2, followed by the last entry of the walk (with its position rn) so that
 * the caller knows where the walk stopped.
 */
function segmentSql(seg, afterKey) {
	const keyExprs = seg.key.map(([expr]) => expr);
	const keySelect = seg.key.map(([expr], i) => `(${expr})::text AS k${i}`).join(', ');
	const first = seg.filter ? 4 : 3;
	let where = seg.where;
	if (afterKey) {
		const params = seg.key.map(([, type], i) => `$${i + first}::${type}`);
		where += ` AND (${keyExprs.join(', ')}) ${seg.desc ? '<' : '>'} (${params.join(', ')})`;
	}
	const order = keyExprs.map((e) => `${e}${seg.desc ? ' DESC' : ''}`).join(', ');
	const walk = `SELECT ${seg.select}, ${keySelect}` +
		(seg.filter ? `, (${seg.filter}) AS hit` : '') +
		`\n  FROM ${seg.from}\n WHERE ${where}\n ORDER BY ${order}\n LIMIT $${seg.filter ? 3 : 2}`;
	if (!seg.filter)
		return walk;
	return `WITH walk AS MATERIALIZED (
  SELECT s.*, pg_catalog.row_number() OVER () AS rn FROM (${walk}) s)
(SELECT * FROM walk WHERE hit ORDER BY rn LIMIT $2)
UNION ALL
(SELECT * FROM walk ORDER BY rn DESC LIMIT 1)`;
}

/*
 * One page of a list: up to limit rows after cursor ({seg, key} or null),
 * and the cursor of the next page (null at the end).  When a segment runs
 * out, the page goes on with the next one from its start.  walked is how
 * many index entries the filtered walks looked at without finding enough.
 */
async function listPage(db, list, queue, cursor, limit) {
	const segs = LISTS[list];
	const rows = [];
	let segNo = cursor ? cursor.seg : 0;
	let key = cursor ? cursor.key : null;
	if (!Number.isInteger(segNo) || segNo < 0 || segNo >= segs.length ||
		(key !== null && (!Array.isArray(key) || key.length !== segs[segNo].key.length ||
			!key.every((k) => typeof k === 'string'))))
		throw new BadRequest('bad cursor');
	const keyOf = (seg, segIndex, row) => ({ seg: segIndex, key: seg.key.map((_, i) => row[`k${i}`]) });
	let last = null;
	for (; segNo < segs.length && rows.length < limit; segNo++, key = null) {
		const seg = segs[segNo];
		const want = limit - rows.length;
		const params = seg.filter ? [queue, want + 1, WALK_BUDGET] : [queue, want + 1];
		const res = await db.query(segmentSql(seg, key !== null), params.concat(key || []));
		let got = res.rows;
		let tail = null;
		if (seg.filter) {
			tail = got[got.length - 1];	// the walk's last entry, if it walked any
			got = got.slice(0, -1);
		}
		// one row more than wanted tells that the segment goes on
		const more = got.length > want;
		got = got.slice(0, want);
		for (const r of got) rows.push(r);
		if (got.length > 0)
			last = keyOf(seg, segNo, got[got.length - 1]);
		if (more)
			return { rows, next: last };
		if (tail && Number(tail.rn) >= WALK_BUDGET)	// the walk stopped, not the segment
			return { rows, next: keyOf(seg, segNo, tail), short: true };
	}
	// this page ended a segment; the next page starts the following one
	if (segNo < segs.length)
		return { rows, next: { seg: segNo, key: null } };
	return { rows, next: null };
}

class BadRequest extends Error {}

/* The distinct queues among the jobs that an index with this predicate
 * holds (its first column is queue): one probe per queue. */
function skipScan(name, predicate) {
	return `${name} AS (
    (SELECT q.queue FROM pgqueue.queue q WHERE ${predicate}
      ORDER BY q.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT q.queue FROM pgqueue.queue q
             WHERE ${predicate} AND q.queue > r.queue
             ORDER BY q.queue LIMIT 1)
      FROM ${name} r WHERE r.queue IS NOT NULL)`;
}

/*
 * The queues: every queue with settings or jobs.  Names come from the
 * settings table and from a skip scan over each index whose rows carry a
 * queue name (ready, scheduled, failed jobs): one probe per queue, never a
 * walk over the jobs themselves.
 *
 * Counts stop one past the cap ($1 is the cap + 1): a count above the cap
 * is shown as "10,000+".  pending and retry come from one walk of at most
 * $1 entries of the queue's ready jobs (queue_ready_idx has both states:
 * when the walk stopped, each is "at least").  running and expired leases
 * come from one walk of at most $1 leases of all queues
 * (work_queue_lease_idx).
 *
 * waiting (1.2, flows; the overview's list of queues, and one queue's
 * row, when flows is given): jobs waiting for parents, from one walk of at
 * most $1 of the children in pgqueue.job_parents (all queues, by id), each
 * looked up by its primary key (a subquery per child: never a join that
 * could read the whole table); when the walk stopped, every queue's
 * waiting count is "at least".  A queue whose jobs all wait is found by
 * that walk too.
 *
 * oldest_age is how long the job that has waited longest has been due:
 * the first entry of each priority in queue_ready_idx (due ones only), the
 * first 100 jobs in work_queue in claim order, and the expired leases.
 */
const QUEUE_NAMES = `
WITH RECURSIVE
${skipScan('ready', "q.state IN ('pending', 'retry')")},
${skipScan('sched', "q.state = 'scheduled'")},
${skipScan('failed', "q.state = 'failed'")}
SELECT queue FROM ready WHERE queue IS NOT NULL
UNION SELECT queue FROM sched WHERE queue IS NOT NULL
UNION SELECT queue FROM failed WHERE queue IS NOT NULL
UNION SELECT s.queue FROM pgqueue.queues s`;

function capped(from, where) {
	return `(SELECT pg_catalog.count(*) FROM (SELECT 1 FROM ${from} WHERE ${where} LIMIT $1) c)`;
}

function overviewSql(names, flows) {
	const waiting = flows ? `
waiting_walk AS MATERIALIZED (
    SELECT (SELECT q.queue FROM pgqueue.queue q WHERE q.id = c.child AND q.state = 'waiting') AS queue
      FROM ${CHILDREN} ORDER BY c.child LIMIT $1),
waiting_counts AS (
    SELECT w.queue, pg_catalog.count(*) AS waiting
      FROM waiting_walk w WHERE w.queue IS NOT NULL GROUP BY w.queue),` : '';
	// the overview's names: also the queues the walk found
	const moreNames = flows && names === QUEUE_NAMES ? '\nUNION SELECT wc.queue FROM waiting_counts wc' : '';
	return `
WITH t AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS ts),${waiting}
names AS (${names}${moreNames}),
leases AS MATERIALIZED (
    SELECT w.id, w.queue, w.lock_timeout >= t.ts AS live
      FROM pgqueue.work_queue w CROSS JOIN t
     WHERE w.lock_timeout IS NOT NULL LIMIT $1),
lease_counts AS (
    SELECT l.queue, pg_catalog.count(*) FILTER (WHERE l.live) AS running,
           pg_catalog.count(*) FILTER (WHERE NOT l.live) AS expired
      FROM leases l GROUP BY l.queue)
SELECT n.queue, r.pending, r.retry, r.ready_walked >= $1 AS ready_capped,
       ${capped('pgqueue.work_queue w', 'w.queue = n.queue AND w.lock_timeout IS NULL')} AS unclaimed,
       coalesce(lc.expired, 0) AS expired, coalesce(lc.running, 0) AS running,
       (SELECT pg_catalog.count(*) FROM leases) >= $1 AS leases_capped,
       ${capped('pgqueue.queue q', "q.queue = n.queue AND q.state = 'failed'")} AS failed,
       EXTRACT(epoch FROM t.ts - LEAST(
         (WITH RECURSIVE p AS (
             (SELECT -(q.priority::bigint) AS np, q.run_after FROM pgqueue.queue q
               WHERE q.queue = n.queue AND q.state IN ('pending', 'retry')
               ORDER BY -(q.priority::bigint), q.run_after LIMIT 1)
             UNION ALL
             SELECT x.np, x.run_after FROM p, LATERAL
               (SELECT -(q.priority::bigint) AS np, q.run_after FROM pgqueue.queue q
                 WHERE q.queue = n.queue AND q.state IN ('pending', 'retry')
                   AND -(q.priority::bigint) > p.np
                 ORDER BY -(q.priority::bigint), q.run_after LIMIT 1) x)
          SELECT pg_catalog.min(p.run_after) FROM p WHERE p.run_after <= t.ts),
         (SELECT pg_catalog.min(q.run_after)
            FROM (SELECT w.id FROM pgqueue.work_queue w
                   WHERE w.queue = n.queue AND w.lock_timeout IS NULL
                   ORDER BY w.created, w.batch_order LIMIT 100) w
            JOIN pgqueue.queue q ON q.id = w.id),
         (SELECT pg_catalog.min(q.run_after)
            FROM leases l JOIN pgqueue.queue q ON q.id = l.id
           WHERE l.queue = n.queue AND NOT l.live))) AS oldest_age,
       coalesce(s.weight, 1) AS weight, coalesce(s.max_in_flight, 0) AS max_in_flight,
       coalesce(s.max_tries, 5) AS max_tries, coalesce(s.paused, false) AS paused,
       s.queue IS NOT NULL AS configured${flows ? `,
       coalesce(wc.waiting, 0) AS waiting,
       (SELECT pg_catalog.count(*) FROM waiting_walk) >= $1 AS waiting_capped` : ''}
  FROM names n CROSS JOIN t
  CROSS JOIN LATERAL (
       SELECT pg_catalog.count(*) FILTER (WHERE c.state = 'pending') AS pending,
              pg_catalog.count(*) FILTER (WHERE c.state = 'retry') AS retry,
              pg_catalog.count(*) AS ready_walked
         FROM (SELECT q.state FROM pgqueue.queue q
                WHERE q.queue = n.queue AND q.state IN ('pending', 'retry') LIMIT $1) c) r
  LEFT JOIN lease_counts lc ON lc.queue = n.queue
  LEFT JOIN pgqueue.queues s ON s.queue = n.queue${flows ? `
  LEFT JOIN waiting_counts wc ON wc.queue = n.queue` : ''}
 ORDER BY n.queue`;
}

const OVERVIEW = overviewSql(QUEUE_NAMES, false);
/* With the waiting jobs (1.2: pgqueue.job_parents). */
const OVERVIEW_FLOWS = overviewSql(QUEUE_NAMES, true);

// One queue: the same row as the overview's, for that queue only.
const QUEUE_ONE = overviewSql('SELECT $2::text AS queue', false);
const QUEUE_ONE_FLOWS = overviewSql('SELECT $2::text AS queue', true);

/* The counters since server start; schema as for actionSql. */
function countersSql(schema) {
	return `SELECT pushed, scheduled, claimed, acked, nacked, failed, leases_stolen,
       EXTRACT(epoch FROM pg_catalog.clock_timestamp()) AS at
  FROM ${schema}.pgq_counters()`;
}

/* One job: the view's row, with the work_queue row's claim times (and,
 * with flows, its parents not yet acked: 1.2). */
function jobSql(flows) {
	return `
SELECT j.id::text AS id, j.queue, j.state, j.priority, j.run_after::text AS run_after,
       j.created::text AS created, j.tries, j.max_tries, j.lock_key,
       j.lock_timeout::text AS lock_timeout,
       EXTRACT(epoch FROM j.lock_timeout - pg_catalog.clock_timestamp()) AS lease_left,
       j.last_error, pg_catalog.jsonb_pretty(j.payload) AS payload,
       w.created::text AS scheduled_at, w.started::text AS started, w.version${flows ? ',\n       j.waiting_for' : ''}
  FROM pgqueue.jobs j LEFT JOIN pgqueue.work_queue w ON w.id = j.id
 WHERE j.id = $1::uuid`;
}

const JOB = jobSql(false);
const JOB_FLOWS = jobSql(true);

/*
 * A job's open edges (1.2): the parents it still waits for (at most 1,000:
 * pgq_push takes no more), through job_parents_child_idx; the jobs that
 * wait for it, at most $2, through the primary key (parent, child).  Each with its state, from pgqueue.jobs (none: it was
 * finished meanwhile).
 */
function edgesSql(other, self, limit) {
	return `
SELECT p.${other}::text AS id, j.queue, j.state, coalesce(j.waiting_for, 0) AS waiting_for
  FROM pgqueue.job_parents p LEFT JOIN LATERAL ${probe('pgqueue.jobs', 'j', `p.${other}`)} ON true
 WHERE p.${self} = $1::uuid
 ORDER BY p.${other} LIMIT ${limit}`;
}
const PARENTS = edgesSql('parent', 'child', '1000');
const CHILDREN_OF = edgesSql('child', 'parent', '$2');

/* A finished job, when its queue keeps an archive. */
const ARCHIVED_JOB = `
SELECT a.id::text AS id, a.queue, 'archived' AS state, a.outcome, a.priority, a.tries,
       a.created::text AS created, a.finished::text AS finished, a.last_error,
       pg_catalog.jsonb_pretty(a.payload) AS payload
  FROM pgqueue.archive a
 WHERE a.id = $1::uuid
 ORDER BY a.finished DESC LIMIT 1`;

/*
 * What the database has: the extension's schema and version, which of the
 * operator functions and objects of 1.1 exist, whether it has flows (1.2:
 * pgqueue.job_parents, readable by the role), and the role the dashboard
 * connects as.
 */
const FEATURES = `
SELECT e.extversion AS version, n.nspname AS schema, current_user AS role,
       pg_catalog.current_database() AS database,
       pg_catalog.to_regclass('pgqueue.archive') IS NOT NULL AS archive,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                WHERE attrelid = 'pgqueue.queues'::regclass AND attname = 'retention'
                  AND NOT attisdropped) AS retention,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                WHERE attrelid = 'pgqueue.queues'::regclass AND attname = 'rate_limit'
                  AND NOT attisdropped) AS rate_limit,
       EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                WHERE attrelid = 'pgqueue.queues'::regclass AND attname = 'group_max_in_flight'
                  AND NOT attisdropped) AS groups,
       pg_catalog.to_regprocedure(pg_catalog.quote_ident(n.nspname) || '.pgq_retry(uuid)') IS NOT NULL AS operate,
       coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('pgqueue.job_parents'), 'SELECT'),
                false) AS flows
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'pgqueue'`;

const RETENTION = `SELECT s.retention::text AS retention FROM pgqueue.queues s WHERE s.queue = $1`;

/* A queue's rate limit (1.2): 0 or no row, none. */
const RATE = `SELECT s.rate_limit, s.rate_period::text AS rate_period FROM pgqueue.queues s WHERE s.queue = $1`;

/* A queue's limit per group (1.2): 0 or no row, none. */
const GROUP_LIMIT = `SELECT s.group_max_in_flight FROM pgqueue.queues s WHERE s.queue = $1`;

/*
 * A queue's groups (1.2), those with the most jobs in flight (scheduled,
 * running or in retry) first, then the most waiting: at most $2 of them,
 * and how many groups there are in all.
 */
const GROUPS = `
SELECT g.group_key, g.in_flight, g.pending, count(*) OVER () AS groups
  FROM (SELECT q.group_key,
               count(*) FILTER (WHERE q.state IN ('scheduled', 'retry')) AS in_flight,
               count(*) FILTER (WHERE q.state = 'pending') AS pending
          FROM pgqueue.queue q
         WHERE q.queue = $1 AND q.group_key IS NOT NULL AND q.state <> 'failed'
         GROUP BY q.group_key) g
 ORDER BY g.in_flight DESC, g.pending DESC, g.group_key
 LIMIT $2`;

/*
 * The actions, each one call of the pgqueue API (never a write to its
 * tables).  schema is the extension's schema, quoted as an identifier.
 */
function actionSql(schema, action) {
	const f = (name) => `${schema}.${name}`;
	switch (action) {
	case 'retry': return `SELECT ${f('pgq_retry')}($1::uuid) AS result`;
	case 'retry_failed': return `SELECT ${f('pgq_retry_failed')}($1::text) AS result`;
	case 'cancel': return `SELECT ${f('pgq_cancel')}($1::uuid) AS result`;
	case 'purge': return `SELECT ${f('pgq_purge')}($1::text, $2::text) AS result`;
	case 'pause': return `SELECT ${f('pgq_configure')}($1::text, paused => true) AS result`;
	case 'resume': return `SELECT ${f('pgq_configure')}($1::text, paused => false) AS result`;
	case 'settings': return `SELECT ${f('pgq_configure')}($1::text, weight => $2::int, max_in_flight => $3::int) AS result`;
	default: throw new BadRequest('unknown action');
	}
}

module.exports = {
	LISTS, segmentSql, listPage, BadRequest,
	OVERVIEW, OVERVIEW_FLOWS, QUEUE_ONE, QUEUE_ONE_FLOWS, countersSql, JOB, JOB_FLOWS, PARENTS, CHILDREN_OF,
	ARCHIVED_JOB, FEATURES, RETENTION, RATE, GROUP_LIMIT, GROUPS, actionSql,
};
