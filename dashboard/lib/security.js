'use strict';
/*
 * What stands between a browser and the database role the dashboard
 * connects as: response headers (a strict Content-Security-Policy: no inline
 * script or style, nothing from another origin), optional basic auth, a
 * Host check against DNS rebinding while it listens on loopback, and the
 * CSRF token every POST must carry.
 */
const crypto = require('node:crypto');

const CSP = [
	"default-src 'none'",
	"script-src 'self'",
	"style-src 'self'",
	"img-src 'self'",
	"connect-src 'self'",
	"form-action 'self'",
	"frame-ancestors 'none'",
	"base-uri 'none'",
].join('; ');

function setHeaders(res) {
	res.setHeader('Content-Security-Policy', CSP);
	res.setHeader('X-Content-Type-Options', 'nosniff');
	res.setHeader('X-Frame-Options', 'DENY');
	// same-origin, not no-referrer: with no-referrer a browser sends
	// "Origin: null" on the dashboard's own form posts
	res.setHeader('Referrer-Policy', 'same-origin');
	res.setHeader('Cache-Control', 'no-store');
}

function digest(s) {
	return crypto.createHash('sha256').update(s).digest();
}

/*
 * Basic auth: credentials is "user:password" or null (no auth).  Compares
 * digests in constant time.
 */
function basicAuth(credentials) {
	if (!credentials)
		return () => true;
	if (!credentials.includes(':'))
		throw new Error('basic auth credentials must be user:password');
	const want = digest(credentials);
	return (req) => {
		const h = req.headers.authorization || '';
		const m = /^Basic ([A-Za-z0-9+/=]+)$/.exec(h);
		if (!m) return false;
		const got = digest(Buffer.from(m[1], 'base64').toString('utf8'));
		return crypto.timingSafeEqual(got, want);
	};
}

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]', '::1']);

/*
 * Host check: while the server listens on a loopback address, a request
 * must name a loopback host (or one of allowHosts), so that a web page
 * whose name was made to resolve to 127.0.0.1 cannot read the dashboard.
 */
function hostCheck(listenHost, allowHosts) {
	if (!LOOPBACK.has(listenHost) && allowHosts.length === 0)
		return () => true;
	const allowed = new Set([...LOOPBACK, ...allowHosts.map((h) => h.toLowerCase())]);
	return (req) => {
		const host = (req.headers.host || '').toLowerCase();
		const name = host.startsWith('[') ? host.slice(0, host.indexOf(']') + 1) : host.split(':')[0];
		return allowed.has(name);
	};
}

/*
 * CSRF: a random cookie per browser (HttpOnly, SameSite=Strict), and in
 * every form a token that is an HMAC of it under a key made at start.  A
 * POST must bring both, matching; and the Origin and Sec-Fetch-Site
 * headers, when the browser sends them, must name this server.
 */
const COOKIE = 'pgqd_csrf';

function csrf() {
	const key = crypto.randomBytes(32);
	const mac = (v) => crypto.createHmac('sha256', key).update(v).digest('hex');

	function cookieOf(req) {
		for (const part of (req.headers.cookie || '').split(';')) {
			const [k, v] = part.trim().split('=');
			if (k === COOKIE && /^[0-9a-f]{64}$/.test(v || ''))
				return v;
		}
		return null;
	}

	return {
		// the token for this request's forms; sets the cookie when missing
		token(req, res) {
			let c = cookieOf(req);
			if (!c) {
				c = crypto.randomBytes(32).toString('hex');
				res.setHeader('Set-Cookie', `${COOKIE}=${c}; Path=/; HttpOnly; SameSite=Strict`);
				req.headers.cookie = `${COOKIE}=${c}`;
			}
			return mac(c);
		},
		check(req, form) {
			const c = cookieOf(req);
			const t = typeof form.csrf === 'string' ? form.csrf : '';
			if (!c || !/^[0-9a-f]{64}$/.test(t))
				return false;
			if (!crypto.timingSafeEqual(Buffer.from(mac(c), 'hex'), Buffer.from(t, 'hex')))
				return false;
			// a browser that says where the request comes from must say "here"
			const site = req.headers['sec-fetch-site'];
			if (site !== undefined && site !== 'same-origin')
				return false;
			const origin = req.headers.origin;
			if (origin !== undefined && origin !== `http://${req.headers.host}` &&
				origin !== `https://${req.headers.host}`)
				return false;
			return true;
		},
	};
}

module.exports = { setHeaders, basicAuth, hostCheck, csrf, CSP };
