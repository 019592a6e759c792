"""contrib/prometheus/pgqueue.yaml through Debian's prometheus-postgres-exporter."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request

import pytest

import pgqueue
from conftest import ADMIN_DSN, wait_until

pytestmark = pytest.mark.direct_only

QUERY_FILE = os.path.join(os.environ.get("PGQ_REPO", ""), "contrib", "prometheus", "pgqueue.yaml")
LINE = re.compile(r'^(pgqueue_\w+)(?:\{([^}]*)\})? (\S+)$')


def free_port() -> int:
    """A free loopback port of PGQ_PORTS that run.sh has not taken."""
    lo, hi = (int(x) for x in os.environ.get("PGQ_PORTS", "5600-5649").split("-"))
    taken = set(os.environ.get("PGQ_TAKEN_PORTS", "").split())
    for port in range(lo, hi + 1):
        if str(port) in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


def scrape(port: int) -> dict[tuple[str, str], float]:
    """The pgqueue_* series of /metrics: {(name, queue label or ''): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    series = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            series[(m.group(1), labels.get("queue", ""))] = float(m.group(3))
    return series


@pytest.fixture
def exporter(tmp_path):
    port = free_port()
    dsn = ADMIN_DSN.replace("user=postgres", "user=prometheus") + " sslmode=disable"
    log = open(tmp_path / "exporter.log", "w")
    p = subprocess.Popen(
        ["prometheus-postgres-exporter", f"--extend.query-path={QUERY_FILE}",
         f"--web.listen-address=127.0.0.1:{port}", "--disable-settings-metrics"],
        env={**os.environ, "DATA_SOURCE_NAME": dsn}, stdout=log, stderr=log)

    def up() -> bool:
        try:
            return bool(scrape(port))
        except OSError:
            return False
    try:
        wait_until(up, 30, f"the exporter on 127.0.0.1:{port}")
        yield port
    finally:
        p.terminate()
        p.wait(10)
        if p.returncode not in (0, -15):
            print(open(tmp_path / "exporter.log").read())


def test_exporter_serves_queue_gauges_and_counters(app, admin, queue, exporter):
    paused, busy, waiting = f"{queue}_paused", f"{queue}_busy", f"{queue}_waiting"
    admin.execute("SELECT pgq_configure(%s, paused => true)", [paused])
    admin.execute("SELECT pgq_configure(%s, max_tries => 1)", [busy])
    pgqueue.push_batch(app, paused, [{}, {}, {}])
    pgqueue.push_batch(app, busy, [{"n": 1}, {"n": 2}])
    pgqueue.push(app, waiting)
    # a flow (1.2): a parent in a paused queue, two children waiting for it
    flow = f"{queue}_flow"
    admin.execute("SELECT pgq_configure(%s, paused => true)", [flow])
    parent = pgqueue.push(app, flow)
    admin.execute("SELECT pgq_push_batch(%s, ARRAY['{}', '{}']::jsonb[], after => ARRAY[%s]::uuid[])",
                  [flow, parent])
    stats = lambda q: admin.execute("SELECT * FROM pgq_stats() WHERE queue = %s", [q]).fetchone()
    wait_until(lambda: stats(busy)[3] == 2 and stats(waiting)[3] == 1, 20,
               "the scheduler to schedule the jobs")
    claimed = admin.execute("SELECT id FROM pgq_claim('metrics-test', 2, '10 minutes', ARRAY[%s])",
                            [busy]).fetchall()
    assert len(claimed) == 2
    admin.execute("SELECT pgq_nack(%s, 'metrics-test', 'broken')", [claimed[0][0]])
    time.sleep(1.2)  # let the oldest ready job age

    before = admin.execute("SELECT * FROM pgq_counters()").fetchone()
    series = scrape(exporter)
    after = admin.execute("SELECT * FROM pgq_counters()").fetchone()

    names = ("pending", "retry", "scheduled", "in_flight", "failed")
    for q in (paused, busy, waiting):
        row = stats(q)
        for i, name in enumerate(names, start=1):
            assert series[(f"pgqueue_queue_{name}", q)] == row[i], (q, name)
        age = series[("pgqueue_queue_oldest_ready_age_seconds", q)]
        if row[6] is None:
            assert age == 0
        else:
            expected = time.time() - row[6].timestamp()
            assert expected - 5 < age <= expected + 0.5, (age, expected)
    assert stats(paused)[1] == 3 and stats(busy)[4:6] == (1, 1)
    assert series[("pgqueue_queue_oldest_ready_age_seconds", waiting)] > 1
    assert stats(flow)[7] == 2 and series[("pgqueue_flow_waiting", flow)] == 2
    counters = ("pushed", "scheduled", "claimed", "acked", "nacked", "failed",
                "leases_stolen", "scheduler_passes")
    for i, name in enumerate(counters):
        assert before[i] <= series[(f"pgqueue_{name}_total", "")] <= after[i], name
    assert series[("pgqueue_stats_reset_timestamp_seconds", "")] == before[8].timestamp()
