// The Worker against a real server (and, in the second pass, PgBouncer).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { push, pushBatch, LeaseLost, Retry, Worker, WorkerSetupError, formatError } from 'pgqueue';
import {
  PASS, activeClaims, adminConfig, config, connect, counter, exited, jobRows, keepingLogger, logLines, queueName, quiet,
  restartServer, sleep, startProc, waitUntil, watchQueries,
} from './helpers.mjs';

let admin;
let app;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pgq-node-'));

before(async () => {
  admin = await connect(adminConfig);
  app = await connect(config);
});
after(async () => {
  await admin.end();
  await app.end();
});

// A worker for queue(s) with handler, started now; stopped by the test.
function worker(queues, handler, options = {}) {
  const w = new Worker(config, { logger: quiet, ...options });
  for (const q of [queues].flat()) w.handle(q, handler);
  w.running = w.run({ signals: false });
  return w;
}

test('2,000 jobs over 3 queues, 4 handlers: each done exactly once', async () => {
  const base = queueName();
  const queues = [0, 1, 2].map((i) => `${base}_${i}`);
  await app.query('BEGIN');
  for (const [i, q] of queues.entries()) {
    const payloads = [];
    for (let n = i; n < 2000; n += 3) payloads.push({ n });
    await pushBatch(app, q, payloads);
  }
  await app.query('COMMIT');
  const done = [];
  const keys = new Set();
  let active = 0;
  let most = 0;
  const w = worker(queues, async (job) => {
    active += 1;
    most = Math.max(most, active);
    await sleep(2);
    active -= 1;
    done.push([job.queue, job.payload.n]);
    keys.add(job.lockKey);
  }, { concurrency: 4, wait: 5 });
  await waitUntil(() => done.length >= 2000, 120000, '2,000 jobs done');
  const left = async () => {
    let n = 0;
    for (const q of queues) n += (await jobRows(admin, q)).length;
    return n;
  };
  await waitUntil(async () => (await left()) === 0, 10000, 'acks');
  await w.stop();
  await w.running;
  const ns = done.map(([, n]) => n).sort((a, b) => a - b);
  assert.deepEqual(ns, Array.from({ length: 2000 }, (_, i) => i));
  assert.ok(done.every(([q, n]) => q === queues[n % 3]));
  assert.deepEqual([...keys], [w.lockKey], 'one lock_key per worker');
  assert.match(w.lockKey, new RegExp(`^${os.hostname()}:${process.pid}:\\d+$`));
  assert.ok(most > 1, 'handlers never ran at the same time');
});

test('one claim takes a job for each free handler, never more', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, Array.from({ length: 11 }, (_, n) => ({ n })));
  await waitUntil(async () => (await jobRows(admin, q)).every((r) => r.state === 'scheduled'), 20000, 'scheduling');
  const claims = []; // [asked, got]
  const unwatch = watchQueries((text, values, res) => {
    if (text.includes('FROM pgq_claim(')) claims.push([Number(values[1]), res ? res.rows.length : -1]);
  });
  let gate;
  const open = new Promise((r) => { gate = r; });
  const started = [];
  let w;
  try {
    w = worker(q, async (job) => { started.push(job.lockKey); await open; }, { concurrency: 8, wait: 1 });
    await waitUntil(() => started.length === 8, 20000, '8 handlers');
    await sleep(300);
    assert.equal(started.length, 8, 'a handler started beyond concurrency');
    gate();
    await waitUntil(async () => (await jobRows(admin, q)).length === 0, 20000, 'all acked');
    await w.stop();
  } finally {
    unwatch();
    gate();
    await w?.stop();
  }
  assert.deepEqual(claims[0], [8, 8], `claims: ${JSON.stringify(claims)}`);
  assert.equal(started.length, ids.length);
  assert.equal(new Set(started).size, 1);
  // a claim asks for the free handlers only: 3 jobs were left, up to 8 free
  assert.ok(claims.slice(1).every(([asked]) => asked >= 1 && asked <= 8), JSON.stringify(claims));
  assert.equal(claims.reduce((n, [, got]) => n + Math.max(got, 0), 0), ids.length);
});

