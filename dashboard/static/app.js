'use strict';
/*
 * The dashboard's only script (the Content-Security-Policy allows no other):
 * asks before an action is sent, and refreshes the overview in place.
 */
document.addEventListener('submit', function (e) {
	var form = e.target;
	var text = form.getAttribute('data-confirm');
	var confirmed = form.querySelector('input[name="confirmed"]');
	if (!text || !confirmed) return;
	if (window.confirm(text)) {
		confirmed.value = 'yes';
	} else {
		e.preventDefault();
	}
});

(function () {
	var live = document.getElementById('live');
	if (!live) return;
	var src = live.getAttribute('data-src');
	var every = Number(live.getAttribute('data-refresh')) || 2000;
	var busy = false;
	function refresh() {
		if (busy || document.hidden) return;
		busy = true;
		fetch(src, { credentials: 'same-origin', cache: 'no-store' })
			.then(function (r) {
				if (!r.ok) throw new Error('HTTP ' + r.status);
				return r.text();
			})
			.then(function (text) {
				// the server escaped every value in this fragment (lib/html.js)
				live.innerHTML = text;
				live.removeAttribute('data-stale');
			})
			.catch(function () { live.setAttribute('data-stale', 'yes'); })
			.then(function () { busy = false; });
	}
	setInterval(refresh, every);
})();
