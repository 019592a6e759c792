// pgqueue for Node: push jobs, and a Worker that runs async handlers for them.
//
// The producer functions run one statement on the client (or pool) they are
// given and never commit: inside the caller's transaction the jobs exist only
// if it commits.
//
// A Worker runs up to `concurrency` handlers at once under one lock_key
// (`host:pid:n`), on three connections.  The claimer claims for all the free
// handlers in one pgq_claim(key, free, ...) and starts a handler for each job
// it got: it never claims more than it can start.  After a claim that found
// jobs the next one does not wait (one statement); once one found none, the
// next one blocks while there is no work (wait => ...), in a transaction that
// first sets client_connection_check_interval, so that the server ends it if
// the worker dies meanwhile.  A queue handled with its own concurrency is
// claimed on its own within its room (see #claimLoop).  A handler with a
// timeout is given up at the timeout: its job is nacked, job.signal aborted,
// and whatever the handler does later is dropped.  The completer acks the jobs whose handler
// resolved in batches (pgq_ack_batch, every completeInterval or
// completeBatch jobs; a batch that acked fewer than it was given is rolled
// back and acked job by job, to learn which lease was lost) and nacks those
// whose handler rejected.  The heartbeat extends the leases of all the jobs
// held in one statement every lease/6.  A lost lease (pgq_extend answered
// NULL, or the ack false) means the result is not acked; a lost connection is
// made again with exponential backoff and the ack or nack resent (a second
// ack of an acked job answers false and changes nothing).  A claim whose
// answer was lost may have taken jobs for the key: the worker goes on under
// a new key and releases the old one (pgq_release) as soon as the jobs it
// ran under it are finished.  stop() (SIGTERM/SIGINT under run()) cancels
// the waiting claim, lets running handlers finish for shutdownTimeout
// seconds, sends the acks and nacks of what finished and waits for them,
// then releases what is still held.  The Worker is an EventEmitter of its
// jobs' outcomes (see the class).
//
// No statement is named (so none is prepared on the server) and no session
// state is used: workers run unchanged through PgBouncer's transaction pooling.

import { EventEmitter } from 'node:events';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';

import { needsNewer } from './admin.js';

export {
  NeedsNewerExtension, JOB_STATES, PURGE_STATES, stats, counters, jobs, configure, pause, resume, retry, retryFailed,
  cancel, purge,
} from './admin.js';

export const BATCH_LIMIT = 10000;
const TRACE_LINES = 6;
const ERROR_MAX_CHARS = 4000;
// At shutdown, how long past shutdownTimeout an ack or nack already sent may
// take before the jobs still held are released anyway (ms).
const FINISH_WAIT = 10000;

const CLAIM = 'SELECT id, queue, payload, tries, version, lock_timeout'
  + ' FROM pgq_claim($1, $2, $3::interval, $4::text[], $5::interval)';
// First in a blocking claim's transaction: while the claim waits, the server
// checks every second that the worker is still there, so that a killed
// worker's claim ends instead of taking a job for no one (transaction-local:
// PgBouncer-safe; armed when the next statement starts, hence a statement of
// its own).
const CLIENT_CHECK = "SELECT set_config('client_connection_check_interval', '1s', true)";
// The leases of many jobs in one statement; lock_timeout ($4, ms) bounds its
// wait for a row that another transaction holds (local to the statement's
// transaction: PgBouncer-safe), so that the jobs can be extended one by one.
const EXTEND = "SELECT u.id, CASE WHEN set_config('lock_timeout', $4, true) IS NOT NULL"
  + ' THEN pgq_extend(u.id, $2, $3::interval) END AS until FROM unnest($1::uuid[]) AS u(id)';
// pgq_ack_batch answers how many of the jobs it acked.  When that is fewer
// than it was given, the statement fails (with this text in the server's
// log), which rolls the acks back, and ACK_EACH says which job was not held.
const ACK_BATCH = 'SELECT CASE WHEN a.n = cardinality($1::uuid[]) THEN a.n'
  + " ELSE ('pgqueue worker: ' || (cardinality($1::uuid[]) - a.n) || ' of the batch no longer held by '"
  + " || $2::text || ', acking one by one')::int END AS n FROM (SELECT pgq_ack_batch($1::uuid[], $2::text) AS n OFFSET 0) a";
const ACK_EACH = 'SELECT u.id, pgq_ack(u.id, $2) AS ok FROM unnest($1::uuid[]) AS u(id)';
const NACK = 'SELECT pgq_nack($1, $2, $3, $4::interval) AS state';
const RELEASE = 'SELECT pgq_release($1) AS n';
const ACK = 'SELECT pgq_ack($1, $2) AS held';

// Private marks on a job: when its lease was last extended (or claimed),
// whether its ack or nack was sent, how long its handler ran (ms).
const EXTENDED = Symbol('extended');
const SENT = Symbol('sent');
const DURATION = Symbol('duration');
// The controller of job.signal; whether the handler still holds its slot;
// whether it ran past its timeout; whether shutdown gave it up (its result
// is dropped, the job released).
const ABORT = Symbol('abort');
const RUNNING = Symbol('running');
const TIMED_OUT = Symbol('timedOut');
const GIVEN_UP = Symbol('givenUp');
const TX_ACKED = Symbol('txAcked'); // job.transaction() committed its ack
const TX_ENDING = Symbol('txEnding'); // job.transaction() is acking: a timeout no longer ends the job

// Key numbers are unique in the process: two Workers never share a lock_key.
let nextKeyNumber = 0;

const seconds = (s) => (s == null ? null : `${Number(s)} seconds`);

// pgq_push's and pgq_push_batch's max_tries, after and group_key (pgqueue
// 1.2), by name and only when given: a push without them works on pgqueue
// 1.0 and 1.1 as before; with them, such a server answers 42883 (no such
// function), said as NeedsNewerExtension.  The server's 22023 (maxTries
// below 1, after over 1,000 ids, groupKey empty or over 256 bytes) comes
// through as it is.
async function pushQuery(client, what, fn, args, values, maxTries, after, groupKey) {
  const named = [['max_tries', 'int', maxTries, 'maxTries'],
    ['after', 'uuid[]', after == null ? null : parents(after), 'after'],
    ['group_key', 'text', groupKey, 'groupKey']]
    .filter(([, , v]) => v != null);
  if (named.length === 0) return client.query(`SELECT ${fn}(${args}) AS id`, values);
  const sql = named.map(([name, type], i) => `, ${name} => $${values.length + 1 + i}::${type}`).join('');
  try {
    return await client.query(`SELECT ${fn}(${args}${sql}) AS id`,
      [...values, ...named.map(([, , v]) => v)]);
  } catch (err) {
    if (err?.code === '42883') {
      throw await needsNewer(client, `${what} with ${named.map(([, , , opt]) => opt).join(' and ')}`, '1.2', err);
    }
    throw err;
  }
}