test('after a claim that found jobs, the next waits claimDelay for the handlers that end together', async () => {
  const q = queueName();
  await pushBatch(app, q, Array.from({ length: 400 }, (_, n) => ({ n })));
  await waitUntil(async () => (await jobRows(admin, q)).every((r) => r.state === 'scheduled'), 20000, 'scheduling');
  const sizes = [];
  const unwatch = watchQueries((text, values, res) => {
    if (text.includes('FROM pgq_claim(') && res && res.rows.length) sizes.push(res.rows.length);
  });
  const done = [];
  let w;
  try {
    // they end at different times: 0 to 15 ms
    w = worker(q, async (job) => { await sleep(5 * (job.payload.n % 4)); done.push(job.payload.n); }, { concurrency: 8, wait: 2, claimDelay: 0.05 });
    await waitUntil(() => done.length === 400, 60000, '400 jobs done');
    await w.stop();
  } finally {
    unwatch();
    await w?.stop();
  }
  assert.deepEqual([...done].sort((a, b) => a - b), Array.from({ length: 400 }, (_, n) => n));
  // 50 claims of 8 at best; about one per job without the delay
  assert.equal(sizes.reduce((a, b) => a + b, 0), 400);
  assert.ok(sizes.length <= 80 && sizes.every((n) => n <= 8), `claims: ${JSON.stringify(sizes)}`);
  assert.throws(() => new Worker(config, { claimDelay: 2 }), /claimDelay/);
});

test('a claim whose answer was lost: its jobs are released once the jobs under its key are done', async () => {
  // A runs under the worker's key; the claim that takes B commits, but the
  // answer of the statement that committed it (the claim, or the COMMIT of
  // a claim that waited) is lost with the connection: B is held by the key
  // and nobody knows.  The worker goes on under a new key and releases the
  // old one as soon as A is acked (not before: A would run again).
  const q = queueName();
  const a = await push(app, q, { n: 0 });
  let gate;
  const open = new Promise((r) => { gate = r; });
  const runs = [];
  const logger = keepingLogger();
  const { query } = pg.Client.prototype;
  let lose = false;
  let inTransaction = null; // the client whose waiting claim took a job, until its COMMIT
  pg.Client.prototype.query = function losing(text, values, ...rest) {
    const p = query.call(this, text, values, ...rest);
    const claim = typeof text === 'string' && text.includes('FROM pgq_claim(');
    if (!claim && !(text === 'COMMIT' && inTransaction === this)) return p;
    return p.then((res) => {
      if (claim) {
        if (!lose || !res.rows.length) return res;
        if (values[4] !== '0 seconds') { inTransaction = this; return res; }
      }
      inTransaction = null;
      lose = false;
      this.connection.stream.destroy();
      throw Object.assign(new Error('connection reset (test)'), { code: 'ECONNRESET' });
    });
  };
  let w;
  let b;
  let first;
  try {
    w = worker(q, async (job) => {
      runs.push(`${job.id} ${job.tries} ${job.lockKey}`);
      if (job.id === a) await open;
    }, { concurrency: 2, wait: 1, logger });
    await waitUntil(() => runs.length === 1, 20000, 'A to start');
    first = w.lockKey;
    lose = true;
    b = await push(app, q, { n: 1 });
    await waitUntil(() => !lose, 20000, 'the lost claim');
    await sleep(500);
    const rows = await jobRows(admin, q);
    assert.deepEqual(rows.map((r) => [r.id, r.lock_key]).sort(), [[a, first], [b, first]].sort(), 'released before A was done');
    assert.notEqual(w.lockKey, first);
    gate();
    await waitUntil(async () => (await jobRows(admin, q)).length === 0, 10000, 'B released, claimed again and acked');
    await w.stop();
  } finally {
    pg.Client.prototype.query = query;
    gate();
    await w?.stop();
  }
  assert.deepEqual(runs, [`${a} 1 ${first}`, `${b} 2 ${w.lockKey}`]);
  assert.ok(logger.lines.some((l) => l.includes(`released 1 job(s) of ${first}`)), logger.lines.join('\n'));
});

test('a handler that throws is retried, then failed (dead letter)', async () => {
  const q = queueName();
  await admin.query('SELECT pgq_configure($1, max_tries => 3)', [q]);
  const id = await push(app, q, { x: 1 });
  const tries = [];
  const w = worker(q, async function explode(job) {
    tries.push(job.tries);
    throw new TypeError(`boom on try ${job.tries}`);
  }, { concurrency: 2, retryDelay: 0, wait: 5 });
  await waitUntil(async () => (await jobRows(admin, q))[0].state === 'failed', 30000, 'the job to fail');
  await w.stop();
  assert.deepEqual(tries, [1, 2, 3]);
  const [row] = await jobRows(admin, q);
  assert.equal(row.id, id);
  assert.equal(row.tries, 3);
  assert.match(row.last_error, /^TypeError: boom on try 3\n\s+at explode /);
});

test('a handler may choose the retry delay', async () => {
  const q = queueName();
  await push(app, q);
  const w = worker(q, async () => { throw new Retry(600, 'rate limited'); }, { concurrency: 1, wait: 5 });
  await waitUntil(async () => (await jobRows(admin, q))[0].state === 'retry', 20000, 'the nack');
  await w.stop();
  const { rows: [r] } = await admin.query(
    'SELECT last_error, extract(epoch FROM run_after - now())::float8 AS due_in FROM pgqueue.queue WHERE queue = $1', [q]);
  assert.equal(r.last_error, 'Retry: rate limited');
  assert.ok(r.due_in > 590 && r.due_in <= 600, String(r.due_in));
});

