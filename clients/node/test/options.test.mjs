// Per handler options (concurrency, timeout, retry) and the default log
// lines, against a real server (and, in the second pass, PgBouncer).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { push, pushBatch, Retry, Worker } from 'pgqueue';
import {
  adminConfig, config, jobRows, keepingLogger, queueName, quiet, sharedClients, sleep, waitUntil, watchQueries,
} from './helpers.mjs';

const db = sharedClients({ admin: adminConfig, app: config });

// A worker with handlers [[queue, handler, options], ...], started now.
function worker(handlers, options = {}) {
  const w = new Worker(config, { logger: quiet, ...options });
  for (const [q, handler, opts] of handlers) w.handle(q, handler, opts);
  w.running = w.run({ signals: false });
  return w;
}

// Seconds until the job is due again, and its last_error.
async function due(id) {
  const { rows: [r] } = await db.admin.query(
    'SELECT state::text AS state, last_error, extract(epoch FROM run_after - now())::float8 AS due_in'
    + ' FROM pgqueue.queue WHERE id = $1', [id]);
  return r;
}

test('handle() options are checked', () => {
  const w = new Worker(config, { concurrency: 4, logger: quiet });
  const h = async () => {};
  assert.throws(() => w.handle('q', h, { concurrency: 5 }), RangeError);
  assert.throws(() => w.handle('q', h, { concurrency: 0 }), RangeError);
  assert.throws(() => w.handle('q', h, { concurrency: 1.5 }), RangeError);
  assert.throws(() => w.handle('q', h, { timeout: 0 }), RangeError);
  assert.throws(() => w.handle('q', h, { retry: 5 }), TypeError);
  assert.throws(() => w.handle('q', h, { timeoutMs: 5 }), /unknown handler option/);
  w.handle('q', h, { concurrency: 4, timeout: 0.1, retry: () => null });
});

test('a handler concurrency is reached and never exceeded, while a queue without one uses the other handlers', async () => {
  const base = queueName();
  const [limited, open] = [`${base}_lim`, `${base}_open`];
  await pushBatch(db.app, limited, Array.from({ length: 12 }, (_, n) => ({ n })));
  await pushBatch(db.app, open, Array.from({ length: 60 }, (_, n) => ({ n })));
  const running = new Map([[limited, 0], [open, 0]]);
  const most = new Map([[limited, 0], [open, 0]]);
  const done = new Map([[limited, 0], [open, 0]]);
  let total = 0;
  let mostTotal = 0;
  let both = false; // the limited queue full while the open one used the other handlers
  const asked = []; // [queues, n] of each claim
  const unwatch = watchQueries((text, values) => {
    if (text.includes('FROM pgq_claim(') && values[3]?.some((q) => q.startsWith(base))) asked.push([values[3], Number(values[1])]);
  });
  const handler = (ms) => async (job) => {
    running.set(job.queue, running.get(job.queue) + 1);
    total += 1;
    most.set(job.queue, Math.max(most.get(job.queue), running.get(job.queue)));
    mostTotal = Math.max(mostTotal, total);
    both ||= running.get(limited) === 2 && running.get(open) >= 3;
    await sleep(ms);
    running.set(job.queue, running.get(job.queue) - 1);
    total -= 1;
    done.set(job.queue, done.get(job.queue) + 1);
  };
  let w;
  const t0 = Date.now();
  let took;
  try {
    // wait 10: once the open queue is empty, the claim that waits leaves the
    // full limited queue out, and must be cancelled when it has room again
    w = worker([[limited, handler(300), { concurrency: 2 }], [open, handler(30)]], { concurrency: 6, wait: 10 });
    await waitUntil(() => done.get(open) === 60 && done.get(limited) === 12, 60000, 'both queues');
    took = (Date.now() - t0) / 1000;
    await waitUntil(async () => (await jobRows(db.admin, limited)).length + (await jobRows(db.admin, open)).length === 0, 10000, 'the acks');
  } finally {
    unwatch();
    await w?.stop();
  }
  assert.equal(most.get(limited), 2, 'the limited queue did not run exactly 2 at once at most');
  assert.ok(most.get(open) >= 3, `the open queue ran ${most.get(open)} at once at most`);
  assert.ok(mostTotal <= 6, `${mostTotal} handlers at once`);
  assert.ok(both, 'the limited queue never ran full beside the open one');
  // 12 jobs of 0.3 s, 2 at a time: 1.8 s; a claim waiting 10 s for the open
  // queue alone would hold each of them up
  assert.ok(took < 8, `${took}s for both queues`);
  // a claim that includes the limited queue never asks for more than 2
  assert.ok(asked.every(([qs, n]) => !qs.includes(limited) || n <= 2), JSON.stringify(asked));
  assert.ok(asked.every(([, n]) => n >= 1 && n <= 6), JSON.stringify(asked));
});