// options.after as an array of id strings: any iterable of ids, not one id.
function parents(after) {
  if (typeof after === 'string' || typeof after[Symbol.iterator] !== 'function')
    throw new TypeError('options.after takes an array of job ids, not one id');
  return Array.from(after, String);
}

/**
 * Push one job; resolves to its id.  options.after (pgqueue 1.2: flows)
 * lists the jobs it waits for: while one of them is unfinished the job is
 * waiting, and it becomes pending when the last of them is acked.
 */
export async function push(client, queue, payload = {}, options = {}) {
  const { runAfter = null, delay = null, priority = 0, dedupKey = null, maxTries = null,
    after = null, groupKey = null } = options;
  const res = await pushQuery(client, 'push', 'pgq_push',
    '$1, $2::jsonb, coalesce($3::timestamptz, now() + $4::interval), $5, $6',
    [queue, JSON.stringify(payload ?? {}), runAfter, seconds(delay), priority, dedupKey], maxTries,
    after, groupKey);
  return res.rows[0].id;
}

/**
 * Push one job per payload; resolves to their ids in payload order.
 * options.maxTries, options.after and options.groupKey apply to every job
 * of the batch.
 */
export async function pushBatch(client, queue, payloads, options = {}) {
  const { runAfter = null, delay = null, priority = 0, maxTries = null, after = null,
    groupKey = null } = options;
  const items = Array.from(payloads, (p) => JSON.stringify(p ?? {}));
  const ids = [];
  for (let i = 0; i < items.length; i += BATCH_LIMIT) {
    const res = await pushQuery(client, 'pushBatch', 'pgq_push_batch',
      '$1, $2::jsonb[], coalesce($3::timestamptz, now() + $4::interval), $5',
      [queue, items.slice(i, i + BATCH_LIMIT), runAfter, seconds(delay), priority], maxTries,
      after, groupKey);
    for (const row of res.rows) ids.push(row.id);
  }
  return ids;
}

/** Throw from a handler to give the job back after `delay` seconds. */
export class Retry extends Error {
  constructor(delay = 0, message = 'retry requested by the handler') {
    super(message);
    this.name = 'Retry';
    this.delay = delay;
  }
}

/**
 * Thrown by job.transaction() when the job is no longer this worker's (its
 * lease was lost to another claim, it was cancelled, its handler's timeout
 * or shutdown ended it): the transaction was rolled back, nothing acked.
 */
export class LeaseLost extends Error {
  constructor(message) {
    super(message);
    this.name = 'LeaseLost';
  }
}

// The connections of job.transaction(): at most `size`, each made when first
// needed and kept while it is healthy and idle.
class TxPool {
  constructor(worker, size) {
    this.worker = worker;
    this.size = size;
    this.idle = [];
    this.used = 0;
    this.waiting = [];
    this.closed = false;
  }

  async take() {
    while (this.used >= this.size) await new Promise((resolve) => { this.waiting.push(resolve); });
    this.used += 1;
    const client = this.idle.pop();
    if (client) return client;
    try {
      const fresh = new pg.Client(this.worker.connection);
      fresh.on('error', () => { fresh.broken = true; });
      await fresh.connect();
      return fresh;
    } catch (err) {
      this.give(null);
      throw err;
    }
  }

  // Back to the idle ones (null or broken: closed), and the next waiter's turn.
  give(client, broken = false) {
    this.used -= 1;
    if (client) {
      if (broken || client.broken || this.closed) client.end().catch(() => {});
      else this.idle.push(client);
    }
    this.waiting.shift()?.();
  }

  async close() {
    this.closed = true;
    await Promise.all(this.idle.splice(0).map((c) => c.end().catch(() => {})));
  }
}

/** Raised by run()/start() when the worker cannot work as configured. */
export class WorkerSetupError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'WorkerSetupError';
  }
}

/** `Name: message` and the last lines of the stack, for the job's last_error. */
export function formatError(err) {
  if (!(err instanceof Error)) return `thrown: ${String(err)}`;
  const head = `${err.name}: ${err.message}`;
  const frames = (err.stack ?? '').split('\n').filter((l) => /^\s+at /.test(l)).slice(0, TRACE_LINES);
  let text = [head, ...frames].join('\n');
  if (text.length > ERROR_MAX_CHARS) text = `${text.slice(0, 200)}\n...\n${text.slice(-(ERROR_MAX_CHARS - 205))}`;
  return text;
}

// Errors after which a new connection is the cure: network errors (no SQLSTATE),
// class 08 (connection exception, PgBouncer's too), 57P0x (server shutting down).
function isConnectionError(err) {
  const code = err?.code;
  return code == null || /^08/.test(code) || /^57P0[123]$/.test(code)
    || /^E[A-Z]+$/.test(code); // ECONNREFUSED, ECONNRESET, EPIPE, ...
}

// Errors that no reconnect will mend: undefined function (extension missing),
// insufficient privilege, invalid parameter value.
const SETUP_ERRORS = new Set(['42883', '42501', '22023']);

// What start() checks on its first connection: is pgq_claim there, and where
// is the extension (if anywhere)?
const CHECK = 'SELECT current_database() AS database,'
  + " to_regprocedure('pgq_claim(text, int, interval, text[], interval)') IS NOT NULL AS found,"
  + ' (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace'
  + "   WHERE e.extname = 'pgqueue') AS schema";

// What a worker says when pgq_claim is not there (Python's says the same).
function missingExtension(database, schema = null) {
  if (schema != null) {
    return `pgqueue is installed in schema ${schema} of database "${database}", which is not on this`
      + " connection's search_path (pgq_claim was not found): add it to the role's search_path"
      + ' (ALTER ROLE ... SET search_path = ...)';
  }
  return `the pgqueue extension is not installed in database "${database}" (pgq_claim does not exist):`
    + ' run CREATE EXTENSION pgqueue; in that database, or connect the worker to the database where it is installed';
}

const oneLine = (err) => String(err?.message ?? err).split(/\s+/).join(' ');
const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

const defaultLogger = {
  debug() {},
  info: (msg) => process.stderr.write(`pgqueue INFO ${msg}\n`),
  warn: (msg) => process.stderr.write(`pgqueue WARNING ${msg}\n`),
  error: (msg) => process.stderr.write(`pgqueue ERROR ${msg}\n`),
};