test('a handler slower than the lease keeps its job (heartbeat)', async () => {
  const q = queueName();
  await push(app, q);
  const stolenBefore = await counter(admin, 'leases_stolen');
  const calls = [];
  const slow = async (job) => {
    calls.push([job.lockKey, job.tries]);
    await sleep(4500);
    assert.equal(job.leaseLost, false);
  };
  const first = worker(q, slow, { concurrency: 1, lease: 1.5, wait: 5 });
  await waitUntil(() => calls.length, 20000, 'the first claim');
  const second = worker(q, slow, { concurrency: 2, lease: 1.5, wait: 1 });
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 20000, 'the ack');
  await Promise.all([first.stop(), second.stop()]);
  assert.equal(calls.length, 1);
  assert.equal(calls[0][1], 1);
  assert.ok(first.lockKeys.includes(calls[0][0]));
  assert.equal(await counter(admin, 'leases_stolen'), stolenBefore);
});

test('a stalled extension does not hold up the others\' (lock_timeout, then one by one)', async () => {
  const q = queueName();
  const [a, b] = await pushBatch(app, q, [{ n: 0 }, { n: 1 }]);
  const logger = keepingLogger();
  const started = new Set();
  const w = worker(q, async (job) => { started.add(job.id); await sleep(4500); },
    { concurrency: 2, lease: 1.5, wait: 1, logger });
  const locker = await connect(adminConfig);
  try {
    await waitUntil(() => started.size === 2, 20000, '2 handlers');
    await locker.query('BEGIN');
    await locker.query('SELECT id FROM pgqueue.work_queue WHERE id = $1 FOR UPDATE', [a]);
    // while a's row is locked, b's lease must keep moving
    const seen = [];
    for (let i = 0; i < 12; i++) {
      await sleep(200);
      const { rows: [r] } = await admin.query(
        'SELECT lock_key, lock_timeout > clock_timestamp() AS live, lock_timeout FROM pgqueue.work_queue WHERE id = $1', [b]);
      seen.push(r);
    }
    assert.ok(seen.every((r) => r.live && r.lock_key === w.lockKey), JSON.stringify(seen));
    assert.ok(seen.at(-1).lock_timeout > seen[0].lock_timeout, 'b was not extended');
    await locker.query('ROLLBACK');
    await waitUntil(async () => (await jobRows(admin, q)).length === 0, 20000, 'both acked');
  } finally {
    await locker.end();
    await w.stop();
  }
  assert.ok(logger.lines.some((l) => l.startsWith('warn') && l.includes(`extending job ${a} waited too long`)), logger.lines.join('\n'));
  assert.ok(!logger.lines.some((l) => l.startsWith('error')), logger.lines.join('\n'));
});

test('a worker at concurrency 16 uses at most 3 server connections', { skip: PASS !== 'direct' && 'direct pass only (PgBouncer sets application_name on server connections it shares)' }, async () => {
  const q = queueName();
  const appName = `pgq-test-${q}`;
  await pushBatch(app, q, Array.from({ length: 40 }, (_, n) => ({ n })));
  let running = 0;
  let most = 0;
  let done = 0;
  const w = new Worker({ ...config, application_name: appName }, { concurrency: 16, lease: 1.5, wait: 1, logger: quiet });
  w.handle(q, async () => {
    running += 1;
    most = Math.max(most, running);
    await sleep(1200);
    running -= 1;
    done += 1;
  });
  const stopped = w.run({ signals: false });
  let peak = 0;
  try {
    while (done < 40) {
      const { rows: [r] } = await admin.query(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1', [appName]);
      peak = Math.max(peak, r.n);
      await sleep(100);
    }
  } finally {
    await w.stop();
    await stopped;
  }
  assert.equal(most, 16, 'the handlers did not all run at once');
  assert.ok(peak >= 1 && peak <= 3, `${peak} server connections`);
});

test('a lost lease is not acked, and this is logged', async () => {
  const q = queueName();
  const id = await push(app, q);
  const logger = keepingLogger();
  let started = false;
  let sawLost = false;
  const w = worker(q, async (job) => {
    started = true;
    await waitUntil(() => job.leaseLost, 10000, 'the heartbeat to notice');
    sawLost = true;
  }, { concurrency: 1, lease: 1.5, wait: 5, logger });
  await waitUntil(() => started, 20000, 'the handler');
  await admin.query("UPDATE pgqueue.work_queue SET lock_key = 'intruder' WHERE id = $1", [id]);
  await waitUntil(() => sawLost, 15000, 'the lost lease');
  await sleep(300);
  await w.stop();
  const rows = await jobRows(admin, q);
  assert.deepEqual(rows.map((r) => [r.state, r.lock_key]), [['scheduled', 'intruder']]);
  assert.ok(logger.lines.some((l) => l.startsWith('error') && l.includes(`lease of job ${id}`) && l.includes('not acked')), logger.lines.join('\n'));
});

test('a worker killed with SIGKILL mid-job: the job is stolen after the lease, done once', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, [{ n: 0 }, { n: 1 }, { n: 2 }]);
  const log = path.join(tmp, `${q}.log`);
  const p = startProc(q, log, ['1', '2', '60', '30']);
  try {
    await waitUntil(() => logLines(log, 'start').length, 30000, 'the first job to start');
    p.kill('SIGKILL');
    await exited(p);
  } finally {
    p.kill('SIGKILL');
  }
  const [[victim, tries]] = logLines(log, 'start');
  assert.equal(tries, '1');
  const done = [];
  const w = worker(q, async (job) => { done.push(`${job.id} ${job.tries}`); }, { concurrency: 2, wait: 2 });
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 30000, 'all jobs acked');
  await w.stop();
  assert.deepEqual(done.sort(), ids.map((i) => `${i} ${i === victim ? 2 : 1}`).sort());
});

