// Compiled (not run) by types.test.mjs: the declarations in index.d.ts
// accept the documented uses and reject wrong ones.
import {
  Job, LeaseLost, NeedsNewerExtension, Retry, Worker, cancel, configure, counters, jobs, pause, purge, push, pushBatch, resume,
  retry, retryFailed, stats, type Counters, type JobRow, type Queryable, type QueueStats,
} from 'pgqueue';

interface Email { to: string }

declare const client: Queryable;

async function main(): Promise<void> {
  const id: string = await push(client, 'emails', { to: 'a@example.com' }, { priority: 1, dedupKey: 'k' });
  const ids: string[] = await pushBatch(client, 'emails', [{ n: 1 }], { delay: 5 });
  await push(client, 'emails', {}, { maxTries: 1 });
  await pushBatch(client, 'emails', [{ n: 1 }], { maxTries: 3, priority: 2 });
  // @ts-expect-error maxTries is a number
  await push(client, 'emails', {}, { maxTries: '1' });
  // flows: the parents' ids, any iterable of them
  const child: string = await push(client, 'emails', {}, { after: [id, ...ids] });
  await pushBatch(client, 'emails', [{ n: 2 }], { after: new Set(ids), maxTries: 2 });
  await push(client, 'emails', {}, { after: null });
  // @ts-expect-error after lists ids (strings)
  await push(client, 'emails', {}, { after: [1, 2] });
  const w = new Worker('postgres://app@localhost/app', { concurrency: 8, lease: 60, transactionConnections: 3, claimDelay: 0.001 });
  const lost: Error = new LeaseLost('gone');
  w.handle<{ to: string }>('emails', async (job: Job<{ to: string }>) => {
    const to: string = job.payload.to;
    if (job.tries > 3) throw new Retry(30, `later for ${to}`);
    const n: number = await job.transaction(async (tx) => (await tx.query('INSERT INTO sent VALUES ($1)', [to])).rows.length);
    // @ts-expect-error the block takes the transaction's client
    await job.transaction(async (tx: string) => tx);
  });
  await w.run();
  const started: Promise<void> = new Worker('postgres://app@localhost/app', { startupTimeout: 5 }).start();
  // @ts-expect-error concurrency is a number
  new Worker({ host: '/tmp' }, { concurrency: 'many' });
  // @ts-expect-error a job's id is a string
  w.handle('x', (job) => { const n: number = job.id; return n; });
  w.on('jobSucceeded', (job: Job, ms: number) => { const q: string = job.queue; void q; void ms; });
  w.on('jobFailed', (job, ms, error) => { void job.id; void (ms + 1); void error; });
  w.once('leaseLost', (job, reason: string) => { const lost: boolean = job.leaseLost; void lost; void reason; });
  w.on('stopped', (error) => { if (error) void error.message; });
  w.on('started', () => {}).off('jobStarted', (job) => { void job.tries; });
  const typed: string = await push<Email>(client, 'emails', { to: 'a@example.com' });
  await pushBatch<Email>(client, 'emails', [{ to: 'b@example.com' }]);
  // @ts-expect-error a payload of the wrong type
  await push<Email>(client, 'emails', { to: 1 });
  // @ts-expect-error payloads of the wrong type
  await pushBatch<Email>(client, 'emails', [{ from: 'x' }]);
  // @ts-expect-error no such event
  w.on('jobDone', () => {});
  // @ts-expect-error a duration is a number
  w.on('jobSucceeded', (job: Job, ms: string) => { void job; void ms; });
  // per handler options; job.signal
  w.handle<Email>('slow', async (job) => { if (job.signal.aborted) throw job.signal.reason; },
    { concurrency: 2, timeout: 30, retry: (attempt: number) => (attempt < 3 ? 10 * attempt : null) });
  w.handle('plain', async () => {}, { retry: null, timeout: null });
  // @ts-expect-error a retry policy answers seconds or null
  w.handle('x', async () => {}, { retry: (attempt: number) => `${attempt}s` });
  // @ts-expect-error no such handler option
  w.handle('x', async () => {}, { timeoutMs: 5 });
  // admin
  const all: QueueStats[] = await stats(client);
  const inFlight: number = all[0].inFlight;
  const waiting: number | undefined = all[0].waiting;
  const c: Counters = await counters(client);
  const stolen: number = c.leasesStolen;
  await configure(client, 'emails', { maxTries: 3, paused: false, retention: '7 days', maxInFlight: 0 });
  await configure(client, 'emails', { retention: 3600 });
  await configure(client, 'emails', { rateLimit: 5, ratePeriod: '1 second' });
  await configure(client, 'emails', { rateLimit: 0, ratePeriod: 60, weight: null });
  // @ts-expect-error rateLimit is a number
  await configure(client, 'emails', { rateLimit: '5' });
  // @ts-expect-error ratePeriod is seconds or an interval's text
  await configure(client, 'emails', { ratePeriod: true });
  // @ts-expect-error settings are camelCase
  await configure(client, 'emails', { max_tries: 3 });
  await pause(client, 'emails');
  await resume(client, 'emails');
  const rows: JobRow<Email>[] = await jobs<Email>(client, { queue: 'emails', state: 'failed', limit: 10 });
  const to: string = rows[0].payload.to;
  const lastError: string | null = rows[0].lastError;
  const waitingFor: number | undefined = rows[0].waitingFor;
  await jobs(client, { state: 'waiting' });
  // @ts-expect-error no such state
  await jobs(client, { state: 'done' });
  const retried: boolean = await retry(client, id);
  const many: number = await retryFailed(client, 'emails');
  const gone: boolean = await cancel(client, id);
  const purged: number = await purge(client, 'emails', 'retry') + await purge(client, 'emails')
    + await purge(client, 'emails', 'waiting');
  // @ts-expect-error purge takes pending, retry, failed or waiting
  await purge(client, 'emails', 'running');
  const old: Error = new NeedsNewerExtension('x');
  void id; void ids; void started; void typed; void inFlight; void stolen; void to; void lastError;
  void retried; void many; void gone; void purged; void old; void child; void waiting; void waitingFor;
}
void main;
