'use strict';
/*
 * The pages, as functions of what the queries returned.  Every value goes
 * through html`` (escaped); action forms are drawn only when the dashboard
 * may act (ctx.canAct), each with the CSRF token and a confirmation text.
 */
const { html, url, count, age } = require('./html');

const LIST_TITLES = {
	pending: 'pending', retry: 'retry', scheduled: 'scheduled', running: 'running',
	failed: 'failed', waiting: 'waiting', archive: 'archive',
};

function layout(ctx, title, body) {
	const flash = ctx.flash ? html`<p class="flash ${ctx.flash.kind}" id="flash">${ctx.flash.text}</p>` : '';
	return html`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · pgqueue</title>
<link rel="stylesheet" href="/static/style.css">
<script src="/static/app.js" defer></script>
</head>
<body>
<header>
<a class="brand" href="/">pgqueue</a>
<span class="who">${ctx.features.role}@${ctx.database} · pgqueue ${ctx.features.version}</span>
${ctx.readOnly ? html`<span class="badge ro" id="read-only">read-only</span>` : ''}
</header>
<main>
${flash}
${body}
</main>
</body>
</html>
`;
}

/* A form that runs one action after a confirmation. */
function actionForm(ctx, action, fields, label, confirmText, extra) {
	return html`<form method="post" action="/action" class="action" data-confirm="${confirmText}">
<input type="hidden" name="csrf" value="${ctx.csrf}">
<input type="hidden" name="action" value="${action}">
<input type="hidden" name="back" value="${ctx.path}">
${Object.entries(fields).map(([k, v]) => html`<input type="hidden" name="${k}" value="${v}">`)}
${extra || ''}<input type="hidden" name="confirmed" value="">
<button type="submit" data-action="${action}">${label}</button>
</form>`;
}

/* ------------------------------------------------------------------ overview */

/*
 * A queue's counts as shown: the queries count one past the cap; a count
 * past it shows as "10,000+", and so does every count of a walk that
 * stopped (pending and retry share one, running and expired another, and
 * the waiting jobs of all queues a third: 1.2, flows).
 */
function shownCounts(q, cap) {
	const c = (n, walkStopped) => {
		const v = Number(n);
		return v > cap || walkStopped ? count(Math.min(v, cap), true) : count(v);
	};
	return {
		pending: c(q.pending, q.ready_capped),
		retry: c(q.retry, q.ready_capped),
		scheduled: c(Number(q.unclaimed) + Number(q.expired), Number(q.unclaimed) > cap || q.leases_capped),
		running: c(q.running, q.leases_capped),
		failed: c(q.failed, false),
		waiting: q.waiting === undefined ? undefined : c(q.waiting, q.waiting_capped),
	};
}

function rate(r, name) {
	return r && r[name] !== null && r[name] !== undefined ? `${r[name].toFixed(1)}/s` : '–';
}

/* The part of the overview that refreshes itself (also /fragments/overview). */
function overviewLive(ctx, queues, rates, cap) {
	const rateLine = rates.error
		? html`<p class="rates muted" id="rates">jobs/s: ${rates.error}</p>`
		: html`<p class="rates" id="rates">
<span>pushed <b data-rate="pushed">${rate(rates.rates, 'pushed')}</b></span>
<span>claimed <b data-rate="claimed">${rate(rates.rates, 'claimed')}</b></span>
<span>acked <b data-rate="acked">${rate(rates.rates, 'acked')}</b></span>
<span>failed <b data-rate="failed">${rate(rates.rates, 'failed')}</b></span>
<span class="muted">all queues, from pgq_counters()</span></p>`;
	const flows = ctx.features.flows;
	const rows = queues.map((q) => {
		const n = shownCounts(q, cap);
		return html`<tr data-queue="${q.queue}">
<td class="name"><a href="${url`/queues/${q.queue}`}">${q.queue}</a></td>
<td class="n" data-col="pending"><a href="${url`/queues/${q.queue}`}?list=pending">${n.pending}</a></td>
<td class="n" data-col="retry"><a href="${url`/queues/${q.queue}`}?list=retry">${n.retry}</a></td>
<td class="n" data-col="scheduled"><a href="${url`/queues/${q.queue}`}?list=scheduled">${n.scheduled}</a></td>
<td class="n" data-col="running"><a href="${url`/queues/${q.queue}`}?list=running">${n.running}</a></td>
<td class="n${Number(q.failed) > 0 ? ' bad' : ''}" data-col="failed"><a href="${url`/queues/${q.queue}`}?list=failed">${n.failed}</a></td>
${flows ? html`<td class="n" data-col="waiting"><a href="${url`/queues/${q.queue}`}?list=waiting">${n.waiting}</a></td>` : ''}
<td class="n" data-col="oldest">${age(q.oldest_age)}</td>
<td data-col="paused">${q.paused ? html`<span class="badge paused">paused</span>` : 'no'}</td>
<td class="n" data-col="weight">${q.weight}</td>
<td class="n" data-col="cap">${Number(q.max_in_flight) === 0 ? 'none' : q.max_in_flight}</td>
</tr>`;
	});
	return html`${rateLine}
<table class="queues" id="queues">
<thead><tr><th>queue</th><th>pending</th><th>retry</th><th>scheduled</th><th>running</th><th>failed</th>${flows ? html`<th>waiting</th>` : ''}<th>oldest ready</th><th>paused</th><th>weight</th><th>cap</th></tr></thead>
<tbody>
${rows.length ? rows : html`<tr><td colspan="${flows ? 11 : 10}" class="muted">no queues yet</td></tr>`}
</tbody>
</table>
<p class="muted small">Counts stop at ${count(cap)} (shown as ${count(cap, true)}); updated <span id="updated">${new Date().toISOString().slice(11, 19)}</span> UTC.</p>`;
}

