#!/usr/bin/env node
'use strict';
/*
 * pgqueue dashboard: a small web server over one database with pgqueue 1.1.
 *
 *   DATABASE_URL=postgresql://user@host/db node dashboard/server.js [options]
 *
 * It reads with the role it connects as and acts only through the pgqueue
 * API functions (pgq_retry, pgq_retry_failed, pgq_cancel, pgq_purge,
 * pgq_configure).  See docs/operations.md, "Dashboard", for the roles and options.
 */
const http = require('node:http');
const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { parseArgs } = require('node:util');
const pg = require('pg');

const Q = require('./lib/queries');
const P = require('./lib/pages');
const S = require('./lib/security');
const { url } = require('./lib/html');

const USAGE = `usage: node server.js [options]

  --database-url URL   connection string (default: $DATABASE_URL, else libpq's
                       PG* environment variables)
  --host ADDR          address to listen on (default 127.0.0.1)
  --port N             port to listen on (default $PORT, else 8433)
  --read-only          show no action and refuse every POST
  --basic-auth U:P     ask for this user and password (default:
                       $DASHBOARD_BASIC_AUTH; the environment keeps it out of ps)
  --allow-host NAME    a Host name to accept besides loopback ones (repeatable)
  --refresh SECONDS    how often the overview refreshes itself (default 2)
  --count-cap N        where counts stop (default 10000)
  --page-size N        jobs per page (default 50, at most 500)
  --help`;

function parseOptions(argv, env) {
	const { values } = parseArgs({
		args: argv,
		options: {
			'database-url': { type: 'string' },
			host: { type: 'string', default: '127.0.0.1' },
			port: { type: 'string' },
			'read-only': { type: 'boolean', default: false },
			'basic-auth': { type: 'string' },
			'allow-host': { type: 'string', multiple: true, default: [] },
			refresh: { type: 'string', default: '2' },
			'count-cap': { type: 'string', default: '10000' },
			'page-size': { type: 'string', default: '50' },
			help: { type: 'boolean', default: false },
		},
		strict: true,
	});
	const int = (name, v, min, max) => {
		const n = Number(v);
		if (!Number.isInteger(n) || n < min || n > max)
			throw new Error(`--${name} must be an integer between ${min} and ${max}`);
		return n;
	};
	const refresh = Number(values.refresh);
	if (!(refresh >= 0.5 && refresh <= 3600))
		throw new Error('--refresh must be between 0.5 and 3600 seconds');
	return {
		help: values.help,
		databaseUrl: values['database-url'] || env.DATABASE_URL || null,
		host: values.host,
		port: int('port', values.port || env.PORT || '8433', 0, 65535),
		readOnly: values['read-only'],
		basicAuth: values['basic-auth'] || env.DASHBOARD_BASIC_AUTH || null,
		allowHosts: values['allow-host'],
		refreshMs: Math.round(refresh * 1000),
		countCap: int('count-cap', values['count-cap'], 100, 10000000),
		pageSize: int('page-size', values['page-size'], 1, 500),
	};
}

/* ------------------------------------------------------------------ state */

/*
 * jobs/s from pgq_counters(): the difference between this sample and the
 * last one at least a second older, divided by the time between them.
 */
function rateSampler() {
	let prev = null;
	let last = null;
	return (c) => {
		const cur = { at: Number(c.at), pushed: Number(c.pushed), claimed: Number(c.claimed),
			acked: Number(c.acked), failed: Number(c.failed) };
		if (prev && cur.at - prev.at >= 1) {
			const dt = cur.at - prev.at;
			const r = {};
			for (const k of ['pushed', 'claimed', 'acked', 'failed'])
				r[k] = cur[k] >= prev[k] ? (cur[k] - prev[k]) / dt : null;	// null: counters were reset
			last = r;
			prev = cur;
		} else if (!prev)
			prev = cur;
		return last;
	};
}

/* Messages shown once after an action's redirect, by a random id. */
function flashes() {
	const m = new Map();
	return {
		put(kind, text) {
			const id = crypto.randomBytes(12).toString('hex');
			m.set(id, { kind, text, until: Date.now() + 60000 });
			for (const [k, v] of m) if (v.until < Date.now()) m.delete(k);
			return id;
		},
		take(id) {
			const f = typeof id === 'string' ? m.get(id) : undefined;
			if (f) m.delete(id);
			return f || null;
		},
	};
}

