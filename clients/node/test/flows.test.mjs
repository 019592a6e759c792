// Flows (pgqueue 1.2): push and pushBatch with options.after, a job that
// waits for its parents; stats' waiting, jobs' waitingFor, purge 'waiting';
// and the error of after on pgqueue 1.1.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { test } from 'node:test';
import { NeedsNewerExtension, Worker, cancel, jobs, purge, push, pushBatch, stats } from 'pgqueue';
import {
  PASS, adminConfig, atVersion, config, needs12, pushTakes, queueName, quiet, sharedClients, sleep, waitUntil,
} from './helpers.mjs';

const db = sharedClients({ admin: adminConfig, app: config });

const NO_FLOWS = "needs pgqueue 1.2's pgq_push(..., after), which this server's extension does not have yet";

// id -> [state, waiting_for] of the unfinished ones among ids (pgqueue.jobs).
async function states(ids) {
  const { rows } = await db.admin.query('SELECT id, state, waiting_for FROM pgqueue.jobs WHERE id = ANY ($1::uuid[])', [ids]);
  return Object.fromEntries(rows.map((r) => [r.id, [r.state, r.waiting_for]]));
}

test('a fan-out and a fan-in run by a Worker: each job starts after its parents\' handlers ended', async (t) => {
  if (!await pushTakes(db.admin, 'after')) { t.skip(NO_FLOWS); return; }
  const q = queueName();
  const shards = `${q}_shards`;
  await db.app.query('BEGIN');
  const parent = await push(db.app, q, { step: 'snapshot' });
  const children = await pushBatch(db.app, shards, [0, 1, 2, 3, 4, 5].map((n) => ({ shard: n })), { after: [parent] });
  const merge = await push(db.app, q, { step: 'merge' }, { after: children });
  await db.app.query('COMMIT');
  // nothing ran yet: the children wait for 1 parent, the merge for 6
  const got = await states([parent, merge, ...children]);
  assert.ok(['pending', 'scheduled'].includes(got[parent][0]), got[parent][0]);
  for (const c of children) assert.deepEqual(got[c], ['waiting', 1]);
  assert.deepEqual(got[merge], ['waiting', 6]);
  const byQueue = Object.fromEntries((await stats(db.admin)).map((s) => [s.queue, s]));
  assert.equal(byQueue[shards].waiting, 6);
  assert.equal(byQueue[q].waiting, 1);
  const listed = await jobs(db.admin, { queue: shards, state: 'waiting' });
  assert.deepEqual(listed.map((j) => j.id).sort(), [...children].sort());
  assert.deepEqual([...new Set(listed.map((j) => j.waitingFor))], [1]);

  const log = []; // [event, name, time]
  const note = (event, name) => log.push([event, name, performance.now()]);
  let parentTries = 0;
  const w = new Worker(config, { concurrency: 4, wait: 1, retryDelay: 0, logger: quiet });
  w.handle(q, async (job) => {
    const name = job.payload.step;
    note('start', name);
    if (name === 'snapshot') {
      parentTries++;
      await sleep(300);
      if (parentTries === 1) { note('throw', name); throw new Error('the snapshot failed once'); }
    }
    note('end', name);
  });
  w.handle(shards, async (job) => {
    const name = `shard${job.payload.shard}`;
    note('start', name);
    await sleep(100 + 50 * job.payload.shard);
    note('end', name);
  });
  const running = w.run({ signals: false });
  try {
    await waitUntil(async () => Object.keys(await states([parent, merge, ...children])).length === 0,
      60000, 'the whole flow done');
  } finally {
    await w.stop();
    await running;
  }
  const when = (event, name) => log.filter(([e, n]) => e === event && n === name).map(([, , at]) => at);
  // the parent's first try threw and held the flow; its second ended it
  assert.equal(when('throw', 'snapshot').length, 1);
  assert.equal(when('end', 'snapshot').length, 1);
  const parentEnd = when('end', 'snapshot')[0];
  const names = [0, 1, 2, 3, 4, 5].map((n) => `shard${n}`);
  for (const name of names) {
    assert.equal(when('start', name).length, 1, name);
    assert.ok(when('start', name)[0] > parentEnd, `${name} started before its parent ended`);
  }
  const lastShardEnd = Math.max(...names.map((name) => when('end', name)[0]));
  assert.equal(when('start', 'merge').length, 1);
  assert.ok(when('start', 'merge')[0] > lastShardEnd, 'the merge started before a shard ended');
});

