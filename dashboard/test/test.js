'use strict';
/*
 * Browser tests of the dashboard (run by run.sh, which starts the server):
 * headless Chromium through playwright-core against a real PostgreSQL with
 * pgqueue.  Each test prints "ok N - name" or "not ok N - name" and the
 * error; the last line is "N passed, N failed".
 *
 * The database is seeded through the pgqueue API only, with the scheduler
 * off (pgqueue.enabled = off): every count the pages must show is known.
 */
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const http = require('node:http');
const pg = require('pg');
const { chromium } = require('playwright-core');
const Q = require('../lib/queries');

const DASH = path.join(__dirname, '..');
const PGHOST = process.env.PGHOST;
const PGPORT = process.env.PGPORT;
const PORT = Number(process.env.DASHBOARD_PORT || 5911);
const BIG = Number(process.env.DASHBOARD_BIG_JOBS || 1000000);
const TMP = process.env.DASHBOARD_TEST_TMP || '/tmp';
const XSS_QUEUE = 'xss<i>&"\'q';
const XSS_PAYLOAD = { html: '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">' };
const XSS_ERROR = '<b>bold</b><script>window.__pwned = 3</script>';
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
	'--disable-background-networking', '--disable-component-update', '--disable-sync'];

const dbUrl = (role) => `postgresql://${role}@/dash?host=${encodeURIComponent(PGHOST)}&port=${PGPORT}`;

let db;			// superuser connection: seeding and checks
let browser;
const servers = [];	// dashboards started, stopped at the end
const seeded = {};	// ids of the seeded jobs, by role in the tests

/* ------------------------------------------------------------------ helpers */

async function sql(text, params) {
	return (await db.query(text, params)).rows;
}

async function one(text, params) {
	const rows = await sql(text, params);
	return rows[0];
}

/* Starts a dashboard on port with args; resolves once it listens. */
function startDashboard(port, args, env) {
	return new Promise((resolve, reject) => {
		const child = spawn(process.execPath, [path.join(DASH, 'server.js'), '--port', String(port), ...args], {
			env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'],
		});
		servers.push(child);
		let out = '';
		const onData = (d) => {
			out += d;
			if (/dashboard on http/.test(out)) resolve({ child, base: `http://127.0.0.1:${port}` });
		};
		child.stdout.on('data', onData);
		child.stderr.on('data', (d) => { out += d; process.stderr.write(`[dashboard ${port}] ${d}`); });
		child.on('exit', (code) => reject(new Error(`dashboard exited (${code}): ${out}`)));
		setTimeout(() => reject(new Error(`dashboard did not start: ${out}`)), 10000);
	});
}

/* A raw HTTP request (no browser), for what a browser would not send. */
function request(base, method, p, { headers = {}, body } = {}) {
	return new Promise((resolve, reject) => {
		const u = new URL(p, base);
		const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, method, headers }, (res) => {
			let data = '';
			res.on('data', (d) => { data += d; });
			res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
		});
		req.on('error', reject);
		if (body) req.write(body);
		req.end();
	});
}

async function newPage(opts) {
	const context = await browser.newContext(opts || {});
	const page = await context.newPage();
	const errors = [];
	page.on('pageerror', (e) => errors.push(e.message));
	page.errors = errors;
	return page;
}

async function cellText(page, queue, col) {
	return (await page.locator(`tr[data-queue="${cssString(queue)}"] td[data-col="${col}"]`).textContent()).trim();
}