// Exponential backoff with jitter between attempts after a connection failure.
class Backoff {
  constructor(max) { this.max = max; this.delay = 0; this.failures = 0; }
  reset() { this.delay = 0; this.failures = 0; }
  // limit: the longest wait, in seconds
  async pause(log, who, what, err, signal, limit = Infinity) {
    this.failures += 1;
    this.delay = Math.min(Math.max(this.delay * 2, 0.1), this.max);
    const pause = Math.max(0, Math.min(this.delay * (0.5 + Math.random() / 2), limit));
    log.warn(`${who}: ${what} (failure ${this.failures}, next try in ${pause.toFixed(2)}s): ${oneLine(err)}`);
    await sleep(pause * 1000, signal);
  }
}

// Sends PostgreSQL's CancelRequest for the statement `client` is running
// (node-postgres has no cancel of its own).  Like libpq, it then waits for
// the other side to close the connection: PgBouncer 1.18 dies ("bad client
// state") when a cancel's client hangs up before the cancel was passed on.
function cancelStatement(client) {
  const { processID, secretKey } = client;
  if (processID == null || secretKey == null) return Promise.resolve();
  const target = client.host?.startsWith('/')
    ? { path: path.join(client.host, `.s.PGSQL.${client.port}`) }
    : { host: client.host, port: client.port };
  return new Promise((resolve) => {
    const sock = net.connect(target, () => {
      const buf = Buffer.alloc(16);
      buf.writeInt32BE(16, 0);
      buf.writeInt32BE(80877102, 4);
      buf.writeInt32BE(processID, 8);
      buf.writeInt32BE(secretKey, 12);
      sock.write(buf);
    });
    sock.setTimeout(5000, () => sock.destroy());
    sock.on('end', () => sock.end());
    sock.on('close', resolve);
    sock.on('error', resolve);
  });
}

// One connection of a worker (the claimer's, the completer's), made again
// with backoff when it is lost.
class Channel {
  constructor(worker, name) {
    this.worker = worker;
    this.name = name;
    this.client = null;
    this.connecting = null;
    this.backoff = new Backoff(worker.reconnectMaxDelay);
  }

  get who() { return `worker ${this.worker.name} (${this.name})`; }

  // Takes a connected client (start()'s first connection) as this channel's.
  adopt(client) {
    client.removeAllListeners('error');
    client.on('error', () => { if (this.client === client) this.client = null; });
    this.client = client;
  }

  // The client, connected again (after backoff pauses) when it was lost;
  // null once `signal` aborts.  One connect at a time.
  async get(signal) {
    while (!this.client) {
      if (signal.aborted) return null;
      if (!this.connecting) {
        this.connecting = (async () => {
          const client = new pg.Client(this.worker.connection);
          client.on('error', () => {});
          try {
            await client.connect();
            if (this.backoff.failures) this.worker.log.info(`${this.who}: connected again`);
            this.adopt(client);
          } catch (err) {
            client.end().catch(() => {});
            await this.backoff.pause(this.worker.log, this.who, 'cannot connect', err, signal);
          } finally {
            this.connecting = null;
          }
        })();
      }
      await this.connecting;
    }
    return this.client;
  }

  async drop(client = this.client) {
    if (this.client === client) this.client = null;
    if (client) await client.end().catch(() => {});
  }
}

/**
 * Runs handlers for the jobs of the queues registered with it.
 *
 *   const w = new Worker('postgres://app@db/app', { concurrency: 4 });
 *   w.handle('emails', async (job) => { ... });
 *   w.on('jobFailed', (job, ms, err) => { ... });
 *   await w.run();      // until SIGTERM / SIGINT
 *
 * Events: 'started' (), 'stopped' (error or null), 'jobStarted' (job),
 * 'jobSucceeded' (job, ms: acked), 'jobFailed' (job, ms, error: nacked),
 * 'leaseLost' (job, reason: its result is not recorded); ms is how long the
 * handler ran.  A listener that throws is logged, not propagated.
 */
export class Worker extends EventEmitter {
  constructor(connection = {}, options = {}) {
    super();
    const {
      concurrency = 4, lease = 30, wait = 10, shutdownTimeout = 30, retryDelay = null,
      name = `${os.hostname()}:${process.pid}`, reconnectMaxDelay = 10, logger = defaultLogger,
      startupTimeout = 30, completeInterval = 0.005, completeBatch = 100, claimDelay = 0.002,
      transactionConnections = 2,
    } = options;
    if (!(concurrency >= 1)) throw new RangeError('concurrency must be at least 1');
    if (!(lease > 0 && lease <= 7 * 86400)) throw new RangeError('lease must be between 0 and 7 days (seconds)');
    if (!(wait > 0 && wait <= 60)) throw new RangeError('wait must be more than 0 and at most 60 seconds');
    if (!(completeInterval >= 0 && completeInterval <= 60)) throw new RangeError('completeInterval must be between 0 and 60 seconds');
    if (!(completeBatch >= 1 && completeBatch <= BATCH_LIMIT)) throw new RangeError(`completeBatch must be between 1 and ${BATCH_LIMIT}`);
    if (!(claimDelay >= 0 && claimDelay <= 1)) throw new RangeError('claimDelay must be between 0 and 1 second');
    if (!(transactionConnections >= 1)) throw new RangeError('transactionConnections must be at least 1');
    this.connection = typeof connection === 'string' ? { connectionString: connection } : { ...connection };
    this.connection.application_name ??= 'pgqueue worker';
    this.concurrency = Math.floor(concurrency);
    this.lease = lease;
    this.wait = wait;
    this.shutdownTimeout = shutdownTimeout;
    this.retryDelay = retryDelay;
    this.name = name;
    this.reconnectMaxDelay = reconnectMaxDelay;
    this.startupTimeout = startupTimeout;
    this.completeInterval = completeInterval;
    this.completeBatch = Math.floor(completeBatch);
    this.claimDelay = claimDelay;
    this.txPool = new TxPool(this, Math.floor(transactionConnections));
    this.log = logger;
    this.handlers = new Map();
    this.stopping = false;
    this.stopSignal = new AbortController();
    this.fatal = null;
    this.started = false;
    this.stopped = null;
    this.key = null; // the lock_key claims use now
    this.retired = new Set(); // keys of claims whose answer was lost, to release
    this.held = new Map(); // id -> job: claimed, its ack or nack not yet answered
    this.active = new Set(); // the promises of the handlers running (until their timeout)
    this.busy = new Map(); // queue -> jobs of it whose handler runs (until its timeout)
    this.wakeClaimer = null;
    this.claimer = new Channel(this, 'claimer');
    this.claiming = null; // the claimer's client while its claim runs
    this.waitingOn = null; // the queues of the claim that waits, while it waits
    this.claimed = false; // a claim was sent: something may be held
    this.completer = new Channel(this, 'completer');
    this.outbox = []; // acks, nacks and releases to send
    this.flushTimer = null; // the completer's next flush, while acks wait
    this.sending = null; // the completer's work, while it has some
    this.heart = new Channel(this, 'heartbeat');
    this.beat = null; // the heartbeat's interval timer
    this.beating = null; // its statement, while one is on its way
    this.abandoned = new AbortController(); // aborted once stop() released what is held
  }