function overview(ctx, queues, rates, cap, refreshMs) {
	return layout(ctx, 'Queues', html`<h1>Queues</h1>
<section id="live" data-src="/fragments/overview" data-refresh="${refreshMs}">
${overviewLive(ctx, queues, rates, cap)}
</section>`);
}

/* ------------------------------------------------------------------ queue */

function listTable(list, rows) {
	const work = list === 'scheduled' || list === 'running';
	const waiting = list === 'waiting';
	const head = list === 'archive'
		? html`<th>id</th><th>outcome</th><th>finished</th><th>tries</th><th>last error</th><th>payload</th>`
		: html`<th>id</th><th>state</th>${waiting ? html`<th>waiting for</th>` : ''}<th>priority</th><th>run after</th><th>tries</th>${work ? html`<th>lease holder</th><th>lease deadline</th>` : ''}<th>last error</th><th>payload</th>`;
	const body = rows.map((r) => list === 'archive'
		? html`<tr data-id="${r.id}"><td class="id"><a href="${url`/jobs/${r.id}`}">${r.id}</a></td><td>${r.outcome}</td><td>${r.finished}</td><td class="n">${r.tries}</td><td class="err">${clip(r.last_error)}</td><td class="payload"><code>${r.payload_head}</code></td></tr>`
		: html`<tr data-id="${r.id}"><td class="id"><a href="${url`/jobs/${r.id}`}">${r.id}</a></td><td>${r.state}</td>${waiting ? html`<td class="n" data-col="waiting-for">${parents(r.waiting_for)}</td>` : ''}<td class="n">${r.priority}</td><td>${r.run_after}</td><td class="n">${r.tries}</td>${work ? html`<td>${r.lock_key}</td><td>${r.lock_timeout}</td>` : ''}<td class="err">${clip(r.last_error)}</td><td class="payload"><code>${r.payload_head}</code></td></tr>`);
	return html`<table class="jobs" id="jobs"><thead><tr>${head}</tr></thead>
<tbody>${body.length ? body : html`<tr><td colspan="9" class="muted">no jobs on this page</td></tr>`}</tbody></table>`;
}

/* "1 parent", "3 parents". */
function parents(n) {
	return `${n} parent${Number(n) === 1 ? '' : 's'}`;
}

function clip(s) {
	if (s === null || s === undefined) return '';
	return s.length > 200 ? `${s.slice(0, 200)}…` : s;
}

// A queue's groups (1.2): the busiest, with their jobs in flight and waiting.
function groupsTable(groups) {
	if (groups === undefined || groups.rows.length === 0) return '';
	const total = Number(groups.rows[0].groups);
	const rows = groups.rows.map((g) => html`<tr data-group="${g.group_key}"><td>${g.group_key}</td><td class="n" data-col="in_flight">${g.in_flight}</td><td class="n" data-col="pending">${g.pending}</td></tr>`);
	return html`<h2>Groups <span class="count" id="groups-count">${total}</span></h2>
<table id="groups"><thead><tr><th>group</th><th class="n">in flight</th><th class="n">pending</th></tr></thead>
<tbody>${rows}</tbody></table>${total > rows.length ? html`<p class="muted">the ${rows.length} busiest of ${total} groups</p>` : ''}`;
}