test('after: ids known or not, none, wrong types, over 1,000; cancel and purge take the waiting jobs along', async (t) => {
  if (!await pushTakes(db.admin, 'after')) { t.skip(NO_FLOWS); return; }
  const q = queueName();
  const parent = await push(db.app, q, { n: 1 });
  const never = crypto.randomUUID(); // never pushed: counts as done
  const child = await push(db.app, q, { n: 2 }, { after: [parent, never, parent] });
  assert.deepEqual(await states([child]), { [child]: ['waiting', 1] });
  const { rows } = await db.admin.query('SELECT parent FROM pgqueue.job_parents WHERE child = $1', [child]);
  assert.deepEqual(rows, [{ parent }]);
  // no parent at all, or only done ones: not waiting
  const alone = await push(db.app, q, {}, { after: [] });
  const batch = await pushBatch(db.app, q, [{ n: 3 }, { n: 4 }], { after: new Set([never]) });
  for (const [state, waitingFor] of Object.values(await states([alone, ...batch]))) {
    assert.notEqual(state, 'waiting');
    assert.equal(waitingFor, 0);
  }
  await assert.rejects(push(db.app, q, {}, { after: parent }), TypeError);
  await assert.rejects(push(db.app, q, {}, { after: ['not a uuid'] }), (err) => err.code === '22P02');
  const many = Array.from({ length: 1001 }, () => crypto.randomUUID());
  await assert.rejects(push(db.app, q, {}, { after: many }), (err) => err.code === '22023');
  await assert.rejects(pushBatch(db.app, q, [{}], { after: many }), (err) => err.code === '22023');
  // cancelling the parent cancels the child waiting for it
  assert.equal(await cancel(db.admin, parent), true);
  assert.deepEqual(await states([child]), {});
  // purge 'waiting'
  const p2 = await push(db.app, q, { n: 5 });
  const c2 = await pushBatch(db.app, q, [{ n: 6 }, { n: 7 }], { after: [p2] });
  assert.equal(await purge(db.admin, q, 'waiting'), 2);
  assert.deepEqual(await states(c2), {});
  await db.admin.query('DELETE FROM pgqueue.queue WHERE queue = $1', [q]);
});

test('after on pgqueue 1.1 says what to run; stats and jobs have no waiting there', { skip: PASS !== 'direct' && 'direct pass only (PgBouncer serves pgq_test only)' }, async () => {
  await atVersion(db.admin, '1.1', async (old) => {
    const needs = (what) => needs12(NeedsNewerExtension, what, '1.1');
    const parent = await push(old, 'q', { n: 1 }, { after: undefined });
    assert.equal((await pushBatch(old, 'q', [{ n: 2 }], { after: null })).length, 1);
    await assert.rejects(push(old, 'q', { n: 3 }, { after: [parent] }), needs('push with after'));
    await assert.rejects(pushBatch(old, 'q', [{ n: 4 }], { after: [parent] }), needs('pushBatch with after'));
    await assert.rejects(push(old, 'q', { n: 5 }, { maxTries: 2, after: [] }), needs('push with maxTries and after'));
    const { rows: [c] } = await old.query('SELECT count(*)::int AS n FROM pgqueue.queue');
    assert.equal(c.n, 2);
    const [s] = await stats(old);
    assert.equal(s.pending + s.scheduled, 2);
    assert.equal('waiting' in s, false);
    const listed = await jobs(old, { queue: 'q' });
    assert.equal(listed.length, 2);
    assert.equal('waitingFor' in listed[0], false);
  });
});
