// Type declarations for pgqueue (hand-written; index.js is the source).

/** What new pg.Client() takes (connectionString, host, port, user, database, ...). */
export interface ConnectionConfig {
  connectionString?: string;
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  database?: string;
  application_name?: string;
  [option: string]: unknown;
}

/** Anything with pg's query(): a pg.Client, a pool, a pool's client. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

export interface PushOptions {
  /** When the job becomes due (default: now). */
  runAfter?: Date | string | null;
  /** Seconds from now before the job is due (instead of runAfter). */
  delay?: number | null;
  /** Higher runs first within the queue (default 0). */
  priority?: number;
  /** While an unfinished job of the queue has this key, a push returns its id. */
  dedupKey?: string | null;
  /**
   * The job's own limit of tries, instead of its queue's (default: the queue's). Needs pgqueue 1.2:
   * sent only when given; on an older installation the push rejects with NeedsNewerExtension.
   * Below 1 the server rejects it (code 22023).
   */
  maxTries?: number | null;
  /**
   * The job's parents (flows), ids that push or pushBatch resolved to: while one of them is an
   * unfinished job the new one is waiting, and it becomes pending when the last of them is acked.
   * An id that is no unfinished job counts as done; at most 1,000 (the server rejects more, code
   * 22023). Needs pgqueue 1.2: sent only when given; on an older installation the push rejects
   * with NeedsNewerExtension. For pushBatch, every job of the batch waits for all of them.
   */
  after?: Iterable<string> | null;
  /**
   * The job's group (pgqueue 1.2): in a queue with groupMaxInFlight, at most that many jobs of a
   * group run at once, in order. Empty or over 256 bytes: the server rejects it (code 22023).
   */
  groupKey?: string | null;
}

/**
 * Pushes one job (pgq_push); resolves to its id. Runs in the caller's transaction, if any.
 * `push<Email>(client, 'emails', {...})` checks the payload against the type its handler expects.
 */
export function push<P = unknown>(client: Queryable, queue: string, payload?: P, options?: PushOptions): Promise<string>;

/** Pushes one job per payload (pgq_push_batch, 10,000 per call); resolves to the ids in order. */
export function pushBatch<P = unknown>(client: Queryable, queue: string, payloads: Iterable<P>,
  options?: Omit<PushOptions, 'dedupKey'>): Promise<string[]>;

export const BATCH_LIMIT: number;

/** A claimed job, as a handler sees it. */
export interface Job<P = any> {
  id: string;
  queue: string;
  payload: P;
  /** The attempt number: 1 on the first claim. */
  tries: number;
  version: number;
  /** The lease's deadline, moved on by each extension. */
  lockTimeout: Date;
  lockKey: string;
  /** True once an extension found the job no longer held by this worker. */
  leaseLost: boolean;
  /**
   * Aborted when the handler's timeout runs out (reason: a DOMException named
   * TimeoutError) and when the worker stops with the handler still running
   * after shutdownTimeout (an AbortError): pass it on to what the handler awaits.
   */
  signal: AbortSignal;
  /**
   * The handler's writes and the job's ack in one transaction: runs
   * fn(client) in a transaction on a connection of the worker's own pool (at
   * most transactionConnections; this waits for one when all are in use),
   * then pgq_ack in the same transaction, and commits. Both commit or
   * neither does (fn throws, the process dies, the connection is lost: the
   * job runs again). Rejects with LeaseLost, rolled back, when the job is no
   * longer held (lease lost, cancelled, ended by its timeout or shutdown).
   * The worker sends no other ack for the job. Once per job.
   */
  transaction<T>(fn: (client: Queryable) => Promise<T>): Promise<T>;
}

export type Handler<P = any> = (job: Job<P>) => Promise<unknown> | unknown;

/** The options of one queue's handler (Worker.handle's third argument). */
export interface HandlerOptions {
  /** The most jobs of this queue claimed or running at once: 1 to the worker's concurrency (RangeError otherwise). Default: no limit of its own. */
  concurrency?: number | null;
  /**
   * Seconds the handler may run: then job.signal is aborted, the job nacked
   * with `TimeoutError: handler ran longer than Xs` (the retry policy applies),
   * its handler slot free again; what the handler does later is dropped.
   */
  timeout?: number | null;
  /** The nack's retry_in (seconds; null: the server's backoff) after a failure on attempt (job.tries, 1-based); a thrown Retry still wins. Default: the worker's retryDelay. */
  retry?: ((attempt: number) => number | null) | null;
}