function cssString(s) {
	return s.replace(/\\/g, '\\\\').replace(/"/g, '\\"');
}

/* Page load time (ms, navigation start to load event end) of url. */
async function loadTime(page, url) {
	await page.goto(url, { waitUntil: 'load' });
	return page.evaluate(() => {
		const n = performance.getEntriesByType('navigation')[0];
		return { load: n.loadEventEnd, response: n.responseEnd };
	});
}

function median(xs) {
	const s = [...xs].sort((a, b) => a - b);
	return s[Math.floor(s.length / 2)];
}

async function waitFor(fn, what, ms = 10000) {
	const until = Date.now() + ms;
	let last;
	while (Date.now() < until) {
		try {
			last = await fn();
			if (last) return last;
		} catch (e) {
			last = e;
		}
		await new Promise((r) => setTimeout(r, 100));
	}
	throw new Error(`timed out waiting for ${what} (last: ${last})`);
}

/* ------------------------------------------------------------------ seed */

/*
 * reports: 6 jobs scheduled; 2 held by w1 (running), 1 nacked to retry in
 *   an hour, 1 held by w3 whose lease ran out (scheduled), 2 never claimed
 *   (scheduled).
 * dead (max_tries 1): 3 jobs claimed and nacked: failed, with their errors;
 *   one carries the HTML payload and error.
 * emails: 7 pending.  paged: 10,000 pending.  quiet: no jobs, weight 3,
 * cap 7, paused.  XSS_QUEUE: 1 pending job with the HTML payload.
 */
async function seed() {
	await sql(`CREATE EXTENSION pgqueue`);
	// the roles docs/operations.md documents (Dashboard, "Roles")
	await sql(`CREATE ROLE dash_admin LOGIN IN ROLE pgqueue_admin`);
	await sql(`CREATE ROLE dash_ro LOGIN`);
	await sql(`GRANT USAGE ON SCHEMA pgqueue TO dash_ro`);
	await sql(`GRANT SELECT ON ALL TABLES IN SCHEMA pgqueue TO dash_ro`);
	await sql(`GRANT EXECUTE ON FUNCTION pgq_counters() TO dash_ro`);

	await sql(`SELECT pgq_configure('dead', max_tries => 1)`);
	for (let i = 0; i < 6; i++) await sql(`SELECT pgq_push('reports', $1)`, [{ report: i }]);
	await sql(`SELECT pgq_push('dead', $1)`, [{ n: 1 }]);
	await sql(`SELECT pgq_push('dead', $1)`, [XSS_PAYLOAD]);
	await sql(`SELECT pgq_push('dead', $1)`, [{ n: 3 }]);
	assert.equal((await one(`SELECT pgq_schedule(100) AS n`)).n, 9);
	seeded.running = (await sql(`SELECT id FROM pgq_claim('w1', 2, '1 hour', ARRAY['reports'])`)).map((r) => r.id);
	const r = await one(`SELECT id FROM pgq_claim('w2', 1, '1 hour', ARRAY['reports'])`);
	assert.equal((await one(`SELECT pgq_nack($1, 'w2', 'try again later', '1 hour') AS s`, [r.id])).s, 'retry');
	seeded.retry = r.id;
	seeded.expired = (await one(`SELECT id FROM pgq_claim('w3', 1, '1 millisecond', ARRAY['reports'])`)).id;
	const dead = await sql(`SELECT id, payload FROM pgq_claim('w4', 3, '1 hour', ARRAY['dead'])`);
	assert.equal(dead.length, 3);
	for (const d of dead) {
		const xss = d.payload.html !== undefined;
		const s = await one(`SELECT pgq_nack($1, 'w4', $2) AS s`, [d.id, xss ? XSS_ERROR : `error of job ${d.payload.n}`]);
		assert.equal(s.s, 'failed');
		if (xss) seeded.xssFailed = d.id;
		else (seeded.failed = seeded.failed || []).push(d.id);
	}
	for (let i = 0; i < 7; i++) await sql(`SELECT pgq_push('emails', $1)`, [{ to: `user${i}@example.com` }]);
	seeded.xss = (await one(`SELECT pgq_push($1, $2) AS id`, [XSS_QUEUE, XSS_PAYLOAD])).id;
	await sql(`SELECT count(*) FROM generate_series(0, 9) b,
	           LATERAL pgq_push_batch('paged', (SELECT array_agg(jsonb_build_object('n', g))
	                                             FROM generate_series(b * 1000 + 1, b * 1000 + 1000) g))`);
	await sql(`SELECT pgq_configure('quiet', weight => 3, max_in_flight => 7, paused => true)`);
	await sql(`ANALYZE`);
}

/* ------------------------------------------------------------------ tests */

/*
 * needs: what of pgqueue 1.1's operator API a test uses ('operate':
 * pgq_retry, pgq_retry_failed, pgq_cancel, pgq_purge; 'archive': the
 * archive and retention; 'failedIndex': the index on failed jobs,
 * queue_failed_idx or a slot's queue_<n>_failed_idx).  A database
 * without it skips the test, saying so.
 */
const tests = [];
function test(name, needs, fn) {
	if (typeof needs === 'function') tests.push({ name, needs: [], fn: needs });
	else tests.push({ name, needs, fn });
}
const has = {};
const NEEDS = {
	operate: 'pgq_retry, pgq_retry_failed, pgq_cancel, pgq_purge', archive: 'pgqueue.archive',
	failedIndex: 'index on failed jobs (queue_failed_idx)',
	rateLimit: 'rate limits (pgqueue 1.2)',
	flows: 'flows (pgqueue 1.2: pgqueue.job_parents)',
	groups: 'groups (pgqueue 1.2)',
};

let admin;	// the dashboard with actions, as dash_admin
let ro;		// --read-only, as dash_ro, with basic auth

test('the overview shows the seeded counts, the same as pgq_stats()', async () => {
	const page = await newPage();
	await page.goto(`${admin.base}/`);
	const want = {
		reports: { pending: '0', retry: '1', scheduled: '3', running: '2', failed: '0' },
		dead: { pending: '0', retry: '0', scheduled: '0', running: '0', failed: '3' },
		emails: { pending: '7', retry: '0', scheduled: '0', running: '0', failed: '0' },
		paged: { pending: '10,000', retry: '0', scheduled: '0', running: '0', failed: '0' },
		[XSS_QUEUE]: { pending: '1', retry: '0', scheduled: '0', running: '0', failed: '0' },
		quiet: { pending: '0', retry: '0', scheduled: '0', running: '0', failed: '0' },
	};
	for (const [queue, cols] of Object.entries(want))
		for (const [col, n] of Object.entries(cols))
			assert.equal(await cellText(page, queue, col), n, `${queue} ${col}`);
	// and the extension's own counts agree, queue by queue
	const stats = await sql(`SELECT * FROM pgq_stats()`);
	assert.equal(await page.locator('tr[data-queue]').count(), stats.length);
	for (const s of stats) {
		const f = (n) => Number(n).toLocaleString('en-US');
		assert.equal(await cellText(page, s.queue, 'pending'), f(s.pending), `${s.queue} pending`);
		assert.equal(await cellText(page, s.queue, 'retry'), f(s.retry), `${s.queue} retry`);
		assert.equal(await cellText(page, s.queue, 'scheduled'), f(s.scheduled), `${s.queue} scheduled`);
		assert.equal(await cellText(page, s.queue, 'running'), f(s.in_flight), `${s.queue} running`);
		assert.equal(await cellText(page, s.queue, 'failed'), f(s.failed), `${s.queue} failed`);
	}
	assert.equal(await cellText(page, 'quiet', 'paused'), 'paused');
	assert.equal(await cellText(page, 'quiet', 'weight'), '3');
	assert.equal(await cellText(page, 'quiet', 'cap'), '7');
	assert.equal(await cellText(page, 'emails', 'paused'), 'no');
	assert.equal(await cellText(page, 'emails', 'cap'), 'none');
	// the oldest ready job of emails was pushed a moment ago; reports has one
	// whose lease ran out (due since the seed); quiet has none
	assert.match(await cellText(page, 'emails', 'oldest'), /^(\d+ ms|\d+s|\d+m \d+s)$/);
	assert.notEqual(await cellText(page, 'reports', 'oldest'), '');
	assert.equal(await cellText(page, 'quiet', 'oldest'), '');
	assert.deepEqual(page.errors, []);
	await page.context().close();
});

test('the overview refreshes itself without a reload, with jobs/s from pgq_counters()', async () => {
	const page = await newPage();
	await page.goto(`${admin.base}/`);
	await page.evaluate(() => { window.__sameDocument = true; });
	assert.equal(await cellText(page, 'emails', 'pending'), '7');
	await sql(`SELECT count(*) FROM pgq_push_batch('emails', ARRAY['{}', '{}', '{}', '{}']::jsonb[])`);
	await waitFor(async () => (await cellText(page, 'emails', 'pending')) === '11', 'emails pending 11');
	assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page was reloaded');
	// a rate is a difference of two samples: push between two refreshes
	await new Promise((r) => setTimeout(r, 1200));
	await sql(`SELECT count(*) FROM pgq_push_batch('emails', ARRAY['{}', '{}', '{}']::jsonb[])`);
	await waitFor(async () => {
		const t = (await page.locator('[data-rate="pushed"]').textContent()).trim();
		return /^\d+\.\d\/s$/.test(t) && parseFloat(t) > 0;
	}, 'a pushed rate above 0');
	await page.context().close();
});

test('paging through the 10,000 jobs of a queue shows each once, in the scheduler order', async () => {
	const page = await newPage();
	const seen = [];
	let url = `${admin.base}/queues/paged?list=pending&limit=500`;
	let pages = 0;
	for (;;) {
		await page.goto(url);
		const ids = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id));
		seen.push(...ids);
		pages++;
		const next = page.locator('#next-page');
		if (await next.count() === 0) break;
		url = new URL(await next.getAttribute('href'), admin.base).href;
		assert.ok(pages <= 21, 'too many pages');
	}
	assert.equal(seen.length, 10000);
	assert.equal(new Set(seen).size, 10000, 'a job was shown twice');
	const want = (await sql(`SELECT id FROM pgqueue.queue WHERE queue = 'paged'
	                          ORDER BY -(priority::bigint), run_after, id`)).map((r) => r.id);
	assert.deepEqual(seen, want);
	// the default page size: 50, and the next page starts where it ended
	await page.goto(`${admin.base}/queues/paged`);
	const first = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id));
	assert.deepEqual(first, want.slice(0, 50));
	await page.click('#next-page');
	const second = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id));
	assert.deepEqual(second, want.slice(50, 100));
	await page.context().close();
});

