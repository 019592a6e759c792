// Operating queues from code (admin.js), as the role ops (pgqueue_admin),
// through the server or PgBouncer as the pass says.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { test } from 'node:test';
import {
  NeedsNewerExtension, Worker, cancel, configure, counters, jobs, pause, purge, push, pushBatch, resume, retry,
  retryFailed, stats,
} from 'pgqueue';
import { PASS, adminConfig, config, connect, queueName, quiet, sharedClients, sleep, waitUntil } from './helpers.mjs';

const db = sharedClients({ admin: adminConfig, ops: { ...config, user: 'ops' } });

// Fails every job of queue now (max_tries 1): claims them as 'probe' and nacks them.
async function failAll(queue, n) {
  await db.admin.query('SELECT pgq_configure($1, max_tries => 1)', [queue]);
  let left = n;
  await waitUntil(async () => {
    const { rows } = await db.admin.query("SELECT id FROM pgq_claim('probe', 100, '1 minute', ARRAY[$1])", [queue]);
    for (const { id } of rows) await db.admin.query("SELECT pgq_nack($1, 'probe', 'failed on purpose')", [id]);
    left -= rows.length;
    return left === 0;
  }, 20000, `${n} jobs failed`);
}

test('stats and counters: numbers, camelCase', async () => {
  const q = queueName();
  await pushBatch(db.ops, q, [{ n: 0 }, { n: 1 }]);
  const row = (await stats(db.ops)).find((r) => r.queue === q);
  assert.ok(row, 'no row for the queue');
  assert.equal(row.pending + row.scheduled, 2);
  for (const k of ['pending', 'retry', 'scheduled', 'inFlight', 'failed']) assert.equal(typeof row[k], 'number', k);
  assert.ok(row.oldestReady === null || row.oldestReady instanceof Date);
  const c = await counters(db.ops);
  assert.ok(c.pushed >= 2, JSON.stringify(c));
  for (const k of ['pushed', 'scheduled', 'claimed', 'acked', 'nacked', 'failed', 'leasesStolen', 'schedulerPasses']) {
    assert.equal(typeof c[k], 'number', k);
  }
});

test('configure sets the settings given, by name, and leaves the others', async () => {
  const q = queueName();
  const settings = async () => (await db.admin.query(
    'SELECT weight, max_in_flight, max_tries, paused, extract(epoch FROM retention)::int AS retention'
    + ' FROM pgqueue.queues WHERE queue = $1', [q])).rows[0];
  await configure(db.ops, q, { weight: 3, maxInFlight: 5, maxTries: 2, retention: 3600 });
  assert.deepEqual(await settings(), { weight: 3, max_in_flight: 5, max_tries: 2, paused: false, retention: 3600 });
  await configure(db.ops, q, { weight: 4, retention: '2 hours', paused: undefined });
  assert.deepEqual(await settings(), { weight: 4, max_in_flight: 5, max_tries: 2, paused: false, retention: 7200 });
  await configure(db.ops, q, { maxInFlight: 0 });
  assert.equal((await settings()).max_in_flight, 0);
  await assert.rejects(configure(db.ops, q, { max_tries: 3 }), TypeError);
  await assert.rejects(configure(db.ops, q, { weight: -1 }), (err) => err.code === '22023' || err.code === '23514');
});

test('pause: a paused queue is not claimed; resume: it is', async () => {
  const q = queueName();
  await pause(db.ops, q);
  assert.equal((await db.admin.query('SELECT paused FROM pgqueue.queues WHERE queue = $1', [q])).rows[0].paused, true);
  const id = await push(db.ops, q);
  const ran = [];
  const w = new Worker(config, { concurrency: 1, wait: 1, logger: quiet });
  w.handle(q, async (job) => { ran.push(job.id); });
  const running = w.run({ signals: false });
  try {
    await sleep(1500);
    assert.deepEqual(ran, [], 'a paused queue was claimed');
    assert.deepEqual((await jobs(db.ops, { queue: q })).map((j) => [j.id, j.state]), [[id, 'pending']]);
    await resume(db.ops, q);
    await waitUntil(() => ran.length === 1, 20000, 'the job after resume');
    await waitUntil(async () => (await jobs(db.ops, { queue: q })).length === 0, 10000, 'the ack');
  } finally {
    await w.stop();
    await running;
  }
  assert.deepEqual(ran, [id]);
});

