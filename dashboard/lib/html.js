'use strict';
/*
 * HTML built with a tagged template that escapes every value put into it:
 * html`<td>${job.payload}</td>` shows a payload of <script>...</script> as
 * text.  Only the result of another html`` (an Html) goes in unescaped, so
 * markup comes from this program's own templates and nothing else.
 */

class Html {
	constructor(s) { this.s = s; }
	toString() { return this.s; }
}

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;', '`': '&#96;' };

function escape(v) {
	return String(v).replace(/[&<>"'`]/g, (c) => ESCAPES[c]);
}

function render(v) {
	if (v instanceof Html) return v.s;
	if (Array.isArray(v)) return v.map(render).join('');
	if (v === null || v === undefined || v === false) return '';
	return escape(v);
}

function html(strings, ...values) {
	let out = strings[0];
	for (let i = 0; i < values.length; i++)
		out += render(values[i]) + strings[i + 1];
	return new Html(out);
}

/* A path with its segments percent-encoded: url`/queues/${name}`. */
function url(strings, ...values) {
	let out = strings[0];
	for (let i = 0; i < values.length; i++)
		out += encodeURIComponent(String(values[i])) + strings[i + 1];
	return out;
}

/* 1234567 -> "1,234,567"; a count that reached the cap gets a "+". */
function count(n, atLeast) {
	const s = Number(n).toLocaleString('en-US');
	return atLeast ? `${s}+` : s;
}

/* Seconds -> "4d 3h", "12m 5s", "850 ms". */
function age(seconds) {
	if (seconds === null || seconds === undefined) return '';
	let s = Number(seconds);
	const sign = s < 0 ? '-' : '';
	s = Math.abs(s);
	if (s < 1) return `${sign}${Math.round(s * 1000)} ms`;
	const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24;
	const m = Math.floor(s / 60) % 60, sec = Math.floor(s) % 60;
	if (d > 0) return `${sign}${d}d ${h}h`;
	if (h > 0) return `${sign}${h}h ${m}m`;
	if (m > 0) return `${sign}${m}m ${sec}s`;
	return `${sign}${sec}s`;
}

module.exports = { Html, html, escape, url, count, age };