test('every list of a queue pages through its state, across segments and filtered walks', async () => {
	const page = await newPage();
	const walk = async (queue, list) => {
		const seen = [];
		let url = `${admin.base}/queues/${encodeURIComponent(queue)}?list=${list}&limit=1`;
		for (let i = 0; i < 20; i++) {
			await page.goto(url);
			seen.push(...await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id)));
			const next = page.locator('#next-page');
			if (await next.count() === 0) return seen;
			url = new URL(await next.getAttribute('href'), admin.base).href;
		}
		throw new Error('no end');
	};
	const inView = async (queue, state) => (await sql(`SELECT id FROM pgqueue.jobs WHERE queue = $1 AND state = $2`,
		[queue, state])).map((r) => r.id).sort();
	for (const [queue, list] of [['reports', 'scheduled'], ['reports', 'running'], ['reports', 'retry'],
		['reports', 'pending'], ['dead', 'failed'], ['emails', 'retry']]) {
		const seen = await walk(queue, list);
		assert.deepEqual([...seen].sort(), await inView(queue, list), `${queue} ${list}`);
	}
	// the expired lease comes first among the scheduled jobs
	assert.equal((await walk('reports', 'scheduled'))[0], seeded.expired);
	await page.context().close();
});

test('a job page shows its payload, tries, last error, lease holder and deadline', async () => {
	const page = await newPage();
	const id = seeded.running[0];
	await page.goto(`${admin.base}/jobs/${id}`);
	const j = await one(`SELECT state, tries, max_tries, lock_key, lock_timeout::text AS lt, jsonb_pretty(payload) AS p
	                       FROM pgqueue.jobs WHERE id = $1`, [id]);
	assert.equal(j.state, 'running');
	assert.equal(await page.locator('#job-state').textContent(), 'running');
	assert.equal(await page.locator('#lease-holder').textContent(), 'w1');
	// the deadline is shown as the database has it (UTC, microseconds)
	await sql(`SET TimeZone = 'UTC'`);
	const lt = (await one(`SELECT lock_timeout::text AS lt FROM pgqueue.jobs WHERE id = $1`, [id])).lt;
	assert.equal(await page.locator('#lease-deadline').textContent(), lt);
	assert.equal(await page.locator('#payload').textContent(), j.p);
	assert.match(await page.locator('#job').textContent(), new RegExp(`tries\\s*${j.tries} of ${j.max_tries}`));
	await page.goto(`${admin.base}/jobs/${seeded.failed[0]}`);
	assert.equal(await page.locator('#job-state').textContent(), 'failed');
	assert.equal(await page.locator('#last-error').textContent(), 'error of job 1');
	// a job that does not exist, and an id that is not one
	assert.equal((await page.goto(`${admin.base}/jobs/00000000-0000-0000-0000-000000000000`)).status(), 404);
	assert.equal((await page.goto(`${admin.base}/jobs/nonsense`)).status(), 400);
	await page.context().close();
});

test('a payload and an error with HTML and script show as text and run nothing', async () => {
	const page = await newPage();
	const resp = await page.goto(`${admin.base}/jobs/${seeded.xssFailed}`);
	assert.match(resp.headers()['content-security-policy'], /script-src 'self'/);
	assert.match(resp.headers()['content-security-policy'], /default-src 'none'/);
	assert.match(await page.locator('#payload').textContent(), /<script>window.__pwned = 1<\/script><img src=x/);
	assert.equal(await page.locator('#last-error').textContent(), XSS_ERROR);
	assert.equal(await page.locator('#payload img, #payload script, #last-error b, #last-error script').count(), 0);
	await page.goto(`${admin.base}/queues/dead?list=failed`);
	assert.equal(await page.locator('#jobs img, #jobs script, #jobs b').count(), 0);
	assert.match(await page.locator('#jobs').textContent(), /<b>bold<\/b>/);
	// the queue whose name is markup: in the overview, on its page, in its link
	await page.goto(`${admin.base}/`);
	assert.equal(await page.locator('tr[data-queue] td.name i').count(), 0);
	await page.locator(`tr[data-queue="${cssString(XSS_QUEUE)}"] td.name a`).click();
	assert.equal(await page.locator('#queue-name').textContent(), XSS_QUEUE);
	await page.click(`#jobs tbody tr[data-id="${seeded.xss}"] a`);
	assert.match(await page.locator('#payload').textContent(), /onerror/);
	await new Promise((r) => setTimeout(r, 300));
	assert.equal(await page.evaluate(() => window.__pwned), undefined);
	assert.deepEqual(page.errors, []);
	await page.context().close();
});

test('retrying a failed job from its page makes it pending (after a confirmation)', ['operate'], async () => {
	const page = await newPage();
	const id = seeded.failed[0];
	await page.goto(`${admin.base}/jobs/${id}`);
	// declined: nothing happens
	page.once('dialog', (d) => d.dismiss());
	await page.click('#job-actions button[data-action="retry"]');
	await new Promise((r) => setTimeout(r, 300));
	assert.equal((await one(`SELECT state FROM pgqueue.jobs WHERE id = $1`, [id])).state, 'failed');
	let asked = '';
	page.once('dialog', (d) => { asked = d.message(); d.accept(); });
	await Promise.all([page.waitForNavigation(), page.click('#job-actions button[data-action="retry"]')]);
	assert.match(asked, /^Retry job /);
	const j = await one(`SELECT state, tries, last_error FROM pgqueue.jobs WHERE id = $1`, [id]);
	assert.equal(j.state, 'pending');
	assert.equal(j.tries, 0);
	assert.equal(j.last_error, 'error of job 1');
	assert.match(await page.locator('#flash').textContent(), /is pending again/);
	assert.equal(await page.locator('#job-state').textContent(), 'pending');
	await page.context().close();
});

test('cancelling a job from its page removes it; its holder can no longer ack it', ['operate'], async () => {
	const page = await newPage();
	page.on('dialog', (d) => d.accept());
	const id = seeded.running[1];
	await page.goto(`${admin.base}/jobs/${id}`);
	await Promise.all([page.waitForNavigation(), page.click('#job-actions button[data-action="cancel"]')]);
	assert.equal((await sql(`SELECT 1 FROM pgqueue.jobs WHERE id = $1`, [id])).length, 0);
	assert.equal((await one(`SELECT pgq_ack($1, 'w1') AS ok`, [id])).ok, false);
	assert.match(await page.locator('#flash').textContent(), /was cancelled/);
	await page.context().close();
});

