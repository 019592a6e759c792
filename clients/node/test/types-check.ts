// Compiled (not run) by types.test.mjs: the declarations in index.d.ts
// accept the documented uses and reject wrong ones.
import { Job, Retry, Worker, push, pushBatch, type Queryable } from 'pgqueue';

interface Email { to: string }

declare const client: Queryable;

async function main(): Promise<void> {
  const id: string = await push(client, 'emails', { to: 'a@example.com' }, { priority: 1, dedupKey: 'k' });
  const ids: string[] = await pushBatch(client, 'emails', [{ n: 1 }], { delay: 5 });
  const w = new Worker('postgres://app@localhost/app', { concurrency: 8, lease: 60 });
  w.handle<{ to: string }>('emails', async (job: Job<{ to: string }>) => {
    const to: string = job.payload.to;
    if (job.tries > 3) throw new Retry(30, `later for ${to}`);
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
  void id; void ids; void started; void typed;
}
void main;
