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