test('pausing, resuming and the settings of a queue go through pgq_configure', async () => {
	const page = await newPage();
	page.on('dialog', (d) => d.accept());
	await page.goto(`${admin.base}/queues/emails`);
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="pause"]')]);
	assert.equal((await one(`SELECT paused FROM pgqueue.queues WHERE queue = 'emails'`)).paused, true);
	assert.equal(await page.locator('[data-setting="paused"]').textContent(), 'yes');
	await page.goto(`${admin.base}/`);
	assert.equal(await cellText(page, 'emails', 'paused'), 'paused');
	await page.goto(`${admin.base}/queues/emails`);
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="resume"]')]);
	assert.equal((await one(`SELECT paused FROM pgqueue.queues WHERE queue = 'emails'`)).paused, false);

	await page.fill('input[name="weight"]', '4');
	await page.fill('input[name="max_in_flight"]', '9');
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="settings"]')]);
	const s = await one(`SELECT weight, max_in_flight FROM pgqueue.queues WHERE queue = 'emails'`);
	assert.deepEqual([s.weight, s.max_in_flight], [4, 9]);
	// a weight the extension refuses: its error, nothing changed
	await page.fill('input[name="weight"]', '0');
	await page.evaluate(() => document.querySelector('input[name="weight"]').removeAttribute('min'));
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="settings"]')]);
	assert.match(await page.locator('#flash').textContent(), /weight must be between 1 and 10000 \(22023\)/);
	assert.equal((await one(`SELECT weight FROM pgqueue.queues WHERE queue = 'emails'`)).weight, 4);
	await page.context().close();
});

test('retry all failed and purge a state, each through the pgqueue API', ['operate'], async () => {
	const page = await newPage();
	page.on('dialog', (d) => d.accept());
	await page.goto(`${admin.base}/queues/dead?list=failed`);
	const failed = Number((await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'dead' AND state = 'failed'`)).n);
	assert.equal(failed, 2);
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="retry_failed"]')]);
	assert.match(await page.locator('#flash').textContent(), /^2 failed job\(s\) of queue dead are pending again/);
	assert.equal(Number((await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'dead' AND state = 'failed'`)).n), 0);
	assert.equal(Number((await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'dead' AND state = 'pending'`)).n), 3);
	await page.selectOption('#queue-actions select[name="state"]', 'pending');
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="purge"]')]);
	assert.match(await page.locator('#flash').textContent(), /^3 pending job\(s\) of queue dead were purged/);
	assert.equal(Number((await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'dead'`)).n), 0);
	await page.context().close();
});

test('a queue with a retention shows its archive', ['operate', 'archive'], async () => {
	await sql(`SELECT pgq_configure('kept', retention => '7 days')`);
	const id = (await one(`SELECT pgq_push('kept', '{"keep": "<me>"}') AS id`)).id;
	const gone = (await one(`SELECT pgq_push('kept', '{"cancel": true}') AS id`)).id;
	await sql(`SELECT pgq_schedule(100)`);
	const c = await one(`SELECT id FROM pgq_claim('w5', 1, '1 hour', ARRAY['kept'])`);
	assert.equal(c.id, id);
	await sql(`SELECT pgq_ack($1, 'w5')`, [id]);
	await sql(`SELECT pgq_cancel($1)`, [gone]);
	const page = await newPage();
	await page.goto(`${admin.base}/queues/kept?list=archive`);
	const rows = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => [t.dataset.id, t.children[1].textContent]));
	assert.deepEqual(rows.sort(), [[id, 'acked'], [gone, 'cancelled']].sort());
	await page.click(`#jobs tbody tr[data-id="${id}"] a`);
	assert.match(await page.locator('#job-state').textContent(), /archived/);
	assert.match(await page.locator('#payload').textContent(), /"keep": "<me>"/);
	assert.equal(await page.locator('#job-actions').count(), 0);
	await page.context().close();
});

test('a queue\'s page shows its rate limit, or none', ['rateLimit'], async () => {
	await sql(`SELECT pgq_configure('paced', rate_limit => 10, rate_period => '2 seconds')`);
	await sql(`SELECT pgq_configure('unpaced', weight => 2)`);
	const page = await newPage();
	await page.goto(`${admin.base}/queues/paced`);
	assert.equal(await page.locator('[data-setting="rate"]').textContent(), '10 per 00:00:02');
	await page.goto(`${admin.base}/queues/unpaced`);
	assert.equal(await page.locator('[data-setting="rate"]').textContent(), 'none');
	await page.context().close();
});

test('a queue opens on a tab that has jobs; the archive\'s tab only for a queue that keeps one', ['operate', 'archive'], async () => {
	await sql(`SELECT pgq_configure('onlyfailed', max_tries => 1)`);
	for (let i = 0; i < 2; i++) await sql(`SELECT pgq_push('onlyfailed', $1)`, [{ n: i }]);
	await sql(`SELECT pgq_schedule(100)`);
	for (const c of await sql(`SELECT id FROM pgq_claim('w6', 2, '1 hour', ARRAY['onlyfailed'])`))
		assert.equal((await one(`SELECT pgq_nack($1, 'w6', 'boom') AS s`, [c.id])).s, 'failed');
	const page = await newPage();
	const current = async () => page.locator('a.tab.current').getAttribute('data-list');
	const tabs = async () => page.locator('a.tab').evaluateAll((as) => as.map((a) => a.dataset.list));
	await page.goto(`${admin.base}/queues/onlyfailed`);
	assert.equal(await current(), 'failed');
	assert.equal(await page.locator('#jobs tbody tr[data-id]').count(), 2);
	assert.deepEqual(await tabs(), ['pending', 'retry', 'scheduled', 'running', 'failed']);
	// asked for by address, the archive of a queue without one still shows
	// (rows kept before its retention was set to 0), with its note
	await page.goto(`${admin.base}/queues/onlyfailed?list=archive`);
	assert.equal(await current(), 'archive');
	// a queue with a retention and no unfinished job: its archive
	await page.goto(`${admin.base}/queues/kept`);
	assert.equal(await current(), 'archive');
	assert.deepEqual(await tabs(), ['pending', 'retry', 'scheduled', 'running', 'failed', 'archive']);
	// a queue with nothing at all: pending, as before
	await page.goto(`${admin.base}/queues/nothing-here`);
	assert.equal(await current(), 'pending');
	assert.deepEqual(page.errors, []);
	await page.context().close();
});

/*
 * A flow (1.2): a parent in flowa, 3 children after it in flowb, a merge
 * after the children in flowc (a queue whose only job waits: the overview
 * finds it through the walk of the waiting jobs).
 */