export interface Logger {
  debug(msg: string): void;
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string): void;
}

export interface WorkerOptions {
  /** Handlers running at once, fed by one claimer (pgq_claim of as many jobs as handlers are free); the worker uses 3 connections whatever this is. Default 4. */
  concurrency?: number;
  /** Seconds a claim holds a job; extended every lease/3 while the handler runs. Default 30. */
  lease?: number;
  /** Seconds a claim blocks waiting for work (at most 60). Default 10. */
  wait?: number;
  /** Seconds running handlers get after stop() before their jobs are released. Default 30. */
  shutdownTimeout?: number;
  /** Seconds before a failed job is retried; null: the server's exponential backoff. A handler's retry policy (HandlerOptions.retry) overrides it. */
  retryDelay?: number | null;
  /** lock_key prefix: the worker's key is `${name}:${n}`, n unique in the process. Default `${hostname}:${pid}`. */
  name?: string;
  /** Longest pause between reconnection attempts, seconds. Default 10. */
  reconnectMaxDelay?: number;
  /** Seconds start() tries to connect (with backoff) before it rejects with WorkerSetupError. Default 30. */
  startupTimeout?: number;
  /** Seconds an ack waits for others to go in the same pgq_ack_batch (0: none). Default 0.005. */
  completeInterval?: number;
  /** Acks waiting that are sent at once, without waiting for completeInterval; also the most in one statement. Default 100. */
  completeBatch?: number;
  /** After a claim that found jobs, seconds the next claim waits for more handlers to end (all of them at most) once one has, so that one claim takes several jobs (0: none). Default 0.002. */
  claimDelay?: number;
  /** The most connections job.transaction() uses at once (made when first used, kept while idle). Default 2. */
  transactionConnections?: number;
  /** Where log lines go; default: stderr (info and above). */
  logger?: Logger;
}

/** The Worker's events and their listeners' arguments (durations in ms: how long the handler ran). */
export interface WorkerEvents {
  /** start() connected and found pgqueue: claims begin. */
  started: [];
  /** stop() is done; the error that stopped the worker (WorkerSetupError, ...), or null. */
  stopped: [error: Error | null];
  /** A claimed job's handler is about to run. */
  jobStarted: [job: Job];
  /** The handler resolved and the job was acked. */
  jobSucceeded: [job: Job, duration: number];
  /** The handler rejected (error: what it threw, a Retry too) and the job was nacked. */
  jobFailed: [job: Job, duration: number, error: unknown];
  /** Another worker took the job (or it was cancelled): its result is not recorded; may come while the handler runs. */
  leaseLost: [job: Job, reason: string];
}

export type WorkerEvent = keyof WorkerEvents;
export type WorkerListener<E extends WorkerEvent> = (...args: WorkerEvents[E]) => void;

/** An EventEmitter (node:events) of WorkerEvents. */
export class Worker {
  constructor(connection?: string | ConnectionConfig, options?: WorkerOptions);
  on<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  addListener<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  prependListener<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  once<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  prependOnceListener<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  off<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  removeListener<E extends WorkerEvent>(event: E, listener: WorkerListener<E>): this;
  removeAllListeners(event?: WorkerEvent): this;
  listenerCount(event: WorkerEvent): number;
  emit<E extends WorkerEvent>(event: E, ...args: WorkerEvents[E]): boolean;
  /** Runs handler(job) for the jobs of queue: resolve = ack, reject = nack. */
  handle<P = any>(queue: string, handler: Handler<P>, options?: HandlerOptions): this;
  /**
   * Connects (within startupTimeout) and checks that pgqueue is installed, then
   * runs the slots; rejects with WorkerSetupError saying what to fix.
   */
  start(): Promise<void>;
  /** Starts, waits for SIGTERM/SIGINT (signals: true) or stop(), then stops gracefully. */
  run(options?: { signals?: boolean }): Promise<void>;
  /** Stops gracefully; resolves when done. */
  stop(): Promise<void>;
  /** The lock_key the worker claims with (null before start()). */
  readonly lockKey: string | null;
  /** The keys that may hold this worker's jobs: lockKey, and older ones not yet released (after a claim's answer was lost). */
  readonly lockKeys: string[];
  readonly stopping: boolean;
}

/** Throw from a handler to give the job back after `delay` seconds (it counts as a try). */
export class Retry extends Error {
  constructor(delay?: number, message?: string);
  delay: number;
}

export class WorkerSetupError extends Error {}

/** job.transaction() found the job no longer this worker's: rolled back, not acked. */
export class LeaseLost extends Error {}