test('a worker killed while its claim waits leaves no claim behind to take a job for no one', async () => {
  // SIGKILL while the worker waits for work (a 30 s blocking claim): the
  // server notices within about a second (client_connection_check_interval,
  // set in the claim's transaction) and ends the claim, which would
  // otherwise take the next job for a worker that is gone (the job would
  // wait out a lease and lose a try)
  const q = queueName();
  const name = `pgqueue orphan test ${q}`;
  const log = path.join(tmp, `${q}.log`);
  const claims = () => activeClaims(admin, name);
  const p = startProc(q, log, ['1', '30', '0', '30', '', '30', name]);
  let waiting;
  try {
    waiting = await waitUntil(claims, 30000, "the worker's blocking claim");
    p.kill('SIGKILL');
    await exited(p);
  } finally {
    p.kill('SIGKILL');
  }
  assert.equal(waiting, 1, 'claims waiting when the worker was killed');
  await waitUntil(async () => (await claims()) === 0, 10000, "the server to end the dead worker's claim");
  const id = await push(app, q);
  const t0 = Date.now();
  const { rows } = await admin.query("SELECT id, tries FROM pgq_claim('probe', 1, '1 minute', ARRAY[$1], '5 seconds')", [q]);
  const took = Date.now() - t0;
  assert.deepEqual(rows, [{ id, tries: 1 }], 'the job was taken (a try used) by the dead worker\'s claim');
  assert.ok(took < 2000, `claimable after ${took} ms`);
});

test('stop() cancels the waiting claim and rolls its transaction back: the release after it goes through', async () => {
  // one handler runs past shutdownTimeout while the other's claim waits:
  // the release at shutdown goes on the claimer's connection, which the
  // cancelled claim must have left out of its transaction
  const q = queueName();
  const name = `pgqueue cancel test ${q}`;
  const id = await push(app, q);
  const logger = keepingLogger();
  let started = false;
  const w = new Worker({ ...config, application_name: name }, { concurrency: 2, wait: 30, shutdownTimeout: 0.5, logger });
  w.handle(q, async () => { started = true; await sleep(3000); });
  const running = w.run({ signals: false });
  let took;
  try {
    await waitUntil(() => started, 20000, 'the handler');
    await waitUntil(() => activeClaims(admin, name), 20000, 'the waiting claim');
    const t0 = Date.now();
    await w.stop();
    took = (Date.now() - t0) / 1000;
  } finally {
    await w.stop();
    await running;
  }
  assert.ok(took < 3, `stop() took ${took}s`);
  assert.deepEqual((await jobRows(admin, q)).map((r) => [r.id, r.state, r.lock_key]), [[id, 'scheduled', null]], 'not released');
  assert.ok(logger.lines.some((l) => l.includes('released 1 job(s)')), logger.lines.join('\n'));
  assert.ok(!logger.lines.some((l) => l.startsWith('error')), logger.lines.join('\n'));
});