test('a flow: the waiting column and tab, a job\'s parents and children, each linked', ['flows'], async () => {
	const parent = (await one(`SELECT pgq_push('flowa', '{"step": "snapshot"}') AS id`)).id;
	const children = (await sql(`SELECT id FROM pgq_push_batch('flowb', ARRAY['{"shard": 1}', '{"shard": 2}', '{"shard": 3}']::jsonb[],
	                                                          after => ARRAY[$1::uuid]) id`, [parent])).map((r) => r.id);
	const merge = (await one(`SELECT pgq_push('flowc', '{"step": "merge"}', after => $1::uuid[]) AS id`, [children])).id;
	seeded.flow = { parent, children, merge };
	const page = await newPage();
	await page.goto(`${admin.base}/`);
	assert.equal(await cellText(page, 'flowa', 'waiting'), '0');
	assert.equal(await cellText(page, 'flowb', 'waiting'), '3');
	assert.equal(await cellText(page, 'flowc', 'waiting'), '1');
	// every queue of pgq_stats() (flowc too), with its waiting jobs
	const stats = await sql(`SELECT queue, waiting FROM pgq_stats()`);
	assert.equal(await page.locator('tr[data-queue]').count(), stats.length);
	for (const s of stats)
		assert.equal(await cellText(page, s.queue, 'waiting'), Number(s.waiting).toLocaleString('en-US'), `${s.queue} waiting`);

	// flowb has only waiting jobs: its page opens on them, with their parents counted
	const tabs = async () => page.locator('a.tab').evaluateAll((as) => as.map((a) => a.dataset.list));
	await page.goto(`${admin.base}/queues/flowb`);
	assert.equal(await page.locator('a.tab.current').getAttribute('data-list'), 'waiting');
	assert.equal((await page.locator('a.tab[data-list="waiting"] .count').textContent()).trim(), '3');
	const rows = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id));
	assert.deepEqual(rows, [...children].sort());
	assert.deepEqual(await page.locator('#jobs td[data-col="waiting-for"]').allTextContents(), ['1 parent', '1 parent', '1 parent']);
	// a page of one job at a time walks them all, in id order
	const seen = [];
	let next = `${admin.base}/queues/flowb?list=waiting&limit=1`;
	for (let i = 0; i < 10 && next; i++) {
		await page.goto(next);
		seen.push(...await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((t) => t.dataset.id)));
		const link = page.locator('#next-page');
		next = await link.count() ? new URL(await link.getAttribute('href'), admin.base).href : null;
	}
	assert.deepEqual(seen, [...children].sort());
	// a queue without waiting jobs has no such tab (unless asked for)
	await page.goto(`${admin.base}/queues/flowa`);
	assert.equal((await tabs()).includes('waiting'), false);
	await page.goto(`${admin.base}/queues/flowa?list=waiting`);
	assert.equal(await page.locator('a.tab.current').getAttribute('data-list'), 'waiting');
	assert.equal(await page.locator('#jobs tbody tr[data-id]').count(), 0);

	// the merge waits for the 3 children, each shown with its state and linked
	await page.goto(`${admin.base}/jobs/${merge}`);
	assert.equal(await page.locator('#job-state').textContent(), 'waiting');
	assert.equal(await page.locator('#waiting-for').textContent(), '3 parents');
	assert.deepEqual(await page.locator('#parents tbody tr').evaluateAll((trs) => trs.map((t) => t.dataset.id)), [...children].sort());
	assert.deepEqual(await page.locator('#parents td[data-col="state"]').allTextContents(), ['waiting', 'waiting', 'waiting']);
	assert.equal(await page.locator('#children').count(), 0);
	// to a child: it waits for the parent and is waited for by the merge
	await page.click(`#parents tr[data-id="${children[0]}"] td.id a`);
	assert.equal(await page.locator('#job-id').textContent(), children[0]);
	assert.deepEqual(await page.locator('#parents tbody tr').evaluateAll((trs) => trs.map((t) => t.dataset.id)), [parent]);
	assert.equal((await page.locator('#parents td[data-col="state"]').textContent()), 'pending');
	assert.deepEqual(await page.locator('#children tbody tr').evaluateAll((trs) => trs.map((t) => t.dataset.id)), [merge]);
	// to the parent: no parent of its own, its 3 children; cancelling it says what goes with it
	await page.click(`#parents tr[data-id="${parent}"] td.id a`);
	assert.equal(await page.locator('#parents').count(), 0);
	assert.equal(await page.locator('#waiting-for').count(), 0);
	assert.equal(await page.locator('#children tbody tr').count(), 3);
	assert.match(await page.locator('#job-actions form:has(button[data-action="cancel"])').getAttribute('data-confirm'),
		/the jobs waiting for it are cancelled/);
	// a job outside any flow shows none of it
	await page.goto(`${admin.base}/jobs/${seeded.xss}`);
	assert.equal(await page.locator('#parents, #children, #waiting-for').count(), 0);
	assert.deepEqual(page.errors, []);
	await page.context().close();
});