test('a handler past its timeout: nacked with a TimeoutError, job.signal aborted, its slot free, its late result dropped', async () => {
  const q = queueName();
  const logger = keepingLogger();
  const acked = [];
  const unwatch = watchQueries((text, values) => { if (/pgq_ack/.test(text)) acked.push(...values[0]); });
  const events = [];
  let slow;
  let abortedAt = null;
  let lateAt = null;
  const startedAt = new Map();
  let w;
  let a;
  let b;
  try {
    w = worker([[q, async (job) => {
      startedAt.set(job.id, Date.now());
      if (!job.payload.slow) return;
      slow = job;
      job.signal.addEventListener('abort', () => { abortedAt = Date.now(); });
      await sleep(2000); // not listening: resolves late
      lateAt = Date.now();
    }, { timeout: 0.5, retry: (attempt) => attempt * 600 }]], { concurrency: 1, wait: 1, logger });
    w.on('jobFailed', (job, ms, err) => events.push(['failed', job.id, err]));
    w.on('jobSucceeded', (job) => events.push(['succeeded', job.id]));
    a = await push(db.app, q, { slow: true });
    await waitUntil(() => slow, 20000, 'the slow handler');
    b = await push(db.app, q, { slow: false });
    await waitUntil(() => events.length === 2, 20000, 'the timeout and the next job');
    await waitUntil(() => lateAt, 5000, 'the late resolution');
    await sleep(500);
  } finally {
    unwatch();
    await w?.stop();
  }
  assert.ok(startedAt.get(b) < lateAt, 'the next job waited for the timed-out handler');
  assert.ok(abortedAt - startedAt.get(a) >= 450 && abortedAt - startedAt.get(a) < 1500, String(abortedAt - startedAt.get(a)));
  assert.equal(slow.signal.aborted, true);
  assert.equal(slow.signal.reason.name, 'TimeoutError');
  assert.deepEqual(events.map(([e, id]) => [e, id]).sort(), [['failed', a], ['succeeded', b]].sort());
  assert.equal(events.find(([e]) => e === 'failed')[2].name, 'TimeoutError');
  assert.deepEqual(acked, [b], 'the timed-out job was acked');
  const r = await due(a);
  assert.equal(r.state, 'retry');
  assert.equal(r.last_error, 'TimeoutError: handler ran longer than 0.5s');
  assert.ok(r.due_in > 590 && r.due_in <= 600, `retry policy: due in ${r.due_in}`);
  assert.ok(logger.lines.some((l) => l.startsWith('warn') && l.includes(`job ${a} of ${q} failed on try 1: TimeoutError`)), logger.lines.join('\n'));
  assert.ok(logger.lines.some((l) => l.includes(`job ${a}: its handler resolved`) && l.includes('dropped')), logger.lines.join('\n'));
});

test('a retry policy sets the retry delay by attempt; a thrown Retry still wins', async () => {
  const base = queueName();
  const [q, r] = [`${base}_policy`, `${base}_retry`];
  const attempts = [];
  const w = worker([
    [q, async () => { throw new Error('boom'); }, { retry: (attempt) => { attempts.push(attempt); return attempt === 1 ? 0 : 600; } }],
    [r, async () => { throw new Retry(300, 'later'); }, { retry: () => 5 }],
  ], { concurrency: 2, wait: 1, retryDelay: 1000 });
  let a;
  let b;
  try {
    a = await push(db.app, q);
    b = await push(db.app, r);
    await waitUntil(async () => (await jobRows(db.admin, q))[0]?.tries === 2, 20000, 'two tries');
    await waitUntil(async () => (await jobRows(db.admin, r))[0]?.state === 'retry', 20000, 'the Retry');
  } finally {
    await w.stop();
  }
  assert.deepEqual(attempts, [1, 2]);
  const ra = await due(a);
  assert.equal(ra.state, 'retry');
  assert.match(ra.last_error, /^Error: boom/);
  assert.ok(ra.due_in > 590 && ra.due_in <= 600, `attempt 2: due in ${ra.due_in}`);
  const rb = await due(b);
  assert.equal(rb.last_error, 'Retry: later');
  assert.ok(rb.due_in > 290 && rb.due_in <= 300, `Retry(300): due in ${rb.due_in}`);
});

test('a worker stopping past shutdownTimeout aborts job.signal of the handlers still running', async () => {
  const q = queueName();
  await push(db.app, q);
  let job;
  let w;
  try {
    w = worker([[q, async (j) => { job = j; await new Promise((resolve) => { j.signal.addEventListener('abort', resolve); }); }]],
      { concurrency: 1, wait: 1, shutdownTimeout: 0.5 });
    await waitUntil(() => job, 20000, 'the handler');
    assert.equal(job.signal.aborted, false);
  } finally {
    await w?.stop();
  }
  assert.equal(job.signal.aborted, true);
  assert.equal(job.signal.reason.name, 'AbortError');
  const rows = await jobRows(db.admin, q);
  assert.deepEqual(rows.map((row) => [row.state, row.lock_key]), [['scheduled', null]], 'released');
});

test('the default logger: a warning per failed job, an error per lost lease', async () => {
  const q = queueName();
  const [bad, lost] = await pushBatch(db.app, q, [{ n: 0 }, { n: 1 }]);
  const written = [];
  const write = process.stderr.write;
  process.stderr.write = function keep(chunk, ...rest) {
    written.push(String(chunk));
    return write.call(this, chunk, ...rest);
  };
  let lostSeen = false;
  let w;
  try {
    w = new Worker(config, { concurrency: 2, wait: 1, lease: 1.5 }); // no logger: the default one
    w.handle(q, async (job) => {
      if (job.id === bad) throw new RangeError('boom');
      await db.admin.query("UPDATE pgqueue.work_queue SET lock_key = 'intruder' WHERE id = $1", [job.id]);
      await waitUntil(() => job.leaseLost, 10000, 'the heartbeat to notice');
      lostSeen = true;
    });
    w.running = w.run({ signals: false });
    await waitUntil(() => lostSeen, 20000, 'the lost lease');
    await waitUntil(async () => (await jobRows(db.admin, q)).find((r) => r.id === bad)?.state === 'retry', 10000, 'the nack');
  } finally {
    await w?.stop();
    process.stderr.write = write;
  }
  const text = written.join('');
  assert.match(text, new RegExp(`pgqueue WARNING \\S+: job ${bad} of ${q} failed on try 1: RangeError: boom`));
  assert.match(text, new RegExp(`pgqueue ERROR \\S+: lease of job ${lost} lost \\(pgq_extend answered NULL\\)`));
});
