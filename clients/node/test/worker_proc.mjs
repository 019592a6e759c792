// A worker process for the tests that kill or signal one:
//   node worker_proc.mjs DSN QUEUE LOG CONCURRENCY LEASE SLEEP SHUTDOWN_TIMEOUT [COMPLETE_INTERVAL [WAIT [APP_NAME]]]
// (an empty COMPLETE_INTERVAL or WAIT: the default; WAIT 10 s by default).
// Its handler appends "start ID TRIES" to LOG, sleeps SLEEP seconds, then
// appends "done ID" (each line written at once, so a test sees them after a
// SIGKILL).  With PGQ_TX_TABLE set, it inserts the job's id into that table
// in job.transaction(), appends "written ID", and sleeps before the commit.
import fs from 'node:fs';
import { Worker } from 'pgqueue';
import { pgConfig } from './helpers.mjs';

const [dsn, queue, log, concurrency, lease, sleepS, shutdownTimeout, completeInterval, wait, appName] = process.argv.slice(2);
const fd = fs.openSync(log, 'a');
const note = (line) => fs.writeSync(fd, `${line}\n`);
const worker = new Worker({ ...pgConfig(dsn), ...(appName ? { application_name: appName } : {}) }, {
  concurrency: Number(concurrency), lease: Number(lease), wait: wait ? Number(wait) : 10, shutdownTimeout: Number(shutdownTimeout),
  ...(completeInterval ? { completeInterval: Number(completeInterval) } : {}),
});
const txTable = process.env.PGQ_TX_TABLE;
worker.handle(queue, async (job) => {
  note(`start ${job.id} ${job.tries}`);
  const pause = () => new Promise((r) => setTimeout(r, Number(sleepS) * 1000));
  if (txTable) { // the work in job.transaction(), the pause before its commit
    await job.transaction(async (tx) => {
      await tx.query(`INSERT INTO ${txTable} (job) VALUES ($1)`, [job.id]);
      note(`written ${job.id}`);
      await pause();
    });
  } else {
    await pause();
  }
  note(`done ${job.id}`);
});
note('ready');
await worker.run();
note('exit');
// a handler that outlived shutdownTimeout still holds the event loop: its
// job was released, so end the process now, as a worker's main should
process.exit(0);