function queuePage(ctx, q, list, page, opts) {
	const { cap, limit, lists, retention, rate, groups, nextHref, firstHref } = opts;
	const counts = q ? shownCounts(q, cap) : {};
	const name = opts.queue;
	const tabs = lists.map((l) => html`<a class="tab${l === list ? ' current' : ''}" href="${url`/queues/${name}`}?list=${l}&amp;limit=${limit}" data-list="${l}">${LIST_TITLES[l]}${counts[l] !== undefined ? html` <span class="count">${counts[l]}</span>` : ''}</a>`);

	const settings = q ? html`<dl class="settings" id="settings">
<dt>weight</dt><dd data-setting="weight">${q.weight}</dd>
<dt>cap (max in flight)</dt><dd data-setting="cap">${Number(q.max_in_flight) === 0 ? 'none' : q.max_in_flight}</dd>
<dt>max tries</dt><dd>${q.max_tries}</dd>
<dt>paused</dt><dd data-setting="paused">${q.paused ? 'yes' : 'no'}</dd>
${retention !== undefined ? html`<dt>retention</dt><dd>${retention === null || retention === '00:00:00' ? 'none (no archive)' : retention}</dd>` : ''}
${rate !== undefined ? html`<dt>rate limit</dt><dd data-setting="rate">${rate === null || Number(rate.rate_limit) === 0 ? 'none' : `${rate.rate_limit} per ${rate.rate_period}`}</dd>` : ''}
${groups !== undefined ? html`<dt>max in flight per group</dt><dd data-setting="groups">${groups.limit === 0 ? 'none' : groups.limit}</dd>` : ''}
<dt>oldest ready</dt><dd>${age(q.oldest_age)}</dd>
</dl>${groupsTable(groups)}` : '';

	let actions = '';
	if (ctx.canAct && q) {
		const pause = q.paused
			? actionForm(ctx, 'resume', { queue: name }, 'Resume queue', `Resume queue ${name}?`)
			: actionForm(ctx, 'pause', { queue: name }, 'Pause queue', `Pause queue ${name}? Its jobs will not be scheduled until it is resumed.`);
		const settingsForm = html`<form method="post" action="/action" class="action settings-form" data-confirm="${`Change the settings of queue ${name}?`}">
<input type="hidden" name="csrf" value="${ctx.csrf}">
<input type="hidden" name="action" value="settings">
<input type="hidden" name="back" value="${ctx.path}">
<input type="hidden" name="queue" value="${name}">
<label>weight <input type="number" name="weight" min="1" max="10000" value="${q.weight}" required></label>
<label>cap <input type="number" name="max_in_flight" min="0" value="${q.max_in_flight}" required title="0: no cap"></label>
<input type="hidden" name="confirmed" value="">
<button type="submit" data-action="settings">Save</button>
</form>`;
		const retryAll = ctx.features.operate
			? actionForm(ctx, 'retry_failed', { queue: name }, 'Retry all failed', `Retry every failed job of queue ${name}?`) : '';
		const purge = ctx.features.operate
			? html`<form method="post" action="/action" class="action" data-confirm="${`Purge the jobs of queue ${name} in the chosen state? They are removed for good${ctx.features.flows ? ', and the jobs waiting for them cancelled' : ''}.`}">
<input type="hidden" name="csrf" value="${ctx.csrf}">
<input type="hidden" name="action" value="purge">
<input type="hidden" name="back" value="${ctx.path}">
<input type="hidden" name="queue" value="${name}">
<select name="state"><option>failed</option><option>retry</option><option>pending</option>${ctx.features.flows ? html`<option>waiting</option>` : ''}</select>
<input type="hidden" name="confirmed" value="">
<button type="submit" data-action="purge">Purge</button>
</form>` : '';
		actions = html`<div class="actions" id="queue-actions">${pause}${settingsForm}${retryAll}${purge}</div>`;
	}

	const paging = html`<nav class="paging">
<a href="${firstHref}" id="first-page">first page</a>
${nextHref ? html`<a href="${nextHref}" id="next-page" rel="next">next page →</a>` : html`<span class="muted" id="last-page">last page</span>`}
${page.short ? html`<span class="muted">(looked at ${count(2000)} jobs of the walk for this page)</span>` : ''}
</nav>`;

	return layout(ctx, `Queue ${name}`, html`<h1>Queue <span class="qname" id="queue-name">${name}</span></h1>
${q ? '' : html`<p class="muted">This queue has no jobs and no settings.</p>`}
${settings}
${actions}
<nav class="tabs">${tabs}</nav>
${list === 'archive' && (retention === null || retention === '00:00:00') ? html`<p class="muted">This queue keeps no archive (its retention is 0); rows kept before still show until they expire.</p>` : ''}
${listTable(list, page.rows)}
${paging}`);
}

/* ------------------------------------------------------------------ job */

/* A job's parents or children (1.2, flows): each linked, with its state. */
function edgeTable(id, rows) {
	return html`<table class="jobs" id="${id}"><thead><tr><th>id</th><th>queue</th><th>state</th><th>waiting for</th></tr></thead>
<tbody>${rows.map((r) => html`<tr data-id="${r.id}"><td class="id"><a href="${url`/jobs/${r.id}`}">${r.id}</a></td><td>${r.queue === null ? '' : html`<a href="${url`/queues/${r.queue}`}">${r.queue}</a>`}</td><td data-col="state">${r.state === null ? '(finished)' : r.state}</td><td class="n">${r.state === 'waiting' ? parents(r.waiting_for) : ''}</td></tr>`)}</tbody></table>`;
}

