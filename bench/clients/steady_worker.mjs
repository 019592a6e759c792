// The worker of the steady load (bench/clients/steady.py drives it), as
// steady_worker.py: pgqueue's Worker with the library's defaults but for its
// concurrency, and a handler that only notes when it started, for each job.
//   node steady_worker.mjs HOST PORT USER DATABASE QUEUE CONCURRENCY RECFILE
// Protocol and RECFILE as steady_worker.py's (START_NS from
// process.hrtime.bigint(): CLOCK_MONOTONIC, as Python's time.monotonic_ns()).
import { writeFileSync } from 'node:fs';
import readline from 'node:readline';
import { Worker } from 'pgqueue';
import { ownTicks } from './procstat.mjs';

const [host, port, user, database, queue, concurrency, recfile] = process.argv.slice(2);
const started = []; // [job id, ns]
const worker = new Worker({ host, port: Number(port), user, database }, { concurrency: Number(concurrency) });
worker.handle(queue, async (job) => {
  started.push([job.id, process.hrtime.bigint()]);
});
let stopped = false;
worker.on('stopped', () => { stopped = true; });
await worker.start();
console.log('ready');
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });
let ticks0 = null;
for await (const line of readline.createInterface({ input: process.stdin })) {
  const word = line.trim().split(/\s+/);
  if (word[0] === 'go') ticks0 = ownTicks();
  else if (word[0] === 'stop') {
    const deadline = Date.now() + 60000;
    while (started.length < Number(word[1]) && Date.now() < deadline && !stopped) await sleep(10);
    await sleep(100);
    const ticks = ownTicks() - (ticks0 ?? ownTicks());
    await worker.stop();
    writeFileSync(recfile, started.map(([id, t]) => `${id} ${t}\n`).join(''));
    console.log(JSON.stringify({ handled: started.length, client_ticks: ticks }));
    break;
  }
}
process.exit(0);