test('SIGTERM with running handlers: they finish, nothing is lost', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, Array.from({ length: 10 }, (_, n) => ({ n })));
  const log = path.join(tmp, `${q}.log`);
  const p = startProc(q, log, ['4', '30', '1.5', '30']);
  let took;
  try {
    await waitUntil(() => logLines(log, 'start').length === 4, 30000, '4 running handlers');
    const t0 = Date.now();
    p.kill('SIGTERM');
    assert.equal(await exited(p), 0);
    took = (Date.now() - t0) / 1000;
  } finally {
    p.kill('SIGKILL');
  }
  const started = logLines(log, 'start').map(([id]) => id).sort();
  assert.deepEqual(logLines(log, 'done').map(([id]) => id).sort(), started);
  assert.ok(took < 4, `exit took ${took}s: waiting claims were not cancelled`);
  const rows = await jobRows(admin, q);
  assert.deepEqual(rows.map((r) => r.id).sort(), ids.filter((i) => !started.includes(i)).sort());
  assert.ok(rows.every((r) => r.lock_key === null && r.tries === 0));
  const done = [];
  const w = worker(q, async (job) => { done.push(job.id); }, { concurrency: 2, wait: 2 });
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 30000, 'the rest done');
  await w.stop();
  assert.deepEqual([...done, ...started].sort(), [...ids].sort());
});

test('SIGTERM past the shutdown timeout releases the job', async () => {
  const q = queueName();
  const id = await push(app, q);
  const log = path.join(tmp, `${q}.log`);
  const p = startProc(q, log, ['1', '600', '60', '0.5']);
  try {
    await waitUntil(() => logLines(log, 'start').length, 30000, 'the handler to start');
    p.kill('SIGTERM');
    assert.equal(await exited(p), 0);
  } finally {
    p.kill('SIGKILL');
  }
  assert.deepEqual(logLines(log, 'done'), []);
  const { rows } = await admin.query("SELECT id, tries FROM pgq_claim('probe', 1, '1 minute', ARRAY[$1])", [q]);
  assert.deepEqual(rows, [{ id, tries: 2 }]);
  assert.match(fs.readFileSync(`${log}.stderr`, 'utf8'), /released 1 job\(s\)/);
});

test('stop() lets an ack on its way land before it releases what is still held', async () => {
  // the handler is done and its ack on the way (slowed down here) when
  // shutdownTimeout runs out: the job must not be released to run again
  const q = queueName();
  const id = await push(app, q);
  const done = [];
  const logger = keepingLogger();
  let acks = 0;
  const { query } = pg.Client.prototype;
  pg.Client.prototype.query = function slowAck(text, ...rest) {
    if (typeof text === 'string' && /pgq_ack(_batch)?\(/.test(text)) {
      acks += 1;
      return sleep(1500).then(() => query.call(this, text, ...rest));
    }
    return query.call(this, text, ...rest);
  };
  const w = worker(q, async (job) => { done.push(job.id); }, { concurrency: 1, wait: 2, shutdownTimeout: 0.5, logger });
  try {
    await waitUntil(() => acks, 20000, 'the ack');
    await w.stop();
    await w.running;
    await sleep(2000); // an ack that stop() left behind lands now
  } finally {
    pg.Client.prototype.query = query;
  }
  assert.deepEqual(done, [id]);
  assert.equal(acks, 1);
  assert.deepEqual(await jobRows(admin, q), [], 'the job was released while its ack was on its way');
  assert.ok(!logger.lines.some((l) => /answered false|released 1 job/.test(l)), logger.lines.join('\n'));
});

test('a batch of acks with a job another worker took: the others are acked, that one reported lost', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, [{ n: 0 }, { n: 1 }, { n: 2 }]);
  const logger = keepingLogger();
  const statements = [];
  const unwatch = watchQueries((text, values, res, err) => {
    if (/pgq_ack/.test(text)) statements.push([text.includes('pgq_ack_batch') ? 'batch' : 'each', values[0].length, err ? err.code : 'ok']);
  });
  let gate;
  const open = new Promise((r) => { gate = r; });
  const jobs = new Map();
  let w;
  try {
    w = worker(q, async (job) => { jobs.set(job.id, job); await open; },
      { concurrency: 3, wait: 1, completeInterval: 0.3, logger });
    await waitUntil(() => jobs.size === 3, 20000, '3 handlers');
    // the lease of ids[1] runs out and another worker takes it
    await admin.query("UPDATE pgqueue.work_queue SET lock_timeout = now() - interval '1 second' WHERE id = $1", [ids[1]]);
    const { rows } = await admin.query("SELECT id FROM pgq_claim('intruder', 1, '1 minute', ARRAY[$1])", [q]);
    assert.deepEqual(rows, [{ id: ids[1] }]);
    gate();
    await waitUntil(async () => (await jobRows(admin, q)).length === 1, 10000, 'the acks');
    await waitUntil(() => jobs.get(ids[1]).leaseLost, 5000, 'the lost lease');
    await w.stop();
  } finally {
    unwatch();
    gate();
    await w?.stop();
  }
  assert.deepEqual((await jobRows(admin, q)).map((r) => [r.id, r.lock_key]), [[ids[1], 'intruder']]);
  assert.deepEqual(statements, [['batch', 3, '22P02'], ['each', 3, 'ok']]);
  assert.deepEqual(ids.map((id) => jobs.get(id).leaseLost), [false, true, false]);
  const lost = logger.lines.filter((l) => l.startsWith('error') && l.includes('lease of job'));
  assert.equal(lost.length, 1, logger.lines.join('\n'));
  assert.ok(lost[0].includes(ids[1]) && lost[0].includes('not acked'), lost[0]);
  assert.ok(!logger.lines.some((l) => /answered false: the ack sent before/.test(l)));
});

