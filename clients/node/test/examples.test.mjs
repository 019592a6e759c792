// examples/node_worker.mjs, started for real.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { push, pushBatch } from 'pgqueue';
import { adminConfig, config, connect, exited, jobRows, queueName, waitUntil } from './helpers.mjs';

const examples = path.join(process.env.PGQ_REPO ?? '', 'examples');
let admin;
let app;
before(async () => { admin = await connect(adminConfig); app = await connect(config); });
after(async () => { await admin.end(); await app.end(); });

test('examples/node_worker.mjs works a queue and stops on SIGTERM', async () => {
  const q = queueName();
  await admin.query('SELECT pgq_configure($1, max_tries => 1)', [q]);
  const good = await pushBatch(app, q, Array.from({ length: 5 }, (_, i) => ({ to: `u${i}@example.com` })));
  const bad = await push(app, q, { subject: 'no recipient' });
  const { host, port, user, database } = config;
  const url = host.startsWith('/')
    ? `postgres://${user}@${encodeURIComponent(host)}:${port}/${database}`
    : `postgres://${user}@${host}:${port}/${database}`;
  const p = spawn(process.execPath, [path.join(examples, 'node_worker.mjs'), q],
    { env: { ...process.env, DATABASE_URL: url }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  p.stdout.on('data', (d) => { out += d; });
  p.stderr.on('data', (d) => { out += d; });
  try {
    await waitUntil(async () => {
      const rows = await jobRows(admin, q);
      return rows.length === 1 && rows[0].state === 'failed';
    }, 30000, 'the example to work the queue');
    p.kill('SIGTERM');
    assert.equal(await exited(p), 0);
  } finally {
    p.kill('SIGKILL');
  }
  const done = [...out.matchAll(/^job (\S+): email to (\S+) \(try 1\)$/gm)].map((m) => `${m[1]} ${m[2]}`);
  assert.deepEqual(done.sort(), good.map((id, n) => `${id} u${n}@example.com`).sort());
  const [row] = await jobRows(admin, q);
  assert.equal(row.id, bad);
  assert.match(row.last_error, /^Error: payload has no 'to'/);
  assert.match(out, /SIGTERM received, stopping/);
});
