// push and pushBatch on the caller's own client and transaction, and
// maxTries, a job's own limit of tries (pgqueue 1.2).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { NeedsNewerExtension, Worker, configure, push, pushBatch } from 'pgqueue';
import {
  PASS, adminConfig, atVersion, config, connect, jobRows, needs12, pushTakes, queueName, quiet, waitUntil,
} from './helpers.mjs';

let admin;
let app;
before(async () => { admin = await connect(adminConfig); app = await connect(config); });
after(async () => { await admin.end(); await app.end(); });

const payloads = async (q) => (await admin.query(
  'SELECT payload FROM pgqueue.queue WHERE queue = $1 ORDER BY id', [q])).rows.map((r) => r.payload);

test('push is part of the caller\'s transaction', async () => {
  const q = queueName();
  await app.query('BEGIN');
  await push(app, q, { n: 1 });
  await app.query('ROLLBACK');
  assert.deepEqual(await payloads(q), []);
  await app.query('BEGIN');
  await push(app, q, { n: 2 });
  assert.deepEqual(await payloads(q), []);
  await app.query('COMMIT');
  assert.deepEqual(await payloads(q), [{ n: 2 }]);
});

test('push options: priority, delay, dedupKey', async () => {
  const q = queueName();
  const a = await push(app, q, undefined, { priority: 5, dedupKey: 'k', delay: 3600 });
  assert.equal(await push(app, q, { other: true }, { dedupKey: 'k' }), a);
  const { rows: [r] } = await admin.query(
    "SELECT payload, priority, dedup_key, run_after > now() + interval '59 minutes' AS later FROM pgqueue.queue WHERE id = $1", [a]);
  assert.deepEqual(r, { payload: {}, priority: 5, dedup_key: 'k', later: true });
});

test('pushBatch returns ids in payload order, and splits over 10,000', async () => {
  const q = queueName();
  const list = [...Array.from({ length: 25 }, (_, n) => ({ n })), null, ['a', 1], 'text "quoted", {braced}'];
  const ids = await pushBatch(app, q, list);
  assert.equal(new Set(ids).size, 28);
  const { rows } = await admin.query('SELECT id, payload FROM pgqueue.queue WHERE queue = $1', [q]);
  const byId = new Map(rows.map((r) => [r.id, r.payload]));
  assert.deepEqual(ids.map((i) => byId.get(i)), [...list.slice(0, 25), {}, ['a', 1], 'text "quoted", {braced}']);
  assert.deepEqual(await pushBatch(app, q, []), []);
  const q2 = queueName();
  await admin.query('SELECT pgq_configure($1, paused => true)', [q2]); // none scheduled: the DELETE below is all
  const many = await pushBatch(app, q2, Array.from({ length: 10001 }, (_, n) => n));
  assert.equal(many.length, 10001);
  const { rows: [c] } = await admin.query(
    'SELECT count(*)::int AS n, sum(payload::text::int)::int AS s FROM pgqueue.queue WHERE queue = $1', [q2]);
  assert.deepEqual(c, { n: 10001, s: 50005000 });
  await admin.query('DELETE FROM pgqueue.queue WHERE queue = $1', [q2]);
});

// --- maxTries, a job's own limit of tries (pgqueue 1.2) ---------------------

const hasPushMaxTries = () => pushTakes(admin, 'max_tries');
const NO_1_2 = "needs pgqueue 1.2's pgq_push(..., max_tries), which this server's extension does not have yet";

// pgqueue.jobs.max_tries of each job, in the order of ids.
async function maxTriesShown(ids) {
  const { rows } = await admin.query('SELECT id, max_tries FROM pgqueue.jobs WHERE id = ANY ($1::uuid[])', [ids]);
  const byId = new Map(rows.map((r) => [r.id, r.max_tries]));
  return ids.map((i) => byId.get(i));
}

test('push maxTries: the job fails after its own tries, not its queue\'s', async (t) => {
  if (!await hasPushMaxTries()) { t.skip(NO_1_2); return; }
  const q = queueName();
  await admin.query('SELECT pgq_configure($1, max_tries => 5)', [q]);
  const own = await push(app, q, { own: true }, { maxTries: 1 });
  const other = await push(app, q, { own: false });
  assert.deepEqual(await maxTriesShown([own, other]), [1, 5]);
  const ran = [];
  const w = new Worker(config, { concurrency: 2, wait: 1, retryDelay: 3600, logger: quiet }); // no second try here
  w.handle(q, async (job) => { ran.push(job.id); throw new Error('failed on purpose'); });
  const running = w.run({ signals: false });
  try {
    await waitUntil(async () => {
      const states = Object.fromEntries((await jobRows(admin, q)).map((r) => [r.id, r.state]));
      return states[own] === 'failed' && states[other] === 'retry';
    }, 20000, 'the job with maxTries 1 failed, the other one to be retried');
  } finally {
    await w.stop();
    await running;
  }
  assert.deepEqual(ran.sort(), [own, other].sort());
  const { rows } = await admin.query("SELECT id, tries, max_tries, last_error LIKE '%failed on purpose%' AS why"
    + ' FROM pgqueue.jobs WHERE queue = $1 ORDER BY tries, max_tries', [q]);
  assert.deepEqual(rows, [{ id: own, tries: 1, max_tries: 1, why: true }, { id: other, tries: 1, max_tries: 5, why: true }]);
  await admin.query('DELETE FROM pgqueue.queue WHERE queue = $1', [q]);
});