test('retry, retryFailed, cancel and purge answer what they did', async () => {
  const q = queueName();
  const ids = await pushBatch(db.ops, q, [{ n: 0 }, { n: 1 }, { n: 2 }, { n: 3 }]);
  await failAll(q, 4);
  const failed = await jobs(db.ops, { queue: q, state: 'failed' });
  assert.deepEqual(failed.map((j) => j.id), ids);
  const [first] = failed;
  assert.equal(first.queue, q);
  assert.equal(first.tries, 1);
  assert.equal(first.maxTries, 1);
  assert.equal(first.lastError, 'failed on purpose');
  assert.equal(first.lockKey, null);
  assert.deepEqual(first.payload, { n: 0 });
  assert.ok(first.created instanceof Date && first.runAfter instanceof Date);
  assert.deepEqual((await jobs(db.ops, { queue: q, limit: 2 })).map((r) => r.id), ids.slice(0, 2));

  await pause(db.ops, q); // what is retried stays pending
  assert.equal(await cancel(db.ops, ids[3]), true);
  assert.equal(await cancel(db.ops, ids[3]), false, 'cancel of a job that is gone');
  assert.equal(await retry(db.ops, ids[0]), true);
  assert.equal(await retry(db.ops, ids[0]), false, 'retry of a job that is not failed');
  assert.equal(await retryFailed(db.ops, q), 2);
  assert.equal(await retryFailed(db.ops, q), 0);
  assert.deepEqual((await jobs(db.ops, { queue: q, state: 'pending' })).map((j) => j.id), ids.slice(0, 3));
  assert.equal(await purge(db.ops, q, 'pending'), 3);
  assert.deepEqual(await jobs(db.ops, { queue: q }), []);
  assert.equal(await purge(db.ops, q), 0, 'no failed job left');
  await assert.rejects(purge(db.ops, q, 'running'), (err) => err.code === '22023');
});

test('on pgqueue 1.0, the 1.1 functions say what to run', { skip: PASS !== 'direct' && 'direct pass only (PgBouncer serves pgq_test only)' }, async () => {
  const database = `pgq_old_${crypto.randomBytes(4).toString('hex')}`;
  await db.admin.query(`CREATE DATABASE ${database}`);
  let old;
  try {
    old = await connect({ ...adminConfig, database });
    await old.query("CREATE EXTENSION pgqueue VERSION '1.0'");
    assert.deepEqual(await stats(old), []);
    await configure(old, 'q', { maxTries: 2 });
    const needs = (what) => (err) => err instanceof NeedsNewerExtension && err.message.includes(`${what} needs pgqueue 1.1`)
      && err.message.includes('this database has pgqueue 1.0') && err.message.includes('ALTER EXTENSION pgqueue UPDATE');
    await assert.rejects(jobs(old), needs('listing jobs (pgqueue.jobs)'));
    await assert.rejects(retry(old, crypto.randomUUID()), needs('pgq_retry'));
    await assert.rejects(retryFailed(old, 'q'), needs('pgq_retry_failed'));
    await assert.rejects(cancel(old, crypto.randomUUID()), needs('pgq_cancel'));
    await assert.rejects(purge(old, 'q'), needs('pgq_purge'));
    await assert.rejects(configure(old, 'q', { retention: 60 }), needs('configure with a retention'));
  } finally {
    await old?.end();
    await db.admin.query(`DROP DATABASE ${database}`);
  }
});

// --- rateLimit and ratePeriod (pgqueue 1.2) ---------------------------------

// Whether this server's pgq_configure takes rate_limit and rate_period (1.2).
async function hasRateLimit() {
  const { rows: [r] } = await db.admin.query("SELECT count(*) = 1 AS ok FROM pg_catalog.pg_proc"
    + " WHERE proname = 'pgq_configure' AND proargnames @> ARRAY['rate_limit', 'rate_period']");
  return r.ok;
}
const NO_RATE = "needs pgqueue 1.2's pgq_configure(..., rate_limit, rate_period), which this server's extension does not have yet";

test('configure rateLimit, ratePeriod: set, kept, removed; the server\'s 22023', async (t) => {
  if (!await hasRateLimit()) { t.skip(NO_RATE); return; }
  const q = queueName();
  const rate = async () => (await db.admin.query(
    'SELECT rate_limit, extract(epoch FROM rate_period)::float8 AS period, weight'
    + ' FROM pgqueue.queues WHERE queue = $1', [q])).rows[0];
  await configure(db.ops, q, { rateLimit: 5, ratePeriod: '1 minute' });
  assert.deepEqual(await rate(), { rate_limit: 5, period: 60, weight: 1 });
  await configure(db.ops, q, { weight: 2, rateLimit: undefined, ratePeriod: null }); // kept
  assert.deepEqual(await rate(), { rate_limit: 5, period: 60, weight: 2 });
  await configure(db.ops, q, { rateLimit: 7, ratePeriod: 2.5 }); // seconds
  assert.deepEqual(await rate(), { rate_limit: 7, period: 2.5, weight: 2 });
  await configure(db.ops, q, { ratePeriod: '250 milliseconds' });
  assert.deepEqual(await rate(), { rate_limit: 7, period: 0.25, weight: 2 });
  await configure(db.ops, q, { rateLimit: 0 }); // removes the limit; the period stays
  assert.deepEqual(await rate(), { rate_limit: 0, period: 0.25, weight: 2 });
  for (const bad of [{ ratePeriod: '1 month' }, { ratePeriod: 0.005 }, { ratePeriod: '1 day 1 second' },
    { ratePeriod: -1 }, { rateLimit: -1 }, { rateLimit: 3, ratePeriod: '1 year' }]) {
    await assert.rejects(configure(db.ops, q, bad), (err) => err.code === '22023', JSON.stringify(bad));
    assert.deepEqual(await rate(), { rate_limit: 0, period: 0.25, weight: 2 }, JSON.stringify(bad));
  }
  await configure(db.ops, q, { rateLimit: 1, ratePeriod: 0.01 }); // the edges are taken
  await configure(db.ops, q, { ratePeriod: '1 day' });
  assert.deepEqual(await rate(), { rate_limit: 1, period: 86400, weight: 2 });
  await db.admin.query('DELETE FROM pgqueue.queues WHERE queue = $1', [q]);
});