test('stop() sends the acks still waiting for their batch before it releases', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, [{ n: 0 }, { n: 1 }, { n: 2 }]);
  const logger = keepingLogger();
  const done = [];
  let acks = 0;
  const unwatch = watchQueries((text) => { if (/pgq_ack/.test(text)) acks += 1; });
  let w;
  try {
    w = worker(q, async (job) => { done.push(job.id); }, { concurrency: 3, wait: 1, completeInterval: 60, logger });
    await waitUntil(() => done.length === 3, 20000, '3 jobs done');
    await sleep(500);
    assert.equal(acks, 0, 'acked before completeInterval');
    assert.equal((await jobRows(admin, q)).length, 3);
    await w.stop();
  } finally {
    unwatch();
    await w?.stop();
  }
  assert.equal(acks, 1);
  assert.deepEqual(await jobRows(admin, q), []);
  assert.deepEqual(done.sort(), [...ids].sort());
  assert.ok(!logger.lines.some((l) => /released \d+ job/.test(l)), logger.lines.join('\n'));
});

test('a worker killed between the end of a handler and its ack: the job runs again, once', async () => {
  const q = queueName();
  const id = await push(app, q);
  const log = path.join(tmp, `${q}.log`);
  // acks wait 60 s for their batch: the kill comes first
  const p = startProc(q, log, ['1', '2', '0', '30', '60']);
  try {
    await waitUntil(() => logLines(log, 'done').length, 30000, 'the handler to finish');
    await sleep(200);
    p.kill('SIGKILL');
    await exited(p);
  } finally {
    p.kill('SIGKILL');
  }
  assert.deepEqual(logLines(log, 'start'), [[id, '1']]);
  assert.deepEqual((await jobRows(admin, q)).map((r) => r.id), [id], 'acked before the kill');
  const runs = [];
  const w = worker(q, async (job) => { runs.push([job.id, job.tries]); }, { concurrency: 2, wait: 1 });
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 30000, 'the job done again');
  await sleep(500);
  await w.stop();
  // tries: 2, or 3 if the dead worker's waiting claim outlived it long
  // enough to take the job once its 2 s lease ran out (the server ends such
  // a claim within about a second: client_connection_check_interval)
  assert.equal(runs.length, 1, JSON.stringify(runs));
  assert.equal(runs[0][0], id);
  assert.ok(runs[0][1] >= 2, String(runs[0][1]));
});

// A table the handlers of queue q write to (role app may insert).
async function workTable(q) {
  const table = `tx_${q}`;
  await admin.query(`CREATE TABLE ${table} (job uuid PRIMARY KEY, n int)`);
  await admin.query(`GRANT SELECT, INSERT ON ${table} TO app`);
  return table;
}