test('pushBatch maxTries: every job of the batch has it', async (t) => {
  if (!await hasPushMaxTries()) { t.skip(NO_1_2); return; }
  const q = queueName();
  await admin.query('SELECT pgq_configure($1, max_tries => 4)', [q]);
  const own = await pushBatch(app, q, [{ n: 0 }, { n: 1 }, null], { maxTries: 1 });
  const two = await pushBatch(app, q, [{ n: 3 }], { maxTries: 2 });
  const other = await pushBatch(app, q, [{ n: 4 }]);
  const ids = [...own, ...two, ...other];
  assert.deepEqual(await maxTriesShown(ids), [1, 1, 1, 2, 4]);
  // each claimed and nacked once (as 'probe')
  const state = new Map();
  await waitUntil(async () => {
    await admin.query('SELECT pgq_schedule(1000)');
    const { rows } = await admin.query("SELECT id FROM pgq_claim('probe', 100, '1 minute', ARRAY[$1])", [q]);
    for (const { id } of rows) {
      const { rows: [r] } = await admin.query("SELECT pgq_nack($1, 'probe', 'failed on purpose', '1 hour') AS state", [id]);
      state.set(id, r.state);
    }
    return state.size === ids.length;
  }, 20000, `${ids.length} jobs claimed and nacked`);
  assert.deepEqual(ids.map((i) => state.get(i)), ['failed', 'failed', 'failed', 'retry', 'retry']);
  await admin.query('DELETE FROM pgqueue.queue WHERE queue = $1', [q]);
});

test('maxTries below 1 is the server\'s error (22023)', async (t) => {
  if (!await hasPushMaxTries()) { t.skip(NO_1_2); return; }
  const q = queueName();
  await assert.rejects(push(app, q, {}, { maxTries: 0 }), (err) => err.code === '22023');
  await assert.rejects(pushBatch(app, q, [{ n: 1 }], { maxTries: -1 }), (err) => err.code === '22023');
  assert.deepEqual(await payloads(q), []);
});

test('maxTries on pgqueue 1.1 says what to run; without it pushes work', { skip: PASS !== 'direct' && 'direct pass only (PgBouncer serves pgq_test only)' }, async () => {
  await atVersion(admin, '1.1', async (old) => {
    const needs = (what, have) => needs12(NeedsNewerExtension, what, have);
    // without maxTries nothing changed: 1.1's pgq_push is called as before
    const id = await push(old, 'q', { n: 1 }, { priority: 2, dedupKey: 'k', maxTries: undefined });
    assert.equal((await pushBatch(old, 'q', [{ n: 2 }, { n: 3 }], { maxTries: null })).length, 2);
    await assert.rejects(push(old, 'q', { n: 4 }, { maxTries: 2 }), needs('push with maxTries', '1.1'));
    await assert.rejects(pushBatch(old, 'q', [{ n: 5 }], { maxTries: 2 }), needs('pushBatch with maxTries', '1.1'));
    // in the caller's transaction: the error aborted it, the version is unknown
    await old.query('BEGIN');
    await push(old, 'q', { n: 6 });
    await assert.rejects(push(old, 'q', { n: 7 }, { maxTries: 1 }),
      needs('push with maxTries', '(version unknown: the transaction is aborted)'));
    await old.query('ROLLBACK');
    const { rows: [c] } = await old.query('SELECT count(*)::int AS n FROM pgqueue.queue');
    assert.equal(c.n, 3);
    const { rows: [j] } = await old.query('SELECT max_tries FROM pgqueue.jobs WHERE id = $1', [id]);
    assert.equal(j.max_tries, 5);
  });
});

// --- groupKey and groupMaxInFlight (pgqueue 1.2) -----------------------------

async function hasGroups() {
  const { rows: [r] } = await admin.query("SELECT count(*) = 2 AS ok FROM pg_catalog.pg_proc"
    + " WHERE proname IN ('pgq_push', 'pgq_push_batch') AND 'group_key' = ANY (proargnames)");
  return r.ok;
}

// The jobs scheduled and claimed by one pass, acked: their ids, sorted.
async function passAndAck(q) {
  await admin.query('SELECT pgq_schedule(1000)');
  const { rows } = await admin.query("SELECT id FROM pgq_claim('probe', 100, '1 minute', ARRAY[$1])", [q]);
  for (const r of rows) await admin.query("SELECT pgq_ack($1, 'probe')", [r.id]);
  return rows.map((r) => r.id).sort();
}

test('push groupKey and configure groupMaxInFlight: a group\'s jobs one at a time, in order', async (t) => {
  if (!(await hasGroups())) { t.skip("needs pgqueue 1.2's pgq_push(..., group_key)"); return; }
  const q = queueName();
  await configure(admin, q, { groupMaxInFlight: 1 });
  const { rows: [s] } = await admin.query('SELECT group_max_in_flight FROM pgqueue.queues WHERE queue = $1', [q]);
  assert.equal(s.group_max_in_flight, 1);
  const a0 = await push(app, q, { n: 0 }, { groupKey: 'a' });
  const a1 = await push(app, q, { n: 1 }, { groupKey: 'a' });
  const b = await pushBatch(app, q, [{ n: 10 }, { n: 11 }], { groupKey: 'b' });
  const free = await push(app, q, { n: 20 });
  const { rows } = await admin.query('SELECT id, group_key FROM pgqueue.jobs WHERE queue = $1', [q]);
  assert.deepEqual(Object.fromEntries(rows.map((r) => [r.id, r.group_key])),
    { [a0]: 'a', [a1]: 'a', [b[0]]: 'b', [b[1]]: 'b', [free]: null });
  assert.deepEqual(await passAndAck(q), [a0, b[0], free].sort());
  assert.deepEqual(await passAndAck(q), [a1, b[1]].sort());
  await assert.rejects(push(app, q, {}, { groupKey: '' }), (e) => e.code === '22023');
  await assert.rejects(configure(admin, q, { groupMaxInFlight: -1 }), (e) => e.code === '22023');
  await configure(admin, q, { groupMaxInFlight: 0 });
});