/** `Name: message` and the top frames of the stack, as recorded in last_error. */
export function formatError(err: unknown): string;

// -- operating queues (admin.js; the role needs pgqueue_admin) -------------

/** A call needs an object of pgqueue 1.1 (admin functions) or 1.2 (push's maxTries and after, configure's rateLimit and ratePeriod) that the database's installation lacks; the message says what to run. */
export class NeedsNewerExtension extends Error {}

/** One queue's row of pgq_stats(). */
export interface QueueStats {
  queue: string;
  pending: number;
  retry: number;
  /** In work_queue, not held by a live lease. */
  scheduled: number;
  /** Held by a live lease. */
  inFlight: number;
  failed: number;
  oldestReady: Date | null;
  /** Jobs waiting for parents (flows); pgqueue 1.2, absent before. */
  waiting?: number;
  [column: string]: unknown;
}

/** pgq_counters(): cumulative since the server started (the library preloaded). */
export interface Counters {
  pushed: number;
  scheduled: number;
  claimed: number;
  acked: number;
  nacked: number;
  failed: number;
  leasesStolen: number;
  schedulerPasses: number;
  statsReset: Date | null;
  [column: string]: unknown;
}

export type JobState = 'pending' | 'retry' | 'scheduled' | 'running' | 'failed' | 'waiting';
export type PurgeState = 'pending' | 'retry' | 'failed' | 'waiting';
export const JOB_STATES: readonly JobState[];
export const PURGE_STATES: readonly PurgeState[];

/** A row of the pgqueue.jobs view (pgqueue 1.1). */
export interface JobRow<P = any> {
  id: string;
  queue: string;
  state: JobState;
  priority: number;
  runAfter: Date;
  created: Date;
  tries: number;
  maxTries: number;
  lockKey: string | null;
  lockTimeout: Date | null;
  lastError: string | null;
  payload: P;
  /** Its parents not yet acked (0 unless waiting); pgqueue 1.2, absent before. */
  waitingFor?: number;
}

/** A queue's settings for configure(); a setting left out (undefined or null) stays as it is. */
export interface QueueSettings {
  weight?: number | null;
  /** Cap on the queue's rows in work_queue, claimed or not; 0 removes it. */
  maxInFlight?: number | null;
  maxTries?: number | null;
  paused?: boolean | null;
  /** How long finished jobs are kept in pgqueue.archive: seconds, or an interval's text ('7 days'); 0 keeps none (pgqueue 1.1). */
  retention?: number | string | null;
  /** At most this many of the queue's jobs scheduled in any window of ratePeriod; 0 removes the limit (pgqueue 1.2). */
  rateLimit?: number | null;
  /** The rateLimit's window: seconds, or an interval's text ('1 minute'); 10 ms to 1 day, no months; default 1 second (pgqueue 1.2). */
  ratePeriod?: number | string | null;
  /** At most this many jobs of one group (push's groupKey) in flight at once, the groups served in turn; 0 removes the limit (pgqueue 1.2). */
  groupMaxInFlight?: number | null;
}

/** One row per queue with jobs or settings, by queue name. */
export function stats(client: Queryable): Promise<QueueStats[]>;
export function counters(client: Queryable): Promise<Counters>;
/** Unfinished jobs, oldest first (pgqueue 1.1; default limit 100). */
export function jobs<P = any>(client: Queryable, filter?: { queue?: string | null; state?: JobState | null; limit?: number }): Promise<JobRow<P>[]>;
/** pgq_configure with the settings given, by name. */
export function configure(client: Queryable, queue: string, settings: QueueSettings): Promise<void>;
/** New jobs of the queue are no longer scheduled (so not claimed); those already scheduled stay claimable. */
export function pause(client: Queryable, queue: string): Promise<void>;
export function resume(client: Queryable, queue: string): Promise<void>;
/** A failed job back to pending; false when it is not failed (pgqueue 1.1). */
export function retry(client: Queryable, id: string): Promise<boolean>;
/** retry() for every failed job of the queue; how many (pgqueue 1.1). */
export function retryFailed(client: Queryable, queue: string): Promise<number>;
/** Removes a job in any state, and the jobs waiting for it (1.2); false when there is no such job (pgqueue 1.1). */
export function cancel(client: Queryable, id: string): Promise<boolean>;
/** Removes every job of the queue in state (default failed; waiting: 1.2), and the jobs waiting for them; how many (pgqueue 1.1). */
export function purge(client: Queryable, queue: string, state?: PurgeState): Promise<number>;
