// A pgqueue worker in Node: "sends" the emails of queue emails.
//
//   cd examples && npm install          # pgqueue from ../clients/node, pg from npm
//   DATABASE_URL=postgres://job_runner@localhost/app node node_worker.mjs [QUEUE ...]
//
// Needs a role with pgqueue_consumer.  Stops gracefully on SIGTERM or Ctrl-C.
// A job whose payload has no "to" fails: it is nacked with the stack,
// retried with backoff, and ends in state failed when out of tries.
import { Worker } from 'pgqueue';

const worker = new Worker(process.env.DATABASE_URL ?? {}, {
  concurrency: Number(process.env.CONCURRENCY ?? 4),
});

async function sendEmail(job) {
  const to = job.payload?.to;
  if (!to) throw new Error("payload has no 'to'");
  console.log(`job ${job.id}: email to ${to} (try ${job.tries})`);
}

for (const queue of process.argv.slice(2).length ? process.argv.slice(2) : ['emails']) {
  worker.handle(queue, sendEmail);
}
await worker.run();
// handlers that outlived the shutdown timeout were released; end them
process.exit(0);
