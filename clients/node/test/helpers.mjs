// Shared by the Node tests: connections, polling, the server under test.
// test/clients/run.sh passes PGQ_DSN (where workers connect: the server or
// PgBouncer), PGQ_ADMIN_DSN (a superuser straight to the server), PGQ_PASS
// (direct or pgbouncer), PGQ_DATA and PGQ_BIN (to restart the server).
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before } from 'node:test';
import pg from 'pg';

for (const v of ['PGQ_DSN', 'PGQ_ADMIN_DSN', 'PGQ_PASS']) {
  if (!process.env[v]) throw new Error(`run these tests with test/clients/run.sh (${v} is not set)`);
}

// A libpq "key=value ..." string as node-postgres's config object.
export function pgConfig(dsn) {
  const map = { dbname: 'database', host: 'host', port: 'port', user: 'user', password: 'password' };
  const config = {};
  for (const pair of dsn.trim().split(/\s+/)) {
    const [k, v] = pair.split('=');
    if (!(k in map)) throw new Error(`unexpected key in ${dsn}: ${k}`);
    config[map[k]] = k === 'port' ? Number(v) : v;
  }
  return config;
}

export const PASS = process.env.PGQ_PASS;
export const config = pgConfig(process.env.PGQ_DSN);
export const adminConfig = pgConfig(process.env.PGQ_ADMIN_DSN);
export const HERE = path.dirname(new URL(import.meta.url).pathname);

export async function connect(cfg = config) {
  const client = new pg.Client(cfg);
  client.on('error', () => {});
  await client.connect();
  return client;
}

export const queueName = () => `n_${crypto.randomBytes(6).toString('hex')}`;
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls a test's check until it is true (this is the test, not a worker).
export async function waitUntil(cond, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(50);
  }
}

// {id, state, tries, last_error, lock_key} of every unfinished job of queue.
export async function jobRows(admin, queue) {
  const { rows } = await admin.query(
    `SELECT q.id, q.state::text AS state, q.tries, q.last_error, w.lock_key
       FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)
      WHERE q.queue = $1 ORDER BY q.id`, [queue]);
  return rows;
}

// How many statements calling pgq_claim the sessions of application_name run now.
export async function activeClaims(admin, applicationName) {
  const { rows } = await admin.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1"
    + " AND state = 'active' AND query LIKE '%pgq_claim(%'", [applicationName]);
  return rows[0].n;
}

export async function counter(admin, name) {
  const { rows } = await admin.query('SELECT * FROM pgq_counters()');
  return Number(rows[0][name]);
}

export function restartServer() {
  execFileSync(path.join(process.env.PGQ_BIN, 'pg_ctl'), ['-D', process.env.PGQ_DATA, '-m', 'fast', '-w',
    '-t', '60', 'restart', '-l', path.join(path.dirname(process.env.PGQ_DATA), 'server.log')],
  { stdio: 'ignore' });
}

// A worker process (worker_proc.mjs) on queue; its handler notes lines in log.
export function startProc(queue, log, args) {
  const err = fs.openSync(`${log}.stderr`, 'w');
  return spawn(process.execPath, [path.join(HERE, 'worker_proc.mjs'), process.env.PGQ_DSN, queue, log, ...args],
    { stdio: ['ignore', 'ignore', err] });
}

export function logLines(log, word) {
  if (!fs.existsSync(log)) return [];
  return fs.readFileSync(log, 'utf8').split('\n').map((l) => l.split(' ')).filter((w) => w[0] === word).map((w) => w.slice(1));
}

export const exited = (proc) => new Promise((resolve) => {
  if (proc.exitCode !== null || proc.signalCode !== null) resolve(proc.exitCode ?? proc.signalCode);
  else proc.on('exit', (code, sig) => resolve(code ?? sig));
});

// A logger that keeps what it is told (and still prints warnings and errors).
export function keepingLogger() {
  const lines = [];
  const keep = (level) => (msg) => {
    lines.push(`${level} ${msg}`);
    if (level !== 'debug' && level !== 'info') process.stderr.write(`${level} ${msg}\n`);
  };
  return { lines, debug: keep('debug'), info: keep('info'), warn: keep('warn'), error: keep('error') };
}

// Calls fn(text, values, result) after each statement of the clients made
// while it is on; returns the function that turns it off.
export function watchQueries(fn) {
  const { query } = pg.Client.prototype;
  pg.Client.prototype.query = function watched(text, values, ...rest) {
    const p = query.call(this, text, values, ...rest);
    if (typeof text === 'string' && p && typeof p.then === 'function') {
      p.then((res) => fn(text, values, res), (err) => fn(text, values, null, err));
    }
    return p;
  };
  return () => { pg.Client.prototype.query = query; };
}

// Whether this server's pgq_push and pgq_push_batch take arg by name
// (max_tries, after: pgqueue 1.2).
export async function pushTakes(admin, arg) {
  const { rows: [r] } = await admin.query('SELECT count(*) = 2 AS ok FROM pg_catalog.pg_proc'
    + " WHERE proname IN ('pgq_push', 'pgq_push_batch') AND $1 = ANY (proargnames)", [arg]);
  return r.ok;
}

// fn(client) on a database of its own with pgqueue version installed
// (superuser, straight to the server: PgBouncer serves pgq_test only),
// dropped afterwards.
export async function atVersion(admin, version, fn) {
  const database = `pgq_old_${crypto.randomBytes(4).toString('hex')}`;
  await admin.query(`CREATE DATABASE ${database}`);
  let old;
  try {
    old = await connect({ ...adminConfig, database });
    await old.query(`CREATE EXTENSION pgqueue VERSION '${version}'`);
    return await fn(old);
  } finally {
    await old?.end();
    await admin.query(`DROP DATABASE ${database}`);
  }
}

// assert.rejects' check of the NeedsNewerExtension of what on pgqueue have.
export const needs12 = (NeedsNewerExtension, what, have) => (err) => err instanceof NeedsNewerExtension
  && err.message.includes(`${what} needs pgqueue 1.2`) && err.message.includes(`this database has pgqueue ${have}`)
  && err.message.includes('ALTER EXTENSION pgqueue UPDATE') && err.cause?.code === '42883';

// A logger that says nothing but errors.
export const quiet = { debug() {}, info() {}, warn() {}, error: (m) => process.stderr.write(`${m}\n`) };

// Clients connected before the tests of the file that calls this (at its
// top level) and ended after them: {name: config} -> {name: client}.
export function sharedClients(configs) {
  const clients = {};
  before(async () => {
    for (const [name, cfg] of Object.entries(configs)) clients[name] = await connect(cfg);
  });
  after(async () => {
    for (const client of Object.values(clients)) await client.end();
  });
  return clients;
}