test('purging the waiting jobs of a queue goes through pgq_purge(queue, \'waiting\')', ['flows', 'operate'], async () => {
	const page = await newPage();
	page.on('dialog', (d) => d.accept());
	const merge = (await one(`SELECT pgq_push('flowd', '{}', after => $1::uuid[]) AS id`, [seeded.flow.children])).id;
	await page.goto(`${admin.base}/queues/flowd`);
	assert.deepEqual(await page.locator('#queue-actions select[name="state"] option').allTextContents(),
		['failed', 'retry', 'pending', 'waiting']);
	await page.selectOption('#queue-actions select[name="state"]', 'waiting');
	await Promise.all([page.waitForNavigation(), page.click('#queue-actions button[data-action="purge"]')]);
	assert.match(await page.locator('#flash').textContent(), /^1 waiting job\(s\) of queue flowd were purged/);
	assert.equal((await sql(`SELECT 1 FROM pgqueue.jobs WHERE id = $1`, [merge])).length, 0);
	// its parents are as they were
	assert.equal(Number((await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE id = ANY ($1::uuid[]) AND state = 'waiting'`,
		[seeded.flow.children])).n), 3);
	await page.context().close();
});

test('against pgqueue 1.1 (no flows) every page works, without a waiting column, tab or list', async () => {
	await sql(`CREATE DATABASE dash11`);
	let old;
	let dash;
	try {
		old = new pg.Client({ connectionString: dbUrl('postgres').replace('/dash?', '/dash11?') });
		await old.connect();
		await old.query(`CREATE EXTENSION pgqueue VERSION '1.1'`);
		await old.query(`SELECT pgq_configure('dead', max_tries => 1)`);
		const id = (await old.query(`SELECT pgq_push('dead', '{"n": 1}') AS id`)).rows[0].id;
		await old.query(`SELECT pgq_schedule(10)`);
		await old.query(`SELECT pgq_nack(id, 'w', 'boom') FROM pgq_claim('w', 1, '1 hour', ARRAY['dead'])`);
		await old.query(`SELECT pgq_push('live', '{}')`);
		dash = await startDashboard(PORT + 2, ['--database-url', dbUrl('postgres').replace('/dash?', '/dash11?')]);
		const page = await newPage();
		await page.goto(`${dash.base}/`);
		assert.match(await page.locator('header .who').textContent(), /pgqueue 1\.1/);
		assert.equal(await cellText(page, 'dead', 'failed'), '1');
		assert.equal(await cellText(page, 'live', 'pending'), '1');
		assert.equal(await page.locator('td[data-col="waiting"]').count(), 0);
		assert.equal((await page.locator('#queues thead').textContent()).includes('waiting'), false);
		await page.goto(`${dash.base}/queues/dead`);
		assert.equal(await page.locator('a.tab.current').getAttribute('data-list'), 'failed');
		assert.equal(await page.locator('a.tab[data-list="waiting"]').count(), 0);
		assert.deepEqual(await page.locator('#queue-actions select[name="state"] option').allTextContents(), ['failed', 'retry', 'pending']);
		assert.equal((await page.goto(`${dash.base}/queues/dead?list=waiting`)).status(), 400);
		assert.equal((await page.goto(`${dash.base}/jobs/${id}`)).status(), 200);
		assert.equal(await page.locator('#job-state').textContent(), 'failed');
		assert.equal(await page.locator('#parents, #children, #waiting-for').count(), 0);
		assert.deepEqual(page.errors, []);
		await page.context().close();
	} finally {
		if (dash) dash.child.kill();
		await old?.end();
		await sql(`DROP DATABASE dash11 WITH (FORCE)`);
	}
});

test('every POST needs the CSRF token of the browser that sends it, and a confirmation', async () => {
	const page = await newPage();
	await page.goto(`${admin.base}/queues/emails`);
	const token = await page.locator('#queue-actions input[name="csrf"]').first().inputValue();
	const cookies = await page.context().cookies();
	const cookie = cookies.map((c) => `${c.name}=${c.value}`).join('; ');
	const form = (f) => new URLSearchParams(f).toString();
	const post = (headers, body) => request(admin.base, 'POST', '/action', {
		headers: { 'Content-Type': 'application/x-www-form-urlencoded', ...headers }, body });
	const paused = async () => (await one(`SELECT coalesce((SELECT paused FROM pgqueue.queues WHERE queue = 'emails'), false) AS p`)).p;
	// no token, a wrong token, a token without its cookie, another origin
	assert.equal((await post({ Cookie: cookie }, form({ action: 'pause', queue: 'emails', confirmed: 'yes' }))).status, 403);
	assert.equal((await post({ Cookie: cookie }, form({ action: 'pause', queue: 'emails', confirmed: 'yes', csrf: 'ab'.repeat(32) }))).status, 403);
	assert.equal((await post({}, form({ action: 'pause', queue: 'emails', confirmed: 'yes', csrf: token }))).status, 403);
	assert.equal((await post({ Cookie: cookie, Origin: 'http://evil.example' }, form({ action: 'pause', queue: 'emails', confirmed: 'yes', csrf: token }))).status, 403);
	// a GET changes nothing
	assert.equal((await request(admin.base, 'GET', '/action?action=pause&queue=emails&confirmed=yes')).status, 404);
	assert.equal(await paused(), false);
	// the right token without a confirmation: a page that asks, nothing done
	const ask = await post({ Cookie: cookie }, form({ action: 'pause', queue: 'emails', csrf: token, back: '/queues/emails' }));
	assert.equal(ask.status, 200);
	assert.match(ask.body, /id="confirm-text">Pause queue emails\?</);
	assert.equal(await paused(), false);
	// ... and that page's button does it (a browser without JavaScript)
	const nojs = await browser.newContext({ javaScriptEnabled: false });
	const p2 = await nojs.newPage();
	await p2.goto(`${admin.base}/queues/emails`);
	await Promise.all([p2.waitForNavigation(), p2.click('#queue-actions button[data-action="pause"]')]);
	assert.equal(await p2.locator('#confirm-text').textContent(), 'Pause queue emails?');
	assert.equal(await paused(), false);
	await Promise.all([p2.waitForNavigation(), p2.click('#confirm')]);
	assert.equal(await paused(), true);
	await sql(`SELECT pgq_configure('emails', paused => false)`);
	await nojs.close();
	// the Host check: a name that only resolves to loopback is refused
	assert.equal((await request(admin.base, 'GET', '/', { headers: { Host: 'evil.example:80' } })).status, 421);
	await page.context().close();
});

test('read-only mode, as a read-only role: every page, no action, every POST refused', async () => {
	// without the password: 401
	assert.equal((await request(ro.base, 'GET', '/')).status, 401);
	const page = await newPage({ httpCredentials: { username: 'ops', password: 's3cret' } });
	await page.goto(`${ro.base}/`);
	assert.equal(await page.locator('#read-only').count(), 1);
	const running = (await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'reports' AND state = 'running'`)).n;
	assert.equal(await cellText(page, 'reports', 'running'), running);
	const paged = (await one(`SELECT count(*) AS n FROM pgqueue.jobs WHERE queue = 'paged' AND state = 'pending'`)).n;
	assert.equal(await cellText(page, 'paged', 'pending'), Number(paged).toLocaleString('en-US'));
	const victim = (await one(`SELECT id FROM pgqueue.jobs WHERE queue = 'emails' LIMIT 1`)).id;
	const pages = ['/', '/queues/emails', '/queues/reports?list=running', '/queues/dead?list=failed',
		`/jobs/${victim}`, `/jobs/${seeded.xss}`];
	if (has.archive) pages.push('/queues/kept?list=archive');
	if (seeded.flow) pages.push('/queues/flowb', `/jobs/${seeded.flow.parent}`, `/jobs/${seeded.flow.children[0]}`);
	for (const p of pages) {
		const resp = await page.goto(`${ro.base}${p}`);
		assert.equal(resp.status(), 200, p);
		assert.equal(await page.locator('form, button, [data-action]').count(), 0, `${p} has an action`);
	}
	const tokenless = await page.request.post(`${ro.base}/action`, {
		form: { action: 'cancel', id: victim, confirmed: 'yes' } });
	assert.equal(tokenless.status(), 403);
	// even with a token made for the admin dashboard's forms
	const a = await newPage();
	await a.goto(`${admin.base}/queues/emails`);
	const token = await a.locator('input[name="csrf"]').first().inputValue();
	const withToken = await page.request.post(`${ro.base}/action`, {
		form: { action: 'cancel', id: victim, confirmed: 'yes', csrf: token } });
	assert.equal(withToken.status(), 403);
	assert.match(await withToken.text(), /read-only/);
	assert.equal((await sql(`SELECT 1 FROM pgqueue.jobs WHERE id = $1`, [victim])).length, 1);
	await a.context().close();
	await page.context().close();
});

/*
 * A million jobs in one queue ("big", paused), 20 of them failed: the plans
 * of every statement, then the page loads (printed) and the screenshot.
 */
const big = {};

test(`with ${BIG.toLocaleString('en-US')} jobs in one queue, no statement of the pages scans a table`, async () => {
	await sql(`SELECT pgq_configure('big', paused => true)`);
	let t = Date.now();
	await sql(`SELECT count(*) FROM generate_series(0, $1::int - 1) b,
	           LATERAL pgq_push_batch('big', (SELECT array_agg(jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'))
	                                           FROM generate_series(b * 10000 + 1, b * 10000 + 10000) g))`, [BIG / 10000]);
	const loadMs = Date.now() - t;
	t = Date.now();
	await sql(`VACUUM ANALYZE pgqueue.queue`);
	await sql(`CHECKPOINT`);	// its writes, not the pages, should not be measured
	console.log(`#   ${BIG.toLocaleString('en-US')} jobs pushed in ${(loadMs / 1000).toFixed(1)} s (pgq_push_batch), VACUUM ANALYZE and CHECKPOINT ${((Date.now() - t) / 1000).toFixed(1)} s`);
	// a few of them failed, to have a failed list worth the name
	await sql(`SELECT pgq_configure('big', paused => false, max_tries => 1, weight => 10000)`);
	for (let failedJobs = 0; failedJobs < 20;) {
		await sql(`SELECT pgq_schedule(20)`);
		for (const j of await sql(`SELECT id FROM pgq_claim('w6', $1, '1 hour', ARRAY['big'])`, [20 - failedJobs])) {
			assert.equal((await one(`SELECT pgq_nack($1, 'w6', 'big failure') AS s`, [j.id])).s, 'failed');
			failedJobs++;
		}
	}
	await sql(`SELECT pgq_configure('big', paused => true, weight => 1)`);

	big.key = (await one(`SELECT (-(priority::bigint))::text AS a, run_after::text AS b, id::text AS c
	                        FROM pgqueue.queue WHERE queue = 'big' AND state IN ('pending', 'retry')
	                       ORDER BY -(priority::bigint), run_after, id OFFSET $1 LIMIT 1`, [Math.floor(BIG / 2)]));
	const key = big.key;
	const plans = [['overview', Q.OVERVIEW, [10001]], ['one queue', Q.QUEUE_ONE, [10001, 'big']]];
	for (const [list, segs] of Object.entries(Q.LISTS))
		(list !== 'archive' || has.archive) && (list !== 'waiting' || has.flows) && segs.forEach((seg, i) => {
			const p = seg.filter ? ['big', 51, 2000] : ['big', 51];
			plans.push([`${list}[${i}] first page`, Q.segmentSql(seg, false), p]);
			const k = list === 'pending' || list === 'retry' ? [key.a, key.b, key.c]
				: seg.key.map(([, type]) => ({ uuid: key.c, timestamptz: key.b, int: '0', bigint: '0' }[type]));
			plans.push([`${list}[${i}] deep page`, Q.segmentSql(seg, true), p.concat(k)]);
		});
	// the statements that read failed jobs need queue_failed_idx: the next test
	big.failedPlans = plans.filter(([, text]) => /state = 'failed'/.test(text));
	const scans = await explain(plans.filter(([, text]) => !/state = 'failed'/.test(text)));
	assert.deepEqual(scans, []);
	// the statements of flows (1.2): no scan, and no walk of the big
	// queue's primary key (a join along it instead of a probe per job; the
	// overview has one of its own, in the oldest ready job among the first
	// 100 in work_queue, so it is only checked for scans)
	if (has.flows) {
		const f = seeded.flow;
		assert.deepEqual(await explain([['overview with flows', Q.OVERVIEW_FLOWS, [10001]]]), []);
		const flowPlans = [['one queue with flows', Q.QUEUE_ONE_FLOWS, [10001, 'big']],
			['job with flows', Q.JOB_FLOWS, [f.children[0]]], ['parents', Q.PARENTS, [f.children[0]]],
			['children', Q.CHILDREN_OF, [f.parent, 101]],
			...plans.filter(([name]) => /^waiting/.test(name))];
		assert.deepEqual(await explain(flowPlans, 10001), []);
	}
});

/* EXPLAIN ANALYZE of each [name, sql, params] as the read-only role: the
 * plans that scan a table (or, given maxRows, walk a primary key further
 * than that: a join along it instead of a probe per row). */
async function explain(plans, maxRows) {
	const ro = new pg.Client({ connectionString: dbUrl('dash_ro') });
	await ro.connect();
	await ro.query("SET DateStyle = ISO; SET TimeZone = 'UTC'; SET enable_seqscan = off; SET enable_bitmapscan = off; SET jit = off");
	const scans = [];
	try {
		for (const [name, text, params] of plans) {
			const plan = (await ro.query(`EXPLAIN (ANALYZE, COSTS OFF) ${text}`, params)).rows.map((r) => r['QUERY PLAN']).join('\n');
			const ms = Number(/Execution Time: ([\d.]+)/.exec(plan)[1]);
			if (/Seq Scan on (queue|work_queue|archive|job_parents)/.test(plan))
				scans.push(`${name}: sequential scan\n${plan}`);
			for (const [line, rows, loops] of plan.matchAll(/Scan using \w+_pkey on .* rows=(\d+) loops=(\d+)\)/g))
				if (maxRows !== undefined && Number(rows) * Number(loops) > maxRows)
					scans.push(`${name}: a primary key scan returned ${rows} rows ${loops} times: ${line.trim()}\n${plan}`);
			console.log(`#   ${name}: ${ms.toFixed(1)} ms`);
		}
	} finally {
		await ro.end();
	}
	return scans;
}

