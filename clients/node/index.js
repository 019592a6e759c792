// pgqueue for Node: push jobs, and a Worker that runs async handlers for them.
//
// The producer functions run one statement on the client (or pool) they are
// given and never commit: inside the caller's transaction the jobs exist only
// if it commits.
//
// A Worker runs `concurrency` slots, each with its own connection and
// lock_key (`host:pid:n`): a blocking claim (pgq_claim(..., wait => ...)) of
// one job of the registered queues, the queue's handler, then pgq_ack when it
// resolves or pgq_nack with the error when it rejects.  While a handler runs,
// the job's lease is extended every third of the lease on the slot's
// connection.  A lost lease (pgq_extend answered NULL) means the result is not
// acked; a lost connection is made again with exponential backoff and the ack
// or nack resent (a second ack of an acked job answers false and changes
// nothing); a claim whose answer was lost is undone with pgq_release.  stop()
// (SIGTERM/SIGINT under run()) cancels waiting claims, lets running handlers
// finish for shutdownTimeout seconds, waits for any ack or nack already sent,
// then releases what is still held.
//
// No statement is named (so none is prepared on the server) and no session
// state is used: workers run unchanged through PgBouncer's transaction pooling.

import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';

export const BATCH_LIMIT = 10000;
const TRACE_LINES = 6;
const ERROR_MAX_CHARS = 4000;
// At shutdown, how long past shutdownTimeout an ack or nack already sent may
// take before the jobs still held are released anyway (ms).
const FINISH_WAIT = 10000;

const CLAIM = 'SELECT id, queue, payload, tries, version, lock_timeout'
  + ' FROM pgq_claim($1, 1, $2::interval, $3::text[], $4::interval)';
const EXTEND = 'SELECT pgq_extend($1, $2, $3::interval) AS until';
const ACK = 'SELECT pgq_ack($1, $2) AS ok';
const NACK = 'SELECT pgq_nack($1, $2, $3, $4::interval) AS state';
const RELEASE = 'SELECT pgq_release($1) AS n';

// Slot numbers are unique in the process: two Workers never share a lock_key.
let nextSlotNumber = 0;

const seconds = (s) => (s == null ? null : `${Number(s)} seconds`);

/** Push one job; resolves to its id. */
export async function push(client, queue, payload = {}, options = {}) {
  const { runAfter = null, delay = null, priority = 0, dedupKey = null } = options;
  const res = await client.query(
    'SELECT pgq_push($1, $2::jsonb, coalesce($3::timestamptz, now() + $4::interval), $5, $6) AS id',
    [queue, JSON.stringify(payload ?? {}), runAfter, seconds(delay), priority, dedupKey],
  );
  return res.rows[0].id;
}