test('job.transaction(): the work commits with the ack; a throw or a lost lease commits neither', async () => {
  const q = queueName();
  await admin.query('SELECT pgq_configure($1, max_tries => 1)', [q]);
  const table = await workTable(q);
  const good = await pushBatch(app, q, Array.from({ length: 4 }, (_, n) => ({ n })));
  const bad = await push(app, q, { n: 10, fail: true });
  const fenced = await push(app, q, { n: 20, fence: true });
  const raised = {};
  const lost = [];
  const sent = { ack: 0, nack: 0 };
  const unwatch = watchQueries((text) => {
    if (text.includes('pgq_ack_batch(') || text.includes('pgq_ack(u.id')) sent.ack += 1;
    if (text.includes('pgq_nack(')) sent.nack += 1;
  });
  const logger = keepingLogger();
  let w;
  try {
    w = worker(q, async (job) => {
      try {
        await job.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${table} VALUES ($1, $2)`, [job.id, job.payload.n]);
          if (job.payload.fail) throw new Error('failed after the write');
          if (job.payload.fence) await admin.query("UPDATE pgqueue.work_queue SET lock_key = 'intruder' WHERE id = $1", [job.id]);
        });
      } catch (err) {
        raised[job.id] = err instanceof LeaseLost ? 'LeaseLost' : err.name;
        throw err;
      }
    }, { concurrency: 3, wait: 2, logger });
    w.on('leaseLost', (job, why) => lost.push([job.id, why]));
    await waitUntil(async () => JSON.stringify((await jobRows(admin, q)).map((r) => r.state).sort())
      === JSON.stringify(['failed', 'scheduled']), 20000, 'the acks and the nack');
    await w.stop();
  } finally {
    unwatch();
    await w?.stop();
  }
  const { rows: written } = await admin.query(`SELECT job FROM ${table} ORDER BY job`);
  assert.deepEqual(written.map((r) => r.job), [...good].sort());
  const rows = await jobRows(admin, q);
  assert.deepEqual(rows.map((r) => [r.id, r.lock_key]).sort(), [[bad, null], [fenced, 'intruder']].sort());
  assert.deepEqual(raised, { [bad]: 'Error', [fenced]: 'LeaseLost' });
  // acked in their transactions: the completer sent the nack only
  assert.deepEqual(sent, { ack: 0, nack: 1 });
  assert.equal(lost.length, 1);
  assert.equal(lost[0][0], fenced);
  assert.match(lost[0][1], /ack in job\.transaction\(\)/);
  assert.ok(logger.lines.some((l) => l.includes(fenced) && l.includes('lost')), logger.lines.join('\n'));
  assert.throws(() => new Worker(config, { transactionConnections: 0 }), /transactionConnections/);
});

test('job.transaction(): a worker killed between the work and the commit: neither kept, the job runs again once', async () => {
  const q = queueName();
  const table = await workTable(q);
  const id = await push(app, q);
  const log = path.join(tmp, `${q}.log`);
  process.env.PGQ_TX_TABLE = table;
  let p;
  try {
    p = startProc(q, log, ['1', '3', '60', '5']);
  } finally {
    delete process.env.PGQ_TX_TABLE;
  }
  try {
    await waitUntil(() => logLines(log, 'written').length === 1, 30000, "the handler's write");
  } finally {
    p.kill('SIGKILL');
  }
  await exited(p);
  await waitUntil(async () => (await admin.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE state = 'idle in transaction'"
    + " AND usename = 'app'")).rows[0].n === 0, 10000, 'the transaction to end');
  assert.equal((await admin.query(`SELECT count(*)::int AS n FROM ${table}`)).rows[0].n, 0);
  assert.deepEqual((await jobRows(admin, q)).map((r) => r.id), [id]);
  const tries = [];
  const w = worker(q, async (job) => {
    tries.push(job.tries);
    await job.transaction(async (tx) => { await tx.query(`INSERT INTO ${table} (job) VALUES ($1)`, [job.id]); });
  }, { concurrency: 1, wait: 2 });
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 30000, 'the job acked');
  await w.stop();
  assert.equal(tries.length, 1, JSON.stringify(tries));
  assert.ok(tries[0] >= 2, String(tries[0]));
  assert.deepEqual((await admin.query(`SELECT job FROM ${table}`)).rows.map((r) => r.job), [id]);
});

test('the server restarted under a running worker: it reconnects, the rest is done once', async () => {
  const q = queueName();
  const ids = await pushBatch(app, q, Array.from({ length: 400 }, (_, n) => ({ n })));
  const done = [];
  const w = worker(q, async (job) => { await sleep(10); done.push(job.id); },
    { concurrency: 4, wait: 5, reconnectMaxDelay: 1 });
  await waitUntil(() => done.length >= 100, 60000, '100 jobs done');
  await admin.end();
  await app.end();
  restartServer();
  assert.ok(done.length < 400, 'the restart came too late to test anything');
  admin = await connect(adminConfig);
  app = await connect(config);
  await waitUntil(() => done.length >= 400, 120000, 'the rest after the restart');
  await waitUntil(async () => (await jobRows(admin, q)).length === 0, 30000, 'the last acks');
  await w.stop();
  assert.deepEqual([...done].sort(), [...ids].sort());
});

test('events: started, jobStarted, jobSucceeded, jobFailed, leaseLost, stopped', async () => {
  const q = queueName();
  const [good, bad, lost] = await pushBatch(app, q, [{ n: 0 }, { n: 1 }, { n: 2 }]);
  const logger = keepingLogger();
  const events = [];
  let gate;
  const open = new Promise((r) => { gate = r; });
  const w = new Worker(config, { concurrency: 3, wait: 1, completeInterval: 0.2, logger });
  const boom = new RangeError('boom');
  w.handle(q, async (job) => {
    await open;
    await sleep(50);
    if (job.id === bad) throw boom;
  });
  for (const name of ['started', 'stopped', 'jobStarted', 'jobSucceeded', 'jobFailed', 'leaseLost']) {
    w.on(name, (...args) => events.push([name, ...args]));
  }
  w.on('jobStarted', () => { throw new Error('a listener that throws'); });
  const running = w.run({ signals: false });
  try {
    await waitUntil(() => events.filter(([e]) => e === 'jobStarted').length === 3, 20000, '3 jobs started');
    await admin.query("UPDATE pgqueue.work_queue SET lock_key = 'intruder' WHERE id = $1", [lost]);
    gate();
    await waitUntil(() => events.length === 7, 10000, 'the outcomes');
  } finally {
    gate();
    await w.stop();
    await running;
  }
  const names = events.map(([e, job]) => (job?.id ? `${e} ${[good, bad, lost].indexOf(job.id)}` : e));
  assert.equal(names[0], 'started');
  assert.deepEqual(names.slice(1, 4).sort(), ['jobStarted 0', 'jobStarted 1', 'jobStarted 2']);
  assert.deepEqual(names.slice(4, 7).sort(), ['jobFailed 1', 'jobSucceeded 0', 'leaseLost 2']);
  assert.deepEqual(events.at(-1), ['stopped', null]);
  const by = (e) => events.find(([n]) => n === e);
  assert.ok(by('jobSucceeded')[2] >= 45 && by('jobSucceeded')[2] < 5000, String(by('jobSucceeded')[2]));
  assert.ok(by('jobFailed')[2] >= 45, String(by('jobFailed')[2]));
  assert.equal(by('jobFailed')[3], boom);
  assert.equal(by('leaseLost')[1].leaseLost, true);
  assert.match(by('leaseLost')[2], /another worker took it/);
  assert.equal(logger.lines.filter((l) => l.includes("a 'jobStarted' listener threw: a listener that throws")).length, 3);
  const rows = await jobRows(admin, q);
  assert.deepEqual(rows.map((r) => [r.id, r.state, r.lock_key]).sort(), [[bad, 'retry', null], [lost, 'scheduled', 'intruder']].sort());
});

test('a worker that stops for its setup says so in \'stopped\'', { skip: PASS !== 'direct' && 'direct pass only' }, async () => {
  const w = new Worker({ ...config, database: 'postgres' }, { concurrency: 1, logger: quiet });
  w.handle(queueName(), async () => {});
  const seen = [];
  w.on('started', () => seen.push('started'));
  w.on('stopped', (err) => seen.push(err));
  await assert.rejects(w.run({ signals: false }), WorkerSetupError);
  assert.equal(seen.length, 1);
  assert.ok(seen[0] instanceof WorkerSetupError, String(seen[0]));
});

test('a missing extension stops the worker with the reason', { skip: PASS !== 'direct' && 'direct pass only' }, async () => {
  const w = new Worker({ ...config, database: 'postgres' }, { concurrency: 1, logger: quiet });
  w.handle(queueName(), async () => {});
  await assert.rejects(w.run({ signals: false }), (err) => err instanceof WorkerSetupError && /pgq_claim/.test(err.message));
});

test('start() without the extension says how to fix it', { skip: PASS !== 'direct' && 'direct pass only' }, async () => {
  for (const how of ['run', 'start']) {
    const w = new Worker({ ...config, database: 'postgres' }, { concurrency: 1, logger: quiet });
    w.handle(queueName(), async () => {});
    try {
      await assert.rejects(how === 'start' ? w.start() : w.run({ signals: false }), (err) => err instanceof WorkerSetupError
        && err.message.includes('database "postgres"') && err.message.includes('CREATE EXTENSION pgqueue'));
    } finally {
      await w.stop();
    }
  }
});

test('start() fails in bounded time where no server listens', async () => {
  const port = await new Promise((resolve) => { // a port nothing listens on
    const srv = net.createServer().listen(0, '127.0.0.1', () => { const p = srv.address().port; srv.close(() => resolve(p)); });
  });
  const w = new Worker({ host: '127.0.0.1', port, database: 'pgq_test', user: 'app' },
    { concurrency: 2, startupTimeout: 1.5, reconnectMaxDelay: 0.5, logger: quiet });
  w.handle(queueName(), async () => {});
  const t0 = Date.now();
  try {
    await assert.rejects(w.start(), (err) => err instanceof WorkerSetupError
      && /cannot connect .*attempts.*startupTimeout 1\.5s.*port/.test(err.message));
  } finally {
    await w.stop();
  }
  const took = (Date.now() - t0) / 1000;
  assert.ok(took > 1.4 && took < 4, String(took));
});

test('formatError: name, message and the top of the stack', () => {
  function inner() { throw new RangeError('too far'); }
  let text;
  try { inner(); } catch (e) { text = formatError(e); }
  const [first, second] = text.split('\n');
  assert.equal(first, 'RangeError: too far');
  assert.match(second, /^\s+at inner /);
  assert.ok(formatError(new Error('x'.repeat(10000))).length <= 4000);
  assert.equal(formatError('a string'), 'thrown: a string');
});
