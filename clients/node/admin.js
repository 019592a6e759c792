// Operating queues from code: statistics, listing jobs, settings, pause and
// resume, retry, cancel, purge.  Each function runs one statement on the
// client (or pool) it is given, as the producer functions do; the role needs
// pgqueue_admin.  The same operations as Python's pgqueue.admin.
//
// stats, counters and configure (without retention) work with pgqueue 1.0;
// jobs, retry, retryFailed, cancel, purge and configure's retention need
// pgqueue 1.1 (the pgqueue.jobs view and its functions), configure's
// rateLimit and ratePeriod pgqueue 1.2: on an older installation they reject
// with NeedsNewerExtension, which says what to run.

const seconds = (s) => (s == null ? null : `${Number(s)} seconds`);

/** The database's pgqueue lacks an object this call needs (pgqueue 1.1's admin functions, 1.2's push maxTries and after, configure rateLimit, ratePeriod). */
export class NeedsNewerExtension extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'NeedsNewerExtension';
  }
}

// Undefined function, table, column: what a 1.1 call meets on 1.0.
const MISSING = new Set(['42883', '42P01', '42703']);

// The error for a call that met an object missing before pgqueue `version`
// (err is the server's): 1.1 for the functions here, 1.2 for push's
// maxTries and after (index.js).  The version is read on the same client; inside a
// transaction that the error aborted it cannot be, and is then said to be
// unknown.
export async function needsNewer(client, what, version, err) {
  let have;
  try {
    const { rows } = await client.query("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pgqueue'");
    have = rows.length ? rows[0].extversion : 'not installed';
  } catch {
    have = '(version unknown: the transaction is aborted)';
  }
  return new NeedsNewerExtension(`${what} needs pgqueue ${version}; this database has pgqueue ${have}`
    + ` (run ALTER EXTENSION pgqueue UPDATE once ${version} is installed) [${err.message}]`, { cause: err });
}

async function query(client, what, text, values, version = '1.1') {
  try {
    return (await client.query(text, values)).rows;
  } catch (err) {
    if (what != null && MISSING.has(err?.code)) throw await needsNewer(client, what, version, err);
    throw err;
  }
}

const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

// A row with camelCase keys, the bigint columns (strings from pg) as numbers.
function camelRow(row, bigints) {
  const out = {};
  for (const [k, v] of Object.entries(row)) out[camel(k)] = bigints.has(k) && v != null ? Number(v) : v;
  return out;
}

const STATS_TEXT = new Set(['queue', 'oldest_ready']);

/** One object per queue: pending, retry, scheduled, inFlight, failed (numbers), oldestReady; waiting (pgqueue 1.2). */
export async function stats(client) {
  const rows = await query(client, null, 'SELECT * FROM pgq_stats() ORDER BY queue');
  return rows.map((r) => camelRow(r, new Set(Object.keys(r).filter((k) => !STATS_TEXT.has(k)))));
}

/** The cumulative counters since the server started (the library preloaded). */
export async function counters(client) {
  const [r] = await query(client, null, 'SELECT * FROM pgq_counters()');
  return camelRow(r, new Set(Object.keys(r).filter((k) => k !== 'stats_reset')));
}

/** The states of pgqueue.jobs (pgqueue 1.1; waiting, for parents: 1.2). */
export const JOB_STATES = ['pending', 'retry', 'scheduled', 'running', 'failed', 'waiting'];
/** The states purge takes (waiting: pgqueue 1.2). */
export const PURGE_STATES = ['pending', 'retry', 'failed', 'waiting'];

/**
 * Unfinished jobs from the pgqueue.jobs view, oldest first (pgqueue 1.1);
 * with pgqueue 1.2 each has waitingFor, its parents not yet acked (read
 * through to_jsonb: 1.1's view has no such column).
 */
export async function jobs(client, { queue = null, state = null, limit = 100 } = {}) {
  const rows = await query(client, 'listing jobs (pgqueue.jobs)',
    'SELECT id, queue, state::text AS state, priority, run_after, created, tries, max_tries,'
    + " lock_key, lock_timeout, last_error, payload, pg_catalog.to_jsonb(j) -> 'waiting_for' AS waiting_for"
    + ' FROM pgqueue.jobs j'
    + ' WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state::text = $2)'
    + ' ORDER BY created, id LIMIT $3', [queue, state, limit]);
  return rows.map((r) => {
    const out = camelRow(r, new Set());
    if (out.waitingFor == null) delete out.waitingFor; // pgqueue 1.1
    return out;
  });
}