/** Push one job per payload; resolves to their ids in payload order. */
export async function pushBatch(client, queue, payloads, options = {}) {
  const { runAfter = null, delay = null, priority = 0 } = options;
  const items = Array.from(payloads, (p) => JSON.stringify(p ?? {}));
  const ids = [];
  for (let i = 0; i < items.length; i += BATCH_LIMIT) {
    const res = await client.query(
      'SELECT pgq_push_batch($1, $2::jsonb[], coalesce($3::timestamptz, now() + $4::interval), $5) AS id',
      [queue, items.slice(i, i + BATCH_LIMIT), runAfter, seconds(delay), priority],
    );
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

/**
 * Runs handlers for the jobs of the queues registered with it.
 *
 *   const w = new Worker('postgres://app@db/app', { concurrency: 4 });
 *   w.handle('emails', async (job) => { ... });
 *   await w.run();      // until SIGTERM / SIGINT
 */
export class Worker {
  constructor(connection = {}, options = {}) {
    const {
      concurrency = 4, lease = 30, wait = 10, shutdownTimeout = 30, retryDelay = null,
      name = `${os.hostname()}:${process.pid}`, reconnectMaxDelay = 10, logger = defaultLogger,
      startupTimeout = 30,
    } = options;
    if (!(concurrency >= 1)) throw new RangeError('concurrency must be at least 1');
    if (!(lease > 0 && lease <= 7 * 86400)) throw new RangeError('lease must be between 0 and 7 days (seconds)');
    if (!(wait > 0 && wait <= 60)) throw new RangeError('wait must be more than 0 and at most 60 seconds');
    this.connection = typeof connection === 'string' ? { connectionString: connection } : { ...connection };
    this.connection.application_name ??= 'pgqueue worker';
    this.concurrency = concurrency;
    this.lease = lease;
    this.wait = wait;
    this.shutdownTimeout = shutdownTimeout;
    this.retryDelay = retryDelay;
    this.name = name;
    this.reconnectMaxDelay = reconnectMaxDelay;
    this.startupTimeout = startupTimeout;
    this.log = logger;
    this.handlers = new Map();
    this.slots = [];
    this.stopping = false;
    this.stopSignal = new AbortController();
    this.fatal = null;
    this.loops = [];
    this.stopped = null;
  }

  /** Run `handler(job)` (async) for the jobs of `queue`. */
  handle(queue, handler) {
    if (this.loops.length) throw new Error('register handlers before starting the worker');
    this.handlers.set(queue, handler);
    return this;
  }

  /** The lock_keys of this worker's slots (known once started). */
  get lockKeys() { return this.slots.map((s) => s.lockKey); }

  /**
   * Starts: connects (retried with backoff for up to startupTimeout seconds)
   * and checks that pgqueue is installed, then runs the slots.  Returns a
   * promise that resolves once the slots run, or rejects with a
   * WorkerSetupError that says what to fix (the worker is then stopped).
   * Once started, a lost server is waited for (reconnection with backoff).
   */
  start() {
    if (this.handlers.size === 0) throw new WorkerSetupError('no handler registered: call handle(queue, fn) first');
    if (this.loops.length) throw new Error('a Worker runs once; make a new one');
    for (let i = 0; i < this.concurrency; i++) {
      const n = nextSlotNumber++;
      this.slots.push({
        number: n, lockKey: `${this.name}:${n}`, client: null, state: 'idle', finishing: null,
        backoff: new Backoff(this.reconnectMaxDelay), abandoned: new AbortController(),
      });
    }
    this.log.info(`worker ${this.name}: ${this.concurrency} slots on queues ${[...this.handlers.keys()].sort().join(', ')}, lease ${this.lease}s`);
    const ready = this.#checkSetup().catch((err) => {
      const setup = err instanceof WorkerSetupError ? err : new WorkerSetupError(oneLine(err), { cause: err });
      this.#fail(setup);
      throw setup;
    });
    // (handled here: a caller that drops the promise gets the error logged, not an unhandled rejection)
    const ok = ready.then(() => true, () => false);
    this.loops = this.slots.map((slot) => ok.then((go) => go && this.#slotLoop(slot)).catch((err) => this.#fail(err)));
    return ready;
  }

  // The first connection, within startupTimeout, and the extension's presence.
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
        return;
      } finally {
        await client.end().catch(() => {});
      }
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
    this.stopped ??= this.#shutdown();
    return this.stopped;
  }

  async #shutdown() {
    const deadline = Date.now() + this.shutdownTimeout * 1000;
    const finished = new Set();
    this.loops.forEach((p, i) => p.then(() => finished.add(i)));
    // cancel waiting claims, again while one still waits (a cancel that
    // reached the server just before its claim started does nothing)
    while (finished.size < this.loops.length && Date.now() < deadline) {
      await Promise.all(this.slots.map((s) => (s.state === 'claiming' && s.client ? cancelStatement(s.client) : null)));
      await Promise.race([Promise.all(this.loops), sleep(Math.min(200, Math.max(0, deadline - Date.now())))]);
    }
    const left = this.slots.filter((_, i) => !finished.has(i));
    // An ack or nack on its way must land before the release, or the release
    // commits first and a job whose handler succeeded runs again.  Once
    // abandoned (aborted with no await after the wait), a slot sends no more.
    for (const slot of left) {
      const until = Date.now() + FINISH_WAIT;
      while (slot.finishing && Date.now() < until) {
        await Promise.race([slot.finishing.catch(() => {}), sleep(until - Date.now())]);
      }
      if (slot.finishing) this.log.error(`worker ${this.name}: ${slot.lockKey}: an ack or nack still unanswered after ${FINISH_WAIT / 1000}s: releasing anyway`);
      slot.abandoned.abort();
    }
    if (left.length) await this.#release(left.map((s) => s.lockKey));
    await Promise.all(this.slots.map((s) => (left.includes(s) ? null : this.#dropClient(s))));
    this.log.info(`worker ${this.name} stopped`);
  }

  async #release(keys) {
    const client = new pg.Client(this.connection);
    client.on('error', () => {});
    try {
      await client.connect();
      for (const key of keys) {
        const { rows } = await client.query(RELEASE, [key]);
        this.log.warn(`worker ${this.name}: handler still running at shutdown: released ${rows[0].n} job(s) of ${key}`);
      }
    } catch (err) {
      this.log.error(`worker ${this.name}: could not release ${keys.join(', ')} at shutdown (their leases will run out instead): ${oneLine(err)}`);
    } finally {
      await client.end().catch(() => {});
    }
  }

  // -- connections --------------------------------------------------------

  // The slot's client, connected again (after backoff pauses) when it was
  // lost; null once `signal` aborts.  One connect at a time per slot.
  async #slotClient(slot, signal) {
    while (!slot.client) {
      if (signal.aborted) return null;
      if (!slot.connecting) {
        slot.connecting = (async () => {
          const client = new pg.Client(this.connection);
          client.on('error', () => { if (slot.client === client) slot.client = null; });
          try {
            await client.connect();
            if (slot.backoff.failures) this.log.info(`${slot.lockKey}: connected again`);
            slot.client = client;
          } catch (err) {
            client.end().catch(() => {});
            await slot.backoff.pause(this.log, slot.lockKey, 'cannot connect', err, signal);
          } finally {
            slot.connecting = null;
          }
        })();
      }
      await slot.connecting;
    }
    return slot.client;
  }

  async #dropClient(slot, client = slot.client) {
    if (slot.client === client) slot.client = null;
    if (client) await client.end().catch(() => {});
  }

  #fail(err) {
    if (!this.fatal) {
      this.fatal = err;
      this.log.error(`worker ${this.name}: stopping: ${oneLine(err)}`);
    }
    this.stop();
  }

  // -- one slot ------------------------------------------------------------

  async #slotLoop(slot) {
    const queues = [...this.handlers.keys()].sort();
    let claimLost = false;
    while (!this.stopping) {
      const client = await this.#slotClient(slot, this.stopSignal.signal);
      if (!client) break;
      let row;
      try {
        if (claimLost) {
          // the last claim's answer never came: it may have taken a job for
          // this key; give any such job back at once
          const { rows } = await client.query(RELEASE, [slot.lockKey]);
          if (rows[0].n > 0) this.log.info(`${slot.lockKey}: released ${rows[0].n} job(s) claimed before the connection was lost`);
          claimLost = false;
        }
        if (this.stopping) break;
        slot.state = 'claiming';
        try {
          ({ rows: [row] } = await client.query(CLAIM, [slot.lockKey, seconds(this.lease), queues, seconds(this.wait)]));
        } finally {
          slot.state = 'idle';
        }
      } catch (err) {
        if (err.code === '57014') continue; // stop() cancelled the waiting claim
        if (SETUP_ERRORS.has(err.code)) {
          this.#fail(err.code !== '42883' ? err
            : new WorkerSetupError(`${missingExtension(client.database)}: ${err.message}`, { cause: err }));
          break;
        }
        if (isConnectionError(err)) {
          await this.#dropClient(slot, client);
          claimLost = true;
        }
        await slot.backoff.pause(this.log, slot.lockKey, claimLost ? 'connection lost while claiming' : 'claim failed', err, this.stopSignal.signal);
        continue;
      }
      slot.backoff.reset();
      if (!row) continue;
      const job = {
        id: row.id, queue: row.queue, payload: row.payload, tries: row.tries,
        version: row.version, lockTimeout: row.lock_timeout, lockKey: slot.lockKey, leaseLost: false,
      };
      slot.state = 'running';
      try {
        await this.#runJob(slot, job);
      } finally {
        slot.state = 'idle';
      }
    }
  }

  async #runJob(slot, job) {
    const handler = this.handlers.get(job.queue);
    const beat = setInterval(() => this.#extend(slot, job), (this.lease / 3) * 1000);
    let error = null;
    let retryIn = this.retryDelay;
    try {
      await handler(job);
    } catch (err) {
      if (err instanceof Retry) {
        error = `Retry: ${err.message}`;
        retryIn = err.delay;
      } else {
        error = formatError(err);
        this.log.warn(`${slot.lockKey}: job ${job.id} of ${job.queue} failed on try ${job.tries}: ${err?.name}: ${err?.message}`);
      }
    } finally {
      clearInterval(beat);
      await job.extending;
    }
    if (slot.abandoned.signal.aborted) {
      this.log.warn(`${slot.lockKey}: job ${job.id} finished after shutdown released it: result dropped`);
      return;
    }
    if (job.leaseLost) {
      this.log.error(`${slot.lockKey}: lease of job ${job.id} was lost while its handler ran: result not ${error == null ? 'acked' : 'nacked'}`);
      return;
    }
    await this.#finish(slot, job, error, retryIn);
  }

  // One extension of the job's lease on the slot's connection (idle while the
  // handler runs); a lost connection is made again by the next beat.
  #extend(slot, job) {
    if (job.extending || job.leaseLost) return;
    job.extending = (async () => {
      try {
        const client = await this.#slotClient(slot, slot.abandoned.signal);
        if (!client) return;
        const { rows } = await client.query(EXTEND, [job.id, job.lockKey, seconds(this.lease)]);
        if (rows[0].until == null) {
          job.leaseLost = true;
          this.log.error(`${job.lockKey}: lease of job ${job.id} lost (pgq_extend answered NULL): its result will not be acked`);
        } else {
          job.lockTimeout = rows[0].until;
        }
      } catch (err) {
        this.log.warn(`${job.lockKey}: extending job ${job.id} failed, next beat tries again: ${oneLine(err)}`);
        if (isConnectionError(err)) await this.#dropClient(slot);
      } finally {
        job.extending = null;
      }
    })();
  }

  // Ack (error null) or nack the job, resent across lost connections.
  async #finish(slot, job, error, retryIn) {
    let resent = false;
    for (;;) {
      const client = await this.#slotClient(slot, slot.abandoned.signal);
      if (!client) return;
      if (slot.abandoned.signal.aborted) { // stop() released the job meanwhile
        this.log.warn(`${slot.lockKey}: job ${job.id} released at shutdown before its ${error == null ? 'ack' : 'nack'} was sent`);
        return;
      }
      // what stop() waits for before it releases (sent at once)
      slot.finishing = (async () => (error == null ? client.query(ACK, [job.id, slot.lockKey])
        : client.query(NACK, [job.id, slot.lockKey, error, seconds(retryIn)])))();
      try {
        const { rows } = await slot.finishing.finally(() => { slot.finishing = null; });
        if (error == null) {
          if (!rows[0].ok) {
            const why = resent ? 'the ack sent before the connection was lost committed'
              : 'the job is no longer held (lease lost)';
            this.log[resent ? 'info' : 'error'](`${slot.lockKey}: ack of job ${job.id} answered false: ${why}`);
          }
        } else {
          if (rows[0].state == null && !resent) this.log.error(`${slot.lockKey}: nack of job ${job.id}: the job is no longer held`);
          else if (rows[0].state === 'failed') this.log.warn(`${slot.lockKey}: job ${job.id} of ${job.queue} failed for good after ${job.tries} tries`);
        }
        slot.backoff.reset();
        return;
      } catch (err) {
        if (err.code === '57014') { resent = true; continue; } // a stray cancel: rolled back
        if (!isConnectionError(err)) {
          this.log.error(`${slot.lockKey}: could not finish job ${job.id} (its lease will run out): ${oneLine(err)}`);
          return;
        }
        resent = true;
        await this.#dropClient(slot, client);
        await slot.backoff.pause(this.log, slot.lockKey, `connection lost finishing job ${job.id}`, err, slot.abandoned.signal);
      }
    }
  }
}