/* The flow around a job: the parents it waits for, the jobs that wait for it. */
function jobEdges(edges) {
	if (!edges || (edges.parents.length === 0 && edges.children.length === 0)) return '';
	return html`${edges.parents.length ? html`<h2>Waits for</h2>
<p class="muted small">The parents not yet acked: the last one's ack makes this job pending.</p>
${edgeTable('parents', edges.parents)}` : ''}
${edges.children.length ? html`<h2>Waited for by</h2>
<p class="muted small">The jobs that wait for this one${edges.moreChildren ? html` (the first ${edges.childrenShown}, by id)` : ''}.</p>
${edgeTable('children', edges.children)}` : ''}`;
}

function jobPage(ctx, j, edges) {
	const leaseLeft = j.lease_left !== null && j.lease_left !== undefined
		? (Number(j.lease_left) >= 0 ? `${age(j.lease_left)} left` : `ran out ${age(-Number(j.lease_left))} ago`) : '';
	const rows = [
		['queue', html`<a href="${url`/queues/${j.queue}`}">${j.queue}</a>`],
		['state', html`<span id="job-state">${j.state}</span>${j.outcome ? html` (${j.outcome})` : ''}`],
		['priority', j.priority],
		['tries', j.max_tries !== undefined ? `${j.tries} of ${j.max_tries}` : j.tries],
		['created', j.created],
	];
	// after its state: the parents it still waits for (1.2)
	if (Number(j.waiting_for) > 0) rows.splice(2, 0, ['waiting for', html`<span id="waiting-for">${parents(j.waiting_for)}</span>`]);
	if (j.finished !== undefined) rows.push(['finished', j.finished]);
	if (j.run_after !== undefined) rows.push(['run after', j.run_after]);
	if (j.scheduled_at) rows.push(['scheduled', j.scheduled_at]);
	if (j.started) rows.push(['claimed', j.started]);
	if (j.state === 'running' || j.state === 'scheduled')
		rows.push(['lease holder', html`<span id="lease-holder">${j.lock_key || '(never claimed)'}</span>`],
			['lease deadline', html`<span id="lease-deadline">${j.lock_timeout || ''}</span> ${leaseLeft}`]);
	let actions = '';
	if (ctx.canAct && ctx.features.operate && j.state !== 'archived') {
		actions = html`<div class="actions" id="job-actions">
${j.state === 'failed' ? actionForm(ctx, 'retry', { id: j.id }, 'Retry', `Retry job ${j.id}? It goes back to pending, due now.`) : ''}
${actionForm(ctx, 'cancel', { id: j.id }, 'Cancel job', `Cancel job ${j.id}? It is removed${j.state === 'running' ? ' while a worker holds it' : ''}${edges && edges.children.length ? ', and the jobs waiting for it are cancelled' : ''}.`)}
</div>`;
	}
	return layout(ctx, `Job ${j.id}`, html`<h1>Job <span class="id" id="job-id">${j.id}</span></h1>
<dl class="job" id="job">${rows.map(([k, v]) => html`<dt>${k}</dt><dd>${v}</dd>`)}</dl>
${actions}
${jobEdges(edges)}
<h2>Last error</h2>
<pre class="err" id="last-error">${j.last_error || '(none)'}</pre>
<h2>Payload</h2>
<pre class="payload" id="payload">${j.payload}</pre>`);
}

/* ------------------------------------------------------------------ misc */

function confirmPage(ctx, form, text) {
	const keep = ['action', 'queue', 'id', 'state', 'weight', 'max_in_flight', 'back'];
	return layout(ctx, 'Confirm', html`<h1>Confirm</h1>
<p id="confirm-text">${text}</p>
<form method="post" action="/action" id="confirm-form">
<input type="hidden" name="csrf" value="${ctx.csrf}">
${keep.filter((k) => typeof form[k] === 'string').map((k) => html`<input type="hidden" name="${k}" value="${form[k]}">`)}
<input type="hidden" name="confirmed" value="yes">
<button type="submit" id="confirm">Confirm</button>
<a href="${safeBack(form.back)}">Cancel</a>
</form>`);
}

function errorPage(ctx, status, message) {
	return layout(ctx, `Error ${status}`, html`<h1>Error ${status}</h1><p class="error" id="error">${message}</p><p><a href="/">Queues</a></p>`);
}

/* A "back" address from a form: a local path, else the overview. */
function safeBack(back) {
	return typeof back === 'string' && /^\/(?![/\\])[\x21-\x7e]*$/.test(back) ? back : '/';
}

module.exports = { overview, overviewLive, queuePage, jobPage, confirmPage, errorPage, safeBack, layout };
