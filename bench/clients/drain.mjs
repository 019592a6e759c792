// Drain N jobs of a queue with pgqueue's Worker and a trivial handler; print jobs/s.
//   node drain.mjs HOST PORT USER DATABASE QUEUE N CONCURRENCY
// Prints one JSON line as drain.py does: the worker has the library's
// defaults but for its concurrency; time and CPU (client_ticks: utime +
// stime of this process from /proc/self/stat) run from just before start()
// to the end of stop(), which waits for the last acks.
import { performance } from 'node:perf_hooks';
import { Worker } from 'pgqueue';
import { ownTicks } from './procstat.mjs';

const [host, port, user, database, queue, n, concurrency] = process.argv.slice(2);
let count = 0;
let done;
const last = new Promise((resolve) => { done = resolve; });
const worker = new Worker({ host, port: Number(port), user, database }, { concurrency: Number(concurrency) });
worker.handle(queue, async () => {
  count += 1;
  if (count === Number(n)) done();
});
worker.on('stopped', () => done()); // a worker that had to stop ends the drain too
const ticks0 = ownTicks();
const t0 = performance.now();
await worker.start();
await last;
await worker.stop(); // waits for the acks still under way
const seconds = (performance.now() - t0) / 1000;
const ticks = ownTicks() - ticks0;
if (count < Number(n)) {
  console.error(`drain.mjs: the worker stopped after ${count} of ${n} jobs`);
  process.exit(1);
}
console.log(JSON.stringify({
  client: 'node', concurrency: Number(concurrency), jobs: Number(n),
  seconds: Number(seconds.toFixed(3)), jobs_per_s: Number((Number(n) / seconds).toFixed(1)),
  client_ticks: ticks,
}));
process.exit(0);