test(`with ${BIG.toLocaleString('en-US')} jobs in one queue, the statements that read failed jobs walk queue_failed_idx`, ['failedIndex'], async () => {
	assert.ok(big.failedPlans && big.failedPlans.length >= 3, 'the test before did not run');
	assert.deepEqual(await explain(big.failedPlans), []);
});

test(`page loads with ${BIG.toLocaleString('en-US')} jobs in one queue (printed, not asserted), and the screenshot`, async () => {
	assert.ok(big.key, 'the jobs were not loaded');
	const key = big.key;
	const page = await newPage({ viewport: { width: 1280, height: 720 } });
	const pageKey = Buffer.from(JSON.stringify({ seg: 0, key: [key.a, key.b, key.c] })).toString('base64url');
	const urls = {
		overview: '/',
		'queue, first page': '/queues/big',
		'queue, page in the middle': `/queues/big?list=pending&after=${pageKey}`,
		'queue, failed': '/queues/big?list=failed',
		'queue, retry (none among them)': '/queues/big?list=retry',
		job: `/jobs/${key.c}`,
	};
	const figures = [];
	for (const [name, u] of Object.entries(urls)) {
		await loadTime(page, `${admin.base}${u}`);	// warm
		const runs = [];
		for (let i = 0; i < 5; i++) runs.push(await loadTime(page, `${admin.base}${u}`));
		const load = median(runs.map((r) => r.load));
		const resp = median(runs.map((r) => r.response));
		figures.push(`${name} ${load.toFixed(0)} ms`);
		console.log(`#   page load at ${BIG.toLocaleString('en-US')} jobs, ${name}: ${load.toFixed(0)} ms (median of 5; response ${resp.toFixed(0)} ms)`);
	}
	console.log(`#   PAGE LOAD (${BIG.toLocaleString('en-US')} jobs): ${figures.join(', ')}`);
	await page.goto(`${admin.base}/`);
	assert.equal(await cellText(page, 'big', 'pending'), BIG - 20 > 10000 ? '10,000+' : (BIG - 20).toLocaleString('en-US'));
	assert.equal(await cellText(page, 'big', 'failed'), '20');
	await page.goto(`${admin.base}/queues/big?list=pending&after=${pageKey}`);
	const ids = await page.locator('#jobs tbody tr[data-id]').evaluateAll((trs) => trs.map((r) => r.dataset.id));
	assert.equal(ids.length, 50);
	const want = (await sql(`SELECT id FROM pgqueue.queue WHERE queue = 'big' AND state = 'pending'
	                           AND (-(priority::bigint), run_after, id) > ($1::bigint, $2::timestamptz, $3::uuid)
	                         ORDER BY -(priority::bigint), run_after, id LIMIT 50`, [key.a, key.b, key.c])).map((r) => r.id);
	assert.deepEqual(ids, want);

	// the screenshot of the Dashboard section of docs/operations.md, with some work going on
	// (jobs/s): reports gets jobs pushed, claimed and acked for 3 seconds
	await page.goto(`${admin.base}/`);
	for (let until = Date.now() + 3000; Date.now() < until;) {
		await sql(`SELECT count(*) FROM pgq_push_batch('reports', array_fill('{}'::jsonb, ARRAY[40]))`);
		await sql(`SELECT pgq_schedule(100)`);
		await sql(`SELECT pgq_ack_batch(array_agg(id), 'w7') FROM pgq_claim('w7', 30, '1 hour', ARRAY['reports'])`);
		await new Promise((r) => setTimeout(r, 100));
	}
	await page.waitForTimeout(600);	// one more refresh
	const shot = path.join(TMP, 'screenshot.png');
	await page.screenshot({ path: shot, fullPage: true });
	if (process.env.DASHBOARD_SCREENSHOT) fs.copyFileSync(shot, process.env.DASHBOARD_SCREENSHOT);
	console.log(`#   screenshot: ${process.env.DASHBOARD_SCREENSHOT || shot}`);
	await page.context().close();
});