/* ------------------------------------------------------------------ server */

function createServer(opts) {
	/*
	 * Every read is an index probe or a bounded walk along an index (see
	 * lib/queries.js), as in the extension's own functions: plans must not
	 * turn into sequential scans when the statistics say a queue is small.
	 * Timestamps are shown as the database has them, in UTC.
	 */
	const pool = new pg.Pool({
		connectionString: opts.databaseUrl || undefined,
		max: 4,
		application_name: 'pgqueue dashboard',
		options: '-c DateStyle=ISO -c TimeZone=UTC -c enable_seqscan=off -c enable_bitmapscan=off -c jit=off',
	});
	pool.on('error', () => {});	// an idle connection that broke; the next query reconnects

	const authOk = S.basicAuth(opts.basicAuth);
	const hostOk = S.hostCheck(opts.host, opts.allowHosts);
	const tokens = S.csrf();
	const sample = rateSampler();
	const flash = flashes();
	let features = null;
	let featuresAt = 0;

	async function getFeatures() {
		if (!features || Date.now() - featuresAt > 30000) {
			const r = await pool.query(Q.FEATURES);
			if (r.rows.length === 0)
				throw new Error('the extension pgqueue is not installed in this database');
			const f = r.rows[0];
			if (!/^1\.([1-9]|\d\d)/.test(f.version) && !/^[2-9]/.test(f.version))
				throw new Error(`pgqueue ${f.version} is installed; the dashboard needs 1.1 (ALTER EXTENSION pgqueue UPDATE)`);
			f.schemaSql = pg.Client.prototype.escapeIdentifier(f.schema);
			features = f;
			featuresAt = Date.now();
		}
		return features;
	}

	async function rates(features) {
		try {
			const r = await pool.query(Q.countersSql(features.schemaSql));
			return { rates: sample(r.rows[0]) };
		} catch (e) {
			return { error: e.code === '42501' ? 'no privilege on pgq_counters()' : e.message };
		}
	}

	async function overviewData(features) {
		const [queues, rt] = await Promise.all([
			pool.query(features.flows ? Q.OVERVIEW_FLOWS : Q.OVERVIEW, [opts.countCap + 1]).then((r) => r.rows),
			rates(features)]);
		return { queues, rt };
	}

	const STATIC = {
		'/static/app.js': ['application/javascript; charset=utf-8', fs.readFileSync(path.join(__dirname, 'static', 'app.js'))],
		'/static/style.css': ['text/css; charset=utf-8', fs.readFileSync(path.join(__dirname, 'static', 'style.css'))],
	};

	function send(res, status, body, type) {
		res.statusCode = status;
		res.setHeader('Content-Type', type || 'text/html; charset=utf-8');
		res.end(String(body));
	}

	function encodeCursor(c) {
		return Buffer.from(JSON.stringify(c)).toString('base64url');
	}

	function decodeCursor(s) {
		if (!s) return null;
		try {
			return JSON.parse(Buffer.from(s, 'base64url').toString('utf8'));
		} catch (e) {
			throw new Q.BadRequest('bad cursor');
		}
	}

	async function readForm(req) {
		if (!/^application\/x-www-form-urlencoded\b/.test(req.headers['content-type'] || ''))
			throw new Q.BadRequest('a form is expected');
		let body = '';
		for await (const chunk of req) {
			body += chunk;
			if (body.length > 65536) throw new Q.BadRequest('form too large');
		}
		const form = {};
		for (const [k, v] of new URLSearchParams(body)) form[k] = v;
		return form;
	}

	/* ---------------------------------------------------------- actions */

	const DESCRIBE = {
		retry: (f) => `Retry job ${f.id}? It goes back to pending, due now.`,
		retry_failed: (f) => `Retry every failed job of queue ${f.queue}?`,
		cancel: (f, flows) => `Cancel job ${f.id}? It is removed${flows ? ', and any job waiting for it is cancelled' : ''}.`,
		purge: (f, flows) => `Purge every ${f.state} job of queue ${f.queue}? They are removed for good${flows ? ', and the jobs waiting for them cancelled' : ''}.`,
		pause: (f) => `Pause queue ${f.queue}?`,
		resume: (f) => `Resume queue ${f.queue}?`,
		settings: (f) => `Set weight ${f.weight} and cap ${f.max_in_flight} on queue ${f.queue}?`,
	};

	// the states a queue's jobs can be purged in (and, with flows, waiting)
	const PURGE_STATES = ['pending', 'retry', 'failed'];

	function actionParams(f, features) {
		const need = (k) => {
			if (typeof f[k] !== 'string' || f[k] === '') throw new Q.BadRequest(`${k} is missing`);
			return f[k];
		};
		const int = (k) => {
			const v = need(k);
			if (!/^-?\d{1,10}$/.test(v)) throw new Q.BadRequest(`${k} must be an integer`);
			return Number(v);
		};
		switch (f.action) {
		case 'retry': case 'cancel': return [need('id')];
		case 'retry_failed': case 'pause': case 'resume': return [need('queue')];
		case 'purge': {
			const states = features.flows ? [...PURGE_STATES, 'waiting'] : PURGE_STATES;
			if (!states.includes(f.state))
				throw new Q.BadRequest(`state must be ${states.slice(0, -1).join(', ')} or ${states[states.length - 1]}`);
			return [need('queue'), f.state];
		}
		case 'settings': return [need('queue'), int('weight'), int('max_in_flight')];
		default: throw new Q.BadRequest('unknown action');
		}
	}

	function outcome(f, result) {
		switch (f.action) {
		case 'retry': return result ? ['ok', `Job ${f.id} is pending again.`] : ['warn', `Job ${f.id} was not failed (or is gone): nothing retried.`];
		case 'cancel': return result ? ['ok', `Job ${f.id} was cancelled.`] : ['warn', `Job ${f.id} does not exist (any more).`];
		case 'retry_failed': return ['ok', `${result} failed job(s) of queue ${f.queue} are pending again.`];
		case 'purge': return ['ok', `${result} ${f.state} job(s) of queue ${f.queue} were purged.`];
		case 'pause': return ['ok', `Queue ${f.queue} is paused.`];
		case 'resume': return ['ok', `Queue ${f.queue} is resumed.`];
		default: return ['ok', `Queue ${f.queue}: weight ${f.weight}, cap ${f.max_in_flight}.`];
		}
	}

	async function doAction(req, res, ctx) {
		if (opts.readOnly)
			return send(res, 403, P.errorPage(ctx, 403, 'This dashboard is read-only: it changes nothing.'));
		const form = await readForm(req);
		if (!tokens.check(req, form))
			return send(res, 403, P.errorPage(ctx, 403, 'The form is stale or did not come from this dashboard (CSRF token). Reload the page and try again.'));
		ctx.csrf = tokens.token(req, res);
		const params = actionParams(form, ctx.features);
		if (['retry', 'retry_failed', 'cancel', 'purge'].includes(form.action) && !ctx.features.operate)
			throw new Q.BadRequest('this pgqueue has no operator functions (pgq_retry, pgq_cancel, pgq_purge)');
		if (form.confirmed !== 'yes')
			return send(res, 200, P.confirmPage(ctx, form, DESCRIBE[form.action](form, ctx.features.flows)));
		const back = P.safeBack(form.back);
		let id;
		try {
			const r = await pool.query(Q.actionSql(ctx.features.schemaSql, form.action), params);
			const [kind, text] = outcome(form, r.rows[0].result);
			id = flash.put(kind, text);
		} catch (e) {
			if (!e.code) throw e;
			id = flash.put('error', `${form.action} failed: ${e.message}${e.code ? ` (${e.code})` : ''}`);
		}
		res.statusCode = 303;
		res.setHeader('Location', `${back}${back.includes('?') ? '&' : '?'}flash=${id}`);
		res.end();
	}

	/* ---------------------------------------------------------- pages */

	// retention as read (undefined: a database without the archive)
	function keepsArchive(retention) {
		return retention !== undefined && retention !== null && retention !== '00:00:00';
	}

	// The tab a queue's page opens on when the address names none: the
	// first list, in the order of the tabs, that has jobs; the archive when
	// only it may; else the pending jobs.
	function firstListWithJobs(q, retention) {
		if (q) {
			const counts = [['pending', q.pending], ['retry', q.retry],
				['scheduled', Number(q.unclaimed) + Number(q.expired)], ['running', q.running], ['failed', q.failed],
				['waiting', q.waiting || 0]];
			const found = counts.find(([, n]) => Number(n) > 0);
			if (found) return found[0];
		}
		return keepsArchive(retention) ? 'archive' : 'pending';
	}

	async function queuePage(req, res, ctx, name, query) {
		const lists = ['pending', 'retry', 'scheduled', 'running', 'failed'];
		if (ctx.features.flows) lists.push('waiting');
		if (ctx.features.archive) lists.push('archive');
		let list = query.get('list');
		if (list !== null && !lists.includes(list)) throw new Q.BadRequest('unknown list');
		let limit = opts.pageSize;
		if (query.get('limit')) {
			limit = Number(query.get('limit'));
			if (!Number.isInteger(limit) || limit < 1 || limit > 500) throw new Q.BadRequest('limit must be between 1 and 500');
		}
		const cursor = decodeCursor(query.get('after'));
		const client = await pool.connect();
		let q, page, retention, rate, groups;
		try {
			// one snapshot for the counts and the page
			await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
			q = (await client.query(ctx.features.flows ? Q.QUEUE_ONE_FLOWS : Q.QUEUE_ONE, [opts.countCap + 1, name])).rows[0];
			if (ctx.features.retention) {
				const r = await client.query(Q.RETENTION, [name]);
				retention = r.rows.length ? r.rows[0].retention : null;
			}
			if (ctx.features.rate_limit) {
				const r = await client.query(Q.RATE, [name]);
				rate = r.rows.length ? r.rows[0] : null;
			}
			if (ctx.features.groups) {
				const l = await client.query(Q.GROUP_LIMIT, [name]);
				const g = await client.query(Q.GROUPS, [name, 20]);
				groups = { limit: l.rows.length ? Number(l.rows[0].group_max_in_flight) : 0, rows: g.rows };
			}
			if (list === null) list = firstListWithJobs(q, retention);
			page = await Q.listPage(client, list, name, cursor, limit);
			await client.query('COMMIT');
		} catch (e) {
			await client.query('ROLLBACK').catch(() => {});
			throw e;
		} finally {
			client.release();
		}
		const known = q && (q.configured || Number(q.pending) + Number(q.retry) + Number(q.unclaimed) +
			Number(q.expired) + Number(q.running) + Number(q.failed) + Number(q.waiting || 0) > 0);
		const base = `${url`/queues/${name}`}?list=${list}&limit=${limit}`;
		// the archive's tab for a queue that keeps one (or when asked for:
		// rows kept before its retention was set to 0 show until they expire);
		// the waiting jobs' tab for a queue that has some, or may have (the
		// walk that counts them stopped), or when asked for
		const tabs = lists.filter((l) => (l !== 'archive' || keepsArchive(retention) || list === 'archive') &&
			(l !== 'waiting' || Number(q.waiting) > 0 || q.waiting_capped || list === 'waiting'));
		return send(res, 200, P.queuePage(ctx, known ? q : null, list, page, {
			cap: opts.countCap, limit, lists: tabs, retention, rate, groups, queue: name,
			firstHref: base,
			nextHref: page.next ? `${base}&after=${encodeCursor(page.next)}` : null,
		}));
	}

	// a job page lists at most this many of the jobs waiting for it
	const CHILDREN_SHOWN = 100;

	async function jobPage(req, res, ctx, id) {
		if (!/^[0-9a-fA-F-]{32,36}$/.test(id))
			throw new Q.BadRequest('not a job id');
		const flows = ctx.features.flows;
		let r = await pool.query(flows ? Q.JOB_FLOWS : Q.JOB, [id]);
		// its open edges (1.2): what it waits for, what waits for it
		let edges = null;
		if (r.rows.length > 0 && flows) {
			const [parents, children] = await Promise.all([pool.query(Q.PARENTS, [id]),
				pool.query(Q.CHILDREN_OF, [id, CHILDREN_SHOWN + 1])]);
			edges = { parents: parents.rows, children: children.rows.slice(0, CHILDREN_SHOWN),
				moreChildren: children.rows.length > CHILDREN_SHOWN, childrenShown: CHILDREN_SHOWN };
		}
		if (r.rows.length === 0 && ctx.features.archive)
			r = await pool.query(Q.ARCHIVED_JOB, [id]);
		if (r.rows.length === 0)
			return send(res, 404, P.errorPage(ctx, 404, `There is no job ${id} (it may have been acked, cancelled or purged).`));
		return send(res, 200, P.jobPage(ctx, r.rows[0], edges));
	}

	async function handle(req, res) {
		S.setHeaders(res);
		if (!hostOk(req))
			return send(res, 421, 'unknown Host\n', 'text/plain; charset=utf-8');
		if (!authOk(req)) {
			res.setHeader('WWW-Authenticate', 'Basic realm="pgqueue dashboard", charset="UTF-8"');
			return send(res, 401, 'authentication required\n', 'text/plain; charset=utf-8');
		}
		const u = new URL(req.url, 'http://dashboard');
		if (u.pathname === '/favicon.ico') {
			res.statusCode = 204;
			return res.end();
		}
		const st = STATIC[u.pathname];
		if (st && req.method === 'GET') {
			res.setHeader('Cache-Control', 'max-age=300');
			return send(res, 200, st[1], st[0]);
		}
		const ctx = {
			readOnly: opts.readOnly, canAct: !opts.readOnly, database: '', path: u.pathname,
			features: { role: '', version: '' },
		};
		try {
			ctx.features = await getFeatures();
			ctx.database = ctx.features.database;
			const keep = new URLSearchParams(u.searchParams);
			keep.delete('flash');
			ctx.path = u.pathname + (keep.toString() ? `?${keep}` : '');
			if (req.method === 'POST') {
				if (u.pathname !== '/action') return send(res, 404, P.errorPage(ctx, 404, 'No such page.'));
				return await doAction(req, res, ctx);
			}
			if (req.method !== 'GET' && req.method !== 'HEAD') {
				res.setHeader('Allow', 'GET, HEAD, POST');
				return send(res, 405, P.errorPage(ctx, 405, 'Method not allowed.'));
			}
			// the pages with forms get the token (and the cookie, if missing:
			// only these navigations set it, so no parallel request of the
			// page replaces it)
			const withForms = u.pathname === '/' || /^\/(queues|jobs)\/[^/]+$/.test(u.pathname);
			ctx.csrf = !opts.readOnly && withForms ? tokens.token(req, res) : '';
			ctx.flash = flash.take(u.searchParams.get('flash'));
			let m;
			if (u.pathname === '/') {
				const { queues, rt } = await overviewData(ctx.features);
				return send(res, 200, P.overview(ctx, queues, rt, opts.countCap, opts.refreshMs));
			}
			if (u.pathname === '/fragments/overview') {
				const { queues, rt } = await overviewData(ctx.features);
				return send(res, 200, P.overviewLive(ctx, queues, rt, opts.countCap));
			}
			if ((m = /^\/queues\/([^/]+)$/.exec(u.pathname)))
				return await queuePage(req, res, ctx, decodeURIComponent(m[1]), u.searchParams);
			if ((m = /^\/jobs\/([^/]+)$/.exec(u.pathname)))
				return await jobPage(req, res, ctx, decodeURIComponent(m[1]));
			return send(res, 404, P.errorPage(ctx, 404, 'No such page.'));
		} catch (e) {
			if (e instanceof Q.BadRequest || e instanceof URIError)
				return send(res, 400, P.errorPage(ctx, 400, e.message));
			// a value the database refused (a cursor or id it cannot cast)
			if (e.code && /^22/.test(e.code))
				return send(res, 400, P.errorPage(ctx, 400, e.message));
			if (e.code === '42501')
				return send(res, 403, P.errorPage(ctx, 403, `The role this dashboard connects as may not do that: ${e.message}`));
			console.error(e);
			return send(res, 500, P.errorPage(ctx, 500, e.message));
		}
	}

	const server = http.createServer((req, res) => {
		handle(req, res).catch((e) => {
			console.error(e);
			if (!res.headersSent) send(res, 500, 'internal error\n', 'text/plain; charset=utf-8');
			else res.end();
		});
	});
	server.on('close', () => pool.end().catch(() => {}));
	return server;
}

module.exports = { createServer, parseOptions };

if (require.main === module) {
	let opts;
	try {
		opts = parseOptions(process.argv.slice(2), process.env);
	} catch (e) {
		console.error(`${e.message}\n\n${USAGE}`);
		process.exit(2);
	}
	if (opts.help) {
		console.log(USAGE);
		process.exit(0);
	}
	const server = createServer(opts);
	server.listen(opts.port, opts.host, () => {
		const a = server.address();
		const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
		console.log(`pgqueue dashboard on http://${host}:${a.port}/${opts.readOnly ? ' (read-only)' : ''}`);
	});
	const stop = () => server.close(() => process.exit(0));
	process.on('SIGTERM', stop);
	process.on('SIGINT', stop);
}
