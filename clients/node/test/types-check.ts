// Compiled (not run) by types.test.mjs: the declarations in index.d.ts
// accept the documented uses and reject wrong ones.
import { Job, Retry, Worker, push, pushBatch, type Queryable } from 'pgqueue';

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
  void id; void ids; void started;
}
void main;