const interval = (v) => (typeof v === 'number' ? seconds(v) : v);

// configure's options: [argument of pgq_configure, SQL type, how a value is
// sent, the pgqueue version that has it]
const SETTINGS = {
  weight: ['weight', 'int', (v) => v, '1.0'],
  maxInFlight: ['max_in_flight', 'int', (v) => v, '1.0'],
  maxTries: ['max_tries', 'int', (v) => v, '1.0'],
  paused: ['paused', 'boolean', (v) => v, '1.0'],
  retention: ['retention', 'interval', interval, '1.1'],
  rateLimit: ['rate_limit', 'int', (v) => v, '1.2'],
  ratePeriod: ['rate_period', 'interval', interval, '1.2'],
  groupMaxInFlight: ['group_max_in_flight', 'int', (v) => v, '1.2'],
};

/**
 * pgq_configure(queue, ...) with the settings given, by name (a setting left
 * out, undefined or null, stays as it is): weight, maxInFlight (0: no cap),
 * maxTries, paused, retention (seconds, or an interval's text; pgqueue 1.1),
 * rateLimit (0: no limit) and ratePeriod (as retention; pgqueue 1.2),
 * groupMaxInFlight (at most that many jobs of one group in flight, the
 * groups served in turn; 0: no limit; pgqueue 1.2).  Only
 * the settings given are sent, so a call without the newer ones works on an
 * older pgqueue; with them, such a server's 42883 is said as
 * NeedsNewerExtension naming the version they need.
 */
export async function configure(client, queue, settings = {}) {
  const names = [];
  const values = [queue];
  let needs = null;
  for (const [key, value] of Object.entries(settings)) {
    if (!(key in SETTINGS)) throw new TypeError(`unknown setting ${key} (${Object.keys(SETTINGS).join(', ')})`);
    if (value == null) continue;
    const [arg, type, send, version] = SETTINGS[key];
    values.push(send(value));
    names.push(`${arg} => $${values.length}::${type}`);
    if (version !== '1.0' && (needs == null || version > needs)) needs = version;
  }
  // the 1.2 settings given: rate limits, groups, or both
  const groups = settings.groupMaxInFlight != null;
  const rates = settings.rateLimit != null || settings.ratePeriod != null;
  const what = {
    '1.1': 'configure with a retention',
    '1.2': groups ? (rates ? 'configure with a rateLimit, ratePeriod or groupMaxInFlight'
      : 'configure with a groupMaxInFlight') : 'configure with a rateLimit or ratePeriod',
  }[needs];
  await query(client, what ?? 'configure', `SELECT pgq_configure(${['$1', ...names].join(', ')})`, values, needs ?? '1.1');
}

/** Pauses the queue: its jobs are no longer scheduled, so not claimed (those scheduled already stay claimable). */
export async function pause(client, queue) { await configure(client, queue, { paused: true }); }

/** Lets a paused queue's jobs be scheduled again. */
export async function resume(client, queue) { await configure(client, queue, { paused: false }); }

async function one(client, what, text, values) {
  return Object.values((await query(client, what, text, values))[0])[0];
}

/** A failed job back to pending, due now; false when it is not failed (pgqueue 1.1). */
export async function retry(client, id) {
  return Boolean(await one(client, 'pgq_retry', 'SELECT pgq_retry($1) AS ok', [id]));
}

/** retry for every failed job of the queue; resolves to how many (pgqueue 1.1). */
export async function retryFailed(client, queue) {
  return Number(await one(client, 'pgq_retry_failed', 'SELECT pgq_retry_failed($1) AS n', [queue]));
}

/** Removes a job in any state, and the jobs waiting for it (pgqueue 1.2); false when there is no such job (pgqueue 1.1). */
export async function cancel(client, id) {
  return Boolean(await one(client, 'pgq_cancel', 'SELECT pgq_cancel($1) AS ok', [id]));
}

/** Removes every job of the queue in state (pending, retry, failed, or waiting: 1.2), and the jobs waiting for them; resolves to how many (pgqueue 1.1). */
export async function purge(client, queue, state = 'failed') {
  return Number(await one(client, 'pgq_purge', 'SELECT pgq_purge($1, $2) AS n', [queue, state]));
}
