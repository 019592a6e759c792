// Drain N jobs of a queue with pgqueue's Worker and a trivial handler; print jobs/s.
//   node drain.mjs HOST PORT USER DATABASE QUEUE N CONCURRENCY
import { performance } from 'node:perf_hooks';
import { Worker } from 'pgqueue';

const [host, port, user, database, queue, n, concurrency] = process.argv.slice(2);
let count = 0;
let done;
const last = new Promise((resolve) => { done = resolve; });
const worker = new Worker({ host, port: Number(port), user, database }, { concurrency: Number(concurrency), wait: 5 });
worker.handle(queue, async () => {
  count += 1;
  if (count === Number(n)) done();
});
const t0 = performance.now();
worker.start();
await last;
await worker.stop(); // waits for the acks still under way
const seconds = (performance.now() - t0) / 1000;
console.log(JSON.stringify({
  client: 'node', concurrency: Number(concurrency), jobs: Number(n),
  seconds: Number(seconds.toFixed(3)), jobs_per_s: Number((Number(n) / seconds).toFixed(1)),
}));
process.exit(0);