  /**
   * Run `handler(job)` (async) for the jobs of `queue`.  Options:
   * concurrency, the most jobs of the queue claimed or running at once
   * (1 to the worker's concurrency; default: no limit of its own);
   * timeout, seconds after which the handler is given up (job.signal
   * aborted, the job nacked with a TimeoutError, what the handler does later
   * dropped); retry, (attempt) => seconds or null, the nack's retry_in after
   * a failure (attempt is job.tries; a thrown Retry still wins; default: the
   * worker's retryDelay).
   */
  handle(queue, handler, options = {}) {
    if (this.started) throw new Error('register handlers before starting the worker');
    if (typeof handler !== 'function') throw new TypeError('handler must be a function');
    const { concurrency = null, timeout = null, retry = null, ...unknown } = options;
    const extra = Object.keys(unknown);
    if (extra.length) throw new TypeError(`unknown handler option(s): ${extra.join(', ')} (concurrency, timeout, retry)`);
    if (concurrency != null && !(Number.isInteger(concurrency) && concurrency >= 1 && concurrency <= this.concurrency)) {
      throw new RangeError(`a handler's concurrency must be an integer from 1 to the worker's concurrency (${this.concurrency})`);
    }
    if (timeout != null && !(timeout > 0 && Number.isFinite(timeout))) throw new RangeError('timeout must be a number of seconds above 0');
    if (retry != null && typeof retry !== 'function') throw new TypeError('retry must be a function (attempt) => seconds or null');
    this.handlers.set(queue, { handler, concurrency, timeout, retry });
    return this;
  }

  /** The lock_key this worker claims with (known once started). */
  get lockKey() { return this.key; }

  /** The lock_keys that may hold jobs of this worker: lockKey, and older ones not yet released (see above). */
  get lockKeys() { return this.key == null ? [] : [...this.retired, this.key]; }

