// push and pushBatch on the caller's own client and transaction.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { push, pushBatch } from 'pgqueue';
import { adminConfig, config, connect, queueName } from './helpers.mjs';

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