test('on pgqueue 1.1, configure with rateLimit or ratePeriod says what to run; without them it works', { skip: PASS !== 'direct' && 'direct pass only (PgBouncer serves pgq_test only)' }, async () => {
  const database = `pgq_old_${crypto.randomBytes(4).toString('hex')}`;
  await db.admin.query(`CREATE DATABASE ${database}`);
  let old;
  try {
    old = await connect({ ...adminConfig, database });
    await old.query("CREATE EXTENSION pgqueue VERSION '1.1'");
    // without them nothing changed: 1.1's pgq_configure is called as before
    await configure(old, 'q', { weight: 2, retention: 60, rateLimit: undefined, ratePeriod: null });
    await pause(old, 'q');
    const needs = (err) => err instanceof NeedsNewerExtension
      && err.message.includes('configure with a rateLimit or ratePeriod needs pgqueue 1.2')
      && err.message.includes('this database has pgqueue 1.1') && err.message.includes('ALTER EXTENSION pgqueue UPDATE')
      && err.cause?.code === '42883';
    await assert.rejects(configure(old, 'q', { weight: 3, rateLimit: 5 }), needs);
    await assert.rejects(configure(old, 'q', { ratePeriod: 1 }), needs);
    await assert.rejects(configure(old, 'q', { retention: 10, ratePeriod: '1 second' }), needs);
    await assert.rejects(configure(old, 'q', { groupMaxInFlight: 1 }), (err) => err instanceof NeedsNewerExtension
      && err.message.includes('configure with a groupMaxInFlight needs pgqueue 1.2') && err.cause?.code === '42883');
    const { rows: [r] } = await old.query("SELECT weight, paused, extract(epoch FROM retention)::int AS retention"
      + " FROM pgqueue.queues WHERE queue = 'q'");
    assert.deepEqual(r, { weight: 2, paused: true, retention: 60 });
  } finally {
    await old?.end();
    await db.admin.query(`DROP DATABASE ${database}`);
  }
});

// The most of times (ms) in any half-open window of period ms.
function mostInAWindow(times, period) {
  const sorted = [...times].sort((a, b) => a - b);
  let most = 0;
  for (let i = 0; i < sorted.length; i++) {
    most = Math.max(most, sorted.slice(i).filter((u) => u < sorted[i] + period).length);
  }
  return most;
}

// The server's promise is on the releases into work_queue (the scheduling
// pass's now, work_queue.created): at most 5 in any window of 1 s, checked
// exactly.  The claims follow the releases by a few milliseconds each, not
// always the same few, so the claims are checked in windows 50 ms shorter:
// still never a sixth.
test('a rate-limited queue (5 per second) is claimed at its rate', async (t) => {
  if (!await hasRateLimit()) { t.skip(NO_RATE); return; }
  const q = queueName();
  const lease = 30;
  await configure(db.ops, q, { rateLimit: 5, ratePeriod: '1 second' });
  const claimed = [];
  const released = [];
  let queries = Promise.resolve(); // one query at a time on the shared client
  const createdMs = (id) => (queries = queries.then(() => db.admin.query(
    'SELECT (extract(epoch FROM created) * 1000)::float8 AS ms FROM pgqueue.work_queue WHERE id = $1', [id])));
  const w = new Worker(config, { concurrency: 20, wait: 1, lease, logger: quiet });
  w.handle(q, async (job) => {
    // the claim's time by the server's clock: its lease ends lease seconds later
    claimed.push(job.lockTimeout.getTime() - lease * 1000);
    // its release: the job is in work_queue until its ack
    const { rows: [r] } = await createdMs(job.id);
    released.push(r.ms);
  });
  const running = w.run({ signals: false });
  try {
    await sleep(500); // the worker is up and waiting before the jobs come
    await pushBatch(db.ops, q, Array.from({ length: 20 }, (_, n) => ({ n })));
    await sleep(2500);
  } finally {
    await w.stop();
    await running;
  }
  const first = Math.min(...claimed);
  const seen = JSON.stringify({ claimed: claimed.map((c) => c - first).sort((a, b) => a - b),
    released: released.map((c) => Math.round((c - first) * 10) / 10).sort((a, b) => a - b) });
  assert.ok(claimed.length >= 5 && claimed.length <= 15, seen);
  assert.ok(mostInAWindow(released, 1000) <= 5, seen);
  assert.ok(mostInAWindow(claimed, 950) <= 5, seen);
  await db.admin.query('DELETE FROM pgqueue.queue WHERE queue = $1', [q]);
  await db.admin.query('DELETE FROM pgqueue.queues WHERE queue = $1', [q]);
});