test('a queue\'s page shows its groups with their jobs in flight', ['groups'], async () => {
	await sql(`SELECT pgq_configure('grouped', group_max_in_flight => 1)`);
	await sql(`SELECT count(pgq_push('grouped', jsonb_build_object('n', n), group_key => 'g' || (n % 3)))
	             FROM generate_series(1, 9) n`);
	await sql(`SELECT pgq_schedule(1000)`);
	const page = await newPage();
	await page.goto(`${admin.base}/queues/grouped`);
	assert.equal(await page.locator('[data-setting="groups"]').textContent(), '1');
	assert.equal(await page.locator('#groups-count').textContent(), '3');
	for (const g of ['g0', 'g1', 'g2']) {
		assert.equal(await page.locator(`#groups tr[data-group="${g}"] [data-col="in_flight"]`).textContent(), '1');
		assert.equal(await page.locator(`#groups tr[data-group="${g}"] [data-col="pending"]`).textContent(), '2');
	}
	await page.goto(`${admin.base}/queues/unpaced`);
	assert.equal(await page.locator('#groups').count(), 0);
	await page.context().close();
});

/* ------------------------------------------------------------------ main */

(async () => {
	let passed = 0;
	let failed = 0;
	let skipped = 0;
	try {
		db = new pg.Client();
		await db.connect();
		await seed();
		const f = await one(`SELECT to_regprocedure('pgq_retry(uuid)') IS NOT NULL AS operate,
		                            to_regclass('pgqueue.archive') IS NOT NULL AS archive,
		                            EXISTS (SELECT 1 FROM pg_class
		                                     WHERE relnamespace = 'pgqueue'::regnamespace AND relkind = 'i'
		                                       AND relname ~ '^queue(_[0-9]+)?_failed_idx$') AS "failedIndex",
		                            EXISTS (SELECT 1 FROM pg_attribute
		                                     WHERE attrelid = 'pgqueue.queues'::regclass AND attname = 'rate_limit'
		                                       AND NOT attisdropped) AS "rateLimit",
		                            to_regclass('pgqueue.job_parents') IS NOT NULL AS flows,
		                            EXISTS (SELECT 1 FROM pg_attribute
		                                     WHERE attrelid = 'pgqueue.queues'::regclass
		                                       AND attname = 'group_max_in_flight'
		                                       AND NOT attisdropped) AS groups`);
		Object.assign(has, f);
		admin = await startDashboard(PORT, ['--database-url', dbUrl('dash_admin'), '--refresh', '0.5']);
		ro = await startDashboard(PORT + 1, ['--database-url', dbUrl('dash_ro'), '--read-only'],
			{ DASHBOARD_BASIC_AUTH: 'ops:s3cret' });
		browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: CHROMIUM_ARGS });
	} catch (e) {
		console.log(`not ok 0 - setup\n${e.stack}`);
		failed++;
	}
	if (failed === 0) {
		for (let i = 0; i < tests.length; i++) {
			const t0 = Date.now();
			const missing = tests[i].needs.filter((n) => !has[n]);
			if (missing.length) {
				skipped++;
				console.log(`ok ${i + 1} - ${tests[i].name} # SKIP this pgqueue has no ${missing.map((m) => NEEDS[m]).join(', ')}`);
				continue;
			}
			try {
				await tests[i].fn();
				passed++;
				console.log(`ok ${i + 1} - ${tests[i].name} (${Date.now() - t0} ms)`);
			} catch (e) {
				failed++;
				console.log(`not ok ${i + 1} - ${tests[i].name}\n${String(e.stack).split('\n').map((l) => `#   ${l}`).join('\n')}`);
			}
		}
	}
	if (browser) await browser.close().catch(() => {});
	for (const s of servers) s.kill();
	if (db) await db.end().catch(() => {});
	console.log(`${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
	process.exit(failed === 0 ? 0 : 1);
})();