  /**
   * Starts: connects (retried with backoff for up to startupTimeout seconds)
   * and checks that pgqueue is installed, then claims.  Returns a promise
   * that resolves once the worker runs, or rejects with a WorkerSetupError
   * that says what to fix (the worker is then stopped).  Once started, a
   * lost server is waited for (reconnection with backoff).
   */
  start() {
    if (this.handlers.size === 0) throw new WorkerSetupError('no handler registered: call handle(queue, fn) first');
    if (this.started) throw new Error('a Worker runs once; make a new one');
    this.started = true;
    this.key = `${this.name}:${nextKeyNumber++}`;
    const queues = [...this.handlers].sort(([a], [b]) => (a < b ? -1 : 1)).map(([q, { concurrency, timeout }]) => {
      const own = [concurrency != null && `concurrency ${concurrency}`, timeout != null && `timeout ${timeout}s`].filter(Boolean);
      return own.length ? `${q} (${own.join(', ')})` : q;
    });
    this.log.info(`worker ${this.name}: ${this.concurrency} handlers on queues ${queues.join(', ')}, lease ${this.lease}s, lock_key ${this.key}`);
    const ready = this.#checkSetup().catch((err) => {
      const setup = err instanceof WorkerSetupError ? err : new WorkerSetupError(oneLine(err), { cause: err });
      this.#fail(setup);
      throw setup;
    });
    // (handled here: a caller that drops the promise gets the error logged, not an unhandled rejection)
    this.claimLoop = ready.then(() => {
      if (!this.stopping) this.#emit('started');
      return this.#claimLoop();
    }, () => {}).catch((err) => this.#fail(err));
    this.beat = setInterval(() => this.#heartbeat(), (this.lease / 6) * 1000);
    return ready;
  }

  // The first connection, within startupTimeout, and the extension's
  // presence; the connection becomes the claimer's.
  async #checkSetup() {
    const started = Date.now();
    const deadline = started + this.startupTimeout * 1000;
    const backoff = new Backoff(this.reconnectMaxDelay);
    for (;;) {
      const client = new pg.Client({ connectionTimeoutMillis: Math.max(1000, deadline - Date.now()), ...this.connection });
      client.on('error', () => {});
      try {
        await client.connect();
      } catch (err) {
        client.end().catch(() => {});
        if (this.stopping || Date.now() >= deadline) {
          throw new WorkerSetupError(`worker ${this.name}: cannot connect to the server (${backoff.failures + 1} attempts`
            + ` in ${((Date.now() - started) / 1000).toFixed(1)}s, startupTimeout ${this.startupTimeout}s): ${oneLine(err)}:`
            + ' check the host, port and database of the connection, and that the server is up', { cause: err });
        }
        await backoff.pause(this.log, `worker ${this.name}`, 'cannot connect', err, this.stopSignal.signal,
          (deadline - Date.now()) / 1000);
        continue;
      }
      try {
        const { rows: [r] } = await client.query(CHECK);
        if (!r.found) throw new WorkerSetupError(`worker ${this.name}: ${missingExtension(r.database, r.schema)}`);
      } catch (err) {
        await client.end().catch(() => {});
        throw err;
      }
      if (this.stopping) await client.end().catch(() => {});
      else this.claimer.adopt(client);
      return;
    }
  }

  /**
   * Starts, waits for SIGTERM or SIGINT (with `signals`, the default) or
   * stop(), then stops gracefully.  Rejects with WorkerSetupError when the
   * worker had to stop because of its setup (extension missing, privilege).
   */
  async run({ signals = true } = {}) {
    const onSignal = (sig) => {
      this.log.info(`worker ${this.name}: ${sig} received, stopping`);
      this.stop();
    };
    if (signals) for (const s of ['SIGTERM', 'SIGINT']) process.on(s, onSignal);
    try {
      this.start();
      await new Promise((resolve) => {
        if (this.stopping) resolve();
        else this.stopSignal.signal.addEventListener('abort', resolve, { once: true });
      });
      await this.stop();
    } finally {
      if (signals) for (const s of ['SIGTERM', 'SIGINT']) process.off(s, onSignal);
    }
    if (this.fatal instanceof WorkerSetupError) throw this.fatal;
    if (this.fatal) throw new WorkerSetupError(this.fatal.message, { cause: this.fatal });
  }

  /** Stops gracefully (see the top of this file); resolves when done. Idempotent. */
  stop() {
    this.stopping = true;
    this.stopSignal.abort();
    this.wakeClaimer?.();
    this.stopped ??= this.#shutdown();
    return this.stopped;
  }

  async #shutdown() {
    const deadline = Date.now() + this.shutdownTimeout * 1000;
    const until = (ms) => sleep(Math.min(ms, Math.max(0, deadline - Date.now())));
    // cancel the waiting claim, again while it still waits (a cancel that
    // reached the server just before its claim started does nothing)
    let claimerDone = this.claimLoop == null;
    this.claimLoop?.then(() => { claimerDone = true; });
    while (!claimerDone && Date.now() < deadline) {
      if (this.claiming) await cancelStatement(this.claiming);
      await Promise.race([this.claimLoop, until(200)]);
    }
    // the running handlers, until the deadline
    while (this.active.size && Date.now() < deadline) await Promise.race([...this.active, until(deadline - Date.now())]);
    // the handlers still running: their jobs are released below
    const reason = new DOMException(`the worker stops: shutdownTimeout (${this.shutdownTimeout}s) ran out`, 'AbortError');
    for (const job of this.held.values()) {
      if (job[RUNNING]) {
        job[GIVEN_UP] = true;
        job[ABORT].abort(reason);
      }
    }
    // The acks and nacks of the finished handlers, sent now, must land before
    // the release, or the release commits first and a job whose handler
    // succeeded runs again.  Once abandoned, the completer sends no more.
    this.#flush();
    const sent = Date.now() + FINISH_WAIT;
    while (this.sending && Date.now() < sent) await Promise.race([this.sending, sleep(sent - Date.now())]);
    if (this.sending) this.log.error(`worker ${this.name}: acks or nacks still unanswered after ${FINISH_WAIT / 1000}s: releasing anyway`);
    this.abandoned.abort();
    clearInterval(this.beat);
    if (this.claimed) await this.#release(this.lockKeys);
    await Promise.all([this.claimer.drop(), this.completer.drop(), this.heart.drop(), this.txPool.close()]);
    this.log.info(`worker ${this.name} stopped`);
    this.#emit('stopped', this.fatal);
  }

  // pgq_release of keys at shutdown, on the claimer's connection (idle now:
  // the completer's may still wait for an answer); one attempt.
  async #release(keys) {
    const give = new AbortController();
    const timer = setTimeout(() => give.abort(), FINISH_WAIT);
    try {
      const client = await this.claimer.get(give.signal);
      if (!client) throw new Error('no connection');
      for (const key of keys) {
        const { rows: [{ n }] } = await client.query(RELEASE, [key]);
        if (n > 0) this.log.warn(`worker ${this.name}: handler still running at shutdown: released ${n} job(s) of ${key}`);
      }
    } catch (err) {
      this.log.error(`worker ${this.name}: could not release ${keys.join(', ')} at shutdown (their leases will run out instead): ${oneLine(err)}`);
    } finally {
      clearTimeout(timer);
    }
  }

  // emit() that logs what a listener throws instead of throwing it here
  #emit(event, ...args) {
    try {
      this.emit(event, ...args);
    } catch (err) {
      this.log.error(`worker ${this.name}: a '${event}' listener threw: ${oneLine(err)}`);
    }
  }

  #fail(err) {
    if (!this.fatal) {
      this.fatal = err;
      this.log.error(`worker ${this.name}: stopping: ${oneLine(err)}`);
    }
    this.stop();
  }

  // -- the claimer ---------------------------------------------------------

  // Claims while the worker runs.  After a claim that found jobs, a round of
  // claims that do not wait; once a round found none, one claim that waits
  // for work.  Without handler concurrencies a round is one claim over all
  // the queues for every free handler.  With them, a round claims for each
  // queue with one that has room (n = its room, within the free handlers
  // left), then for the queues without one (n = the free handlers left):
  // queues with a concurrency first, as they can take no more than it, so a
  // backlog elsewhere cannot starve them.  The claim that waits is over the
  // queues with room, for no more than the smallest room among them; when a
  // handler of a queue it left out (full) ends, it is cancelled, and a
  // round claims again.
  async #claimLoop() {
    const { claimer } = this;
    let busy = true;
    while (!this.stopping) {
      const free = this.#free();
      const open = free > 0 ? this.#queuesWithRoom() : [];
      if (!open.length) { // no free handler, or none for a queue with room
        await this.#untilWoken();
        continue;
      }
      if (busy && this.claimDelay > 0) await this.#gather();
      const client = await claimer.get(this.stopSignal.signal);
      if (!client || this.stopping) break;
      let got = 0;
      try {
        if (busy) {
          for (const [queues, room] of this.#round()) {
            const n = Math.min(room, this.#free());
            if (n <= 0 || this.stopping) continue;
            got += this.#startJobs(await this.#claim(client, queues, n, 0));
          }
        } else {
          const rooms = open.filter((q) => this.#limit(q) != null).map((q) => this.#room(q));
          got += this.#startJobs(await this.#claim(client, open, Math.min(free, ...rooms), this.wait));
        }
      } catch (err) {
        if (err.code === '57014') { // stop() cancelled the waiting claim, or a queue it left out has room
          busy = true;
          continue;
        }
        if (SETUP_ERRORS.has(err.code)) {
          this.#fail(err.code !== '42883' ? err
            : new WorkerSetupError(`${missingExtension(client.database)}: ${err.message}`, { cause: err }));
          break;
        }
        const lost = isConnectionError(err);
        if (lost) {
          await claimer.drop(client);
          this.#newKey();
        }
        await claimer.backoff.pause(this.log, claimer.who, lost ? 'connection lost while claiming' : 'claim failed', err, this.stopSignal.signal);
        continue;
      }
      claimer.backoff.reset();
      if (this.abandoned.signal.aborted) break; // a claim that outlived shutdown: #release gave its jobs back
      busy = got > 0;
    }
  }

  // Jobs are coming (the last claim found some) and a handler has ended:
  // wait up to claimDelay for the others to end too, so that one claim
  // takes a job for each rather than one claim per job.
  async #gather() {
    const until = performance.now() + this.claimDelay * 1000;
    while (!this.stopping && this.#free() < this.concurrency) {
      const left = until - performance.now();
      if (left <= 0) break;
      await this.#untilWoken(left);
    }
  }

  // Until a handler ends or stop() is called (wakeClaimer), or ms have passed.
  async #untilWoken(ms = null) {
    await new Promise((resolve) => {
      const timer = ms == null ? null : setTimeout(resolve, ms);
      this.wakeClaimer = () => { clearTimeout(timer); resolve(); };
    });
    this.wakeClaimer = null;
  }

  // Handlers free now (and no more than completeBatch jobs waiting for their ack).
  #free() {
    return Math.min(this.concurrency - this.active.size, this.concurrency + this.completeBatch - this.held.size);
  }

  #limit(queue) { return this.handlers.get(queue).concurrency; }

  // How many more jobs of a queue with a concurrency of its own may start.
  #room(queue) { return this.#limit(queue) - (this.busy.get(queue) ?? 0); }

  // The queues a claim may take jobs of now, sorted.
  #queuesWithRoom() {
    return [...this.handlers.keys()].filter((q) => this.#limit(q) == null || this.#room(q) > 0).sort();
  }

  // A round's claims that do not wait: [[queues, most], ...], the most
  // taken down to the free handlers left when each is sent.
  #round() {
    const all = [...this.handlers.keys()].sort();
    const unlimited = all.filter((q) => this.#limit(q) == null);
    if (unlimited.length === all.length) return [[all, Infinity]];
    const claims = all.filter((q) => this.#limit(q) != null).map((q) => [[q], this.#room(q)]);
    if (unlimited.length) claims.push([unlimited, Infinity]);
    return claims;
  }

  // One pgq_claim; with wait (seconds), in a transaction that first sets
  // client_connection_check_interval.  A claim that fails (a cancel too)
  // rolls its transaction back, so that the client is reusable; a client
  // whose ROLLBACK fails is dropped.
  async #claim(client, queues, n, wait) {
    const args = [this.key, n, seconds(this.lease), queues, seconds(wait)];
    this.claiming = client;
    this.claimed = true;
    try {
      if (!wait) return (await client.query(CLAIM, args)).rows;
      this.waitingOn = queues;
      await client.query('BEGIN');
      try {
        await client.query(CLIENT_CHECK);
        const { rows } = await client.query(CLAIM, args);
        await client.query('COMMIT');
        return rows;
      } catch (err) {
        this.claiming = null; // stop() cancels no ROLLBACK
        if (!isConnectionError(err)) await client.query('ROLLBACK').catch(() => this.claimer.drop(client));
        throw err; // (a lost connection: the caller drops the client)
      }
    } finally {
      this.claiming = null;
      this.waitingOn = null;
    }
  }

  // A claim answered after shutdown released the keys starts no handler.
  #startJobs(rows) {
    if (this.abandoned.signal.aborted) return 0;
    for (const row of rows) this.#startJob(row);
    return rows.length;
  }

  // The last claim's answer never came: it may have taken jobs for the key.
  // Claims go on under a new key; the old one is released (pgq_release)
  // once the jobs known to hold it are finished.
  #newKey() {
    const old = this.key;
    this.key = `${this.name}:${nextKeyNumber++}`;
    this.retired.add(old);
    this.log.warn(`worker ${this.name}: a claim's answer was lost: claiming as ${this.key} now, ${old} is released once its jobs are done`);
    this.#post({ release: old });
  }

  #startJob(row) {
    const abort = new AbortController();
    const job = {
      id: row.id, queue: row.queue, payload: row.payload, tries: row.tries,
      version: row.version, lockTimeout: row.lock_timeout, lockKey: this.key, leaseLost: false,
      signal: abort.signal,
    };
    job[ABORT] = abort;
    job.transaction = (fn) => this.#transaction(job, fn);
    job[EXTENDED] = Date.now();
    job[RUNNING] = true;
    this.held.set(job.id, job);
    this.busy.set(job.queue, (this.busy.get(job.queue) ?? 0) + 1);
    this.#emit('jobStarted', job);
    const run = this.#runJob(job).catch((err) => this.log.error(`${job.lockKey}: job ${job.id}: ${oneLine(err)}`));
    this.active.add(run);
    run.finally(() => {
      job[RUNNING] = false;
      this.active.delete(run);
      this.busy.set(job.queue, this.busy.get(job.queue) - 1);
      this.wakeClaimer?.();
      // the claim waiting now left this queue out (it was full): claim again
      if (this.waitingOn && !this.waitingOn.includes(job.queue) && this.claiming && !this.stopping) {
        this.waitingOn = null;
        cancelStatement(this.claiming);
      }
    });
  }

  // Runs the job's handler (until its timeout, if it has one), then queues
  // its ack or nack.
  async #runJob(job) {
    const { handler, timeout, retry } = this.handlers.get(job.queue);
    let error = null;
    let retryIn = this.retryDelay;
    let thrown;
    const t0 = performance.now();
    const outcome = (async () => { await handler(job); })().then(() => ({ ok: true }), (err) => ({ ok: false, err }));
    let timer;
    let result = timeout == null ? await outcome : await Promise.race([outcome,
      new Promise((resolve) => { timer = setTimeout(resolve, timeout * 1000, null); })]);
    clearTimeout(timer);
    // job.transaction() is acking it: the transaction ends the job, not the timeout
    if (result == null && job[TX_ENDING]) result = await outcome;
    job[DURATION] = performance.now() - t0;
    if (result == null) {
      // timed out: the slot is free again, the lease no longer extended,
      // and whatever the handler does from now on is dropped
      job[TIMED_OUT] = true;
      thrown = new DOMException(`handler ran longer than ${timeout}s`, 'TimeoutError');
      job[ABORT].abort(thrown);
      outcome.then(({ ok }) => this.log.info(`${job.lockKey}: job ${job.id}: its handler ${ok ? 'resolved' : 'rejected'}`
        + ` ${((performance.now() - t0) / 1000).toFixed(1)}s after it started, past its timeout: dropped`));
      error = `${thrown.name}: ${thrown.message}`;
      retryIn = this.#retryIn(job, retry);
      this.log.warn(`${job.lockKey}: job ${job.id} of ${job.queue} failed on try ${job.tries}: ${error}`);
    } else if (!result.ok) {
      thrown = result.err;
      if (thrown instanceof Retry) {
        error = `Retry: ${thrown.message}`;
        retryIn = thrown.delay;
        this.log.info(`${job.lockKey}: job ${job.id} of ${job.queue} given back on try ${job.tries} (Retry in ${thrown.delay}s): ${thrown.message}`);
      } else {
        error = formatError(thrown);
        retryIn = this.#retryIn(job, retry);
        this.log.warn(`${job.lockKey}: job ${job.id} of ${job.queue} failed on try ${job.tries}: ${thrown?.name}: ${thrown?.message}`);
      }
    }
    if (this.abandoned.signal.aborted || job[GIVEN_UP]) {
      this.log.warn(`${job.lockKey}: job ${job.id} finished after shutdown gave it up: result dropped`);
      this.#forget(job);
      return;
    }
    if (job[TX_ACKED]) { // its transaction acked it
      if (error != null) this.log.warn(`${job.lockKey}: job ${job.id} threw after its transaction acked it: not nacked`);
      this.#emit('jobSucceeded', job, job[DURATION]);
      this.#forget(job);
      return;
    }
    if (job.leaseLost) {
      this.log.error(`${job.lockKey}: lease of job ${job.id} was lost while its handler ran: result not ${error == null ? 'acked' : 'nacked'}`);
      this.#forget(job);
      return;
    }
    if (error == null) this.#post({ ack: job });
    else this.#post({ nack: job, error, retryIn, thrown });
  }

  // job.transaction(fn): fn(client) in a transaction on a connection of the
  // pool, then pgq_ack in the same transaction, and COMMIT: the handler's
  // writes and the ack commit together or not at all.  An ack that finds the
  // job no longer held rolls back and throws LeaseLost.
  async #transaction(job, fn) {
    if (job[TX_ACKED]) throw new Error(`job ${job.id} was acked in a transaction already`);
    this.#checkOurs(job);
    const client = await this.txPool.take();
    let broken = false;
    try {
      await client.query('BEGIN');
      let value;
      try {
        value = await fn(client);
        this.#checkOurs(job);
        job[TX_ENDING] = true;
        const { rows: [{ held }] } = await client.query(ACK, [job.id, job.lockKey]);
        if (!held) {
          this.#leaseLost(job, 'its ack in job.transaction() answered false: another worker took it, or it was cancelled');
          throw new LeaseLost(`job ${job.id} is no longer held by ${job.lockKey} (its lease was lost): its transaction is rolled back`);
        }
        await client.query('COMMIT');
      } catch (err) {
        job[TX_ENDING] = false;
        await client.query('ROLLBACK').catch(() => { broken = true; });
        throw err;
      }
      job[TX_ACKED] = true;
      return value;
    } catch (err) {
      if (isConnectionError(err)) broken = true;
      throw err;
    } finally {
      this.txPool.give(client, broken);
    }
  }

  // Throws LeaseLost when the job is no longer the handler's to end.
  #checkOurs(job) {
    let why = null;
    if (job.leaseLost) why = 'its lease was lost';
    else if (job[TIMED_OUT]) why = 'its handler ran longer than its timeout and the job was nacked';
    else if (job[GIVEN_UP] || this.abandoned.signal.aborted) why = 'the worker gave it up at shutdown';
    if (why) throw new LeaseLost(`job ${job.id} is no longer this worker's (${why}): its transaction is rolled back, not acked`);
  }

  // The nack's retry_in after a failure: the handler's retry policy's answer
  // for this attempt, or the worker's retryDelay.
  #retryIn(job, policy) {
    if (policy == null) return this.retryDelay;
    let delay;
    try {
      delay = policy(job.tries);
    } catch (err) {
      this.log.error(`${job.lockKey}: job ${job.id}: the retry policy of ${job.queue} threw (retryDelay used): ${oneLine(err)}`);
      return this.retryDelay;
    }
    if (delay === null || (typeof delay === 'number' && delay >= 0 && Number.isFinite(delay))) return delay;
    this.log.error(`${job.lockKey}: job ${job.id}: the retry policy of ${job.queue} answered ${String(delay)}, not seconds or null (retryDelay used)`);
    return this.retryDelay;
  }

  // -- the heartbeat -------------------------------------------------------

  // Every lease/6: one statement extends the leases of the jobs held (their
  // handler runs, or their ack waits) last extended lease/3 ago or more.
  #heartbeat() {
    if (this.beating || this.abandoned.signal.aborted) return;
    const due = Date.now() - (this.lease / 3) * 1000;
    const jobs = [...this.held.values()].filter((j) => !j.leaseLost && !j[SENT] && !j[TIMED_OUT] && !j[TX_ACKED] && j[EXTENDED] <= due);
    if (!jobs.length) return;
    this.beating = this.#extend(jobs).finally(() => { this.beating = null; });
  }

  async #extend(jobs) {
    const { heart } = this;
    const wait = String(Math.round(Math.min(this.lease / 6, 10) * 1000));
    let client;
    try {
      client = await heart.get(this.abandoned.signal);
      if (!client) return;
      for (const [key, group] of byKey(jobs)) {
        const extend = async (ids) => (await client.query(EXTEND, [ids, key, seconds(this.lease), wait])).rows;
        const sentAt = Date.now();
        let rows;
        try {
          rows = await extend(group.map((j) => j.id));
        } catch (err) {
          if (err.code !== '55P03') throw err;
          // a row held by another transaction (lock_timeout): one by one
          rows = [];
          const waited = group.length === 1 ? group : [];
          for (const job of group.length > 1 ? group : []) {
            try {
              rows.push(...await extend([job.id]));
            } catch (e) {
              if (e.code !== '55P03') throw e;
              waited.push(job);
            }
          }
          for (const job of waited) this.log.warn(`${key}: extending job ${job.id} waited too long for its row, next beat tries again`);
        }
        if (this.abandoned.signal.aborted) return; // stop() released the jobs meanwhile
        for (const { id, until } of rows) {
          const job = this.held.get(id);
          if (!job || job[SENT] || job[TX_ENDING] || job[TX_ACKED]) continue; // its ack or nack answers for it
          if (until == null) this.#leaseLost(job, 'pgq_extend answered NULL');
          else { job.lockTimeout = until; job[EXTENDED] = sentAt; }
        }
      }
      heart.backoff.reset();
    } catch (err) {
      this.log.warn(`worker ${this.name}: extending ${jobs.length} job(s) failed, next beat tries again: ${oneLine(err)}`);
      if (isConnectionError(err)) await heart.drop(client);
    }
  }

  #leaseLost(job, why, result = 'acked') {
    if (job.leaseLost) return;
    job.leaseLost = true;
    this.log.error(`${job.lockKey}: lease of job ${job.id} lost (${why}): its result is not ${result}`);
    this.#emit('leaseLost', job, why);
  }

  // -- the completer -----------------------------------------------------

  // The job is no longer held by this worker (answered, lost or dropped);
  // a retired key that held it may be released now.
  #forget(job) {
    this.held.delete(job.id);
    this.wakeClaimer?.();
    if (job.lockKey !== this.key && this.retired.has(job.lockKey)) this.#post({ release: job.lockKey });
  }

  // Queues an ack ({ack: job}), a nack ({nack: job, error, retryIn}) or the
  // release of a retired key ({release}).  Acks wait completeInterval for
  // others (or until completeBatch wait), the rest goes at once.
  #post(item) {
    this.outbox.push(item);
    if (item.ack == null || this.outbox.length >= this.completeBatch) this.#flush();
    else this.flushTimer ??= setTimeout(() => this.#flush(), this.completeInterval * 1000);
  }

  // Sends what the outbox holds now (and what comes meanwhile).
  #flush() {
    clearTimeout(this.flushTimer);
    this.flushTimer = null;
    if (!this.outbox.length) return;
    this.sending ??= this.#send().finally(() => { this.sending = null; });
  }

  // Acks in batches (one statement per key and completeBatch jobs), then
  // nacks one by one, then releases, until the outbox is empty.
  async #send() {
    while (this.outbox.length && !this.abandoned.signal.aborted) {
      const items = this.outbox.splice(0);
      clearTimeout(this.flushTimer);
      this.flushTimer = null;
      const acks = [];
      for (const { ack } of items) {
        if (ack == null) continue;
        if (ack.leaseLost) { // found lost by the heartbeat since its handler ended
          this.log.error(`${ack.lockKey}: job ${ack.id} not acked: its lease was lost`);
          this.#forget(ack);
        } else {
          ack[SENT] = true;
          acks.push(ack);
        }
      }
      for (const [key, group] of byKey(acks)) {
        for (let i = 0; i < group.length; i += this.completeBatch) await this.#ack(key, group.slice(i, i + this.completeBatch));
      }
      for (const item of items) {
        if (item.nack != null) await this.#nack(item.nack, item.error, item.retryIn, item.thrown);
        else if (item.release != null) await this.#releaseRetired(item.release);
      }
    }
  }

  // Runs the statement on the completer's connection, made again and the
  // statement resent after a lost connection (or a stray cancel: rolled
  // back); {rows, resent}, or null once stop() released the jobs.
  async #resend(what, text, values) {
    const { completer } = this;
    let resent = false;
    for (;;) {
      const client = await completer.get(this.abandoned.signal);
      if (!client) return null;
      try {
        const { rows } = await client.query(text, values);
        completer.backoff.reset();
        return { rows, resent };
      } catch (err) {
        if (err.code !== '57014' && !isConnectionError(err)) throw err;
        resent = true;
        if (err.code === '57014') continue;
        await completer.drop(client);
        await completer.backoff.pause(this.log, completer.who, `connection lost ${what}`, err, this.abandoned.signal);
      }
    }
  }

  // pgq_ack_batch of jobs held by key; when it acked fewer, ACK_EACH says
  // which were no longer held: their leases were lost.
  async #ack(key, jobs) {
    const ids = jobs.map((j) => j.id);
    const what = `acking ${jobs.length} job(s)`;
    try {
      let answer;
      try {
        answer = await this.#resend(what, ACK_BATCH, [ids, key]);
      } catch (err) {
        if (!(err.code === '22P02' && /no longer held/.test(err.message))) {
          this.log.warn(`${key}: ${what} in one statement failed, acking one by one: ${oneLine(err)}`);
        }
        answer = await this.#resend(what, ACK_EACH, [ids, key]);
      }
      if (answer == null) {
        this.log.warn(`${key}: ${jobs.length} job(s) released at shutdown before their ack was answered`);
        return;
      }
      const all = answer.rows.length === 1 && answer.rows[0].n != null;
      const acked = new Map(all ? ids.map((id) => [id, true]) : answer.rows.map((r) => [r.id, r.ok]));
      for (const job of jobs) {
        if (acked.get(job.id)) {
          this.#emit('jobSucceeded', job, job[DURATION]);
        } else if (answer.resent) {
          this.log.info(`${key}: ack of job ${job.id} answered false: the ack sent before the connection was lost committed`);
          this.#emit('jobSucceeded', job, job[DURATION]);
        } else {
          this.#leaseLost(job, 'its ack answered false: another worker took it, or it was cancelled');
        }
      }
    } catch (err) {
      this.log.error(`${key}: could not ack ${jobs.length} job(s) (their leases will run out): ${oneLine(err)}`);
    } finally {
      for (const job of jobs) this.#forget(job);
    }
  }

  async #nack(job, error, retryIn, thrown) {
    job[SENT] = true;
    try {
      const answer = await this.#resend(`nacking job ${job.id}`, NACK, [job.id, job.lockKey, error, seconds(retryIn)]);
      if (answer == null) {
        this.log.warn(`${job.lockKey}: job ${job.id} released at shutdown before its nack was answered`);
      } else if (answer.rows[0].state == null && !answer.resent) {
        this.#leaseLost(job, 'its nack answered NULL: another worker took it, or it was cancelled', 'nacked');
      } else {
        if (answer.rows[0].state === 'failed') {
          this.log.warn(`${job.lockKey}: job ${job.id} of ${job.queue} failed for good after ${job.tries} tries`);
        }
        this.#emit('jobFailed', job, job[DURATION], thrown);
      }
    } catch (err) {
      this.log.error(`${job.lockKey}: could not nack job ${job.id} (its lease will run out): ${oneLine(err)}`);
    } finally {
      this.#forget(job);
    }
  }

  // pgq_release of a retired key once no job it holds is still known here.
  async #releaseRetired(key) {
    if (!this.retired.has(key)) return;
    for (const job of this.held.values()) if (job.lockKey === key) return;
    try {
      const answer = await this.#resend(`releasing ${key}`, RELEASE, [key]);
      if (answer == null) return;
      this.retired.delete(key);
      this.log.info(`worker ${this.name}: released ${answer.rows[0].n} job(s) of ${key}, claimed before a connection was lost`);
    } catch (err) {
      this.log.warn(`worker ${this.name}: releasing ${key} failed (tried again at shutdown): ${oneLine(err)}`);
    }
  }
}

// jobs grouped by lock_key: [[key, jobs], ...]
function byKey(jobs) {
  const groups = new Map();
  for (const job of jobs) {
    if (!groups.has(job.lockKey)) groups.set(job.lockKey, []);
    groups.get(job.lockKey).push(job);
  }
  return groups;
}
