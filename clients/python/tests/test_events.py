"""Worker events (worker.on), and the failure log line."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from typing import Any

import psycopg
import pytest

import pgqueue
from conftest import ADMIN_DSN, DSN, wait_until

@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_events_fire_with_their_arguments(app, admin, queue, running, kind, caplog):
    """started, then per job job_started and one of job_succeeded, job_failed
    and lease_lost, then stopped; a callback that raises is logged and the
    others still run."""
    admin.execute("SELECT pgq_configure(%s, max_tries => 1)", [queue])
    ok = pgqueue.push(app, queue, {"do": "ok"})
    bad = pgqueue.push(app, queue, {"do": "fail"})
    lost = pgqueue.push(app, queue, {"do": "lose"})
    seen: list[tuple] = []
    lock = threading.Lock()

    def note(*item: Any) -> None:
        with lock:
            seen.append(item)

    def outcome(job: pgqueue.Job) -> None:
        if job.payload["do"] == "fail":
            raise ValueError("on purpose")
        if job.payload["do"] == "lose":
            with psycopg.connect(ADMIN_DSN, autocommit=True) as other:
                other.execute("UPDATE pgqueue.work_queue SET lock_key = 'intruder' "
                              "WHERE id = %s", [job.id])

    if kind == "threads":
        w: Any = pgqueue.Worker(DSN, concurrency=3, lease=1.5, wait=1)

        def handle(job: pgqueue.Job) -> None:
            outcome(job)
            if job.payload["do"] == "lose":
                wait_until(lambda: job.lease_lost, 10, "the heartbeat to notice")
        w.register(queue, handle)
        with pytest.raises(TypeError, match="coroutine function"):
            async def acb() -> None:
                pass
            w.on("started", acb)
    else:
        w = pgqueue.AsyncWorker(DSN, concurrency=3, lease=1.5, wait=1)

        async def ahandle(job: pgqueue.Job) -> None:
            outcome(job)
            while job.payload["do"] == "lose" and not job.lease_lost:
                await asyncio.sleep(0.05)
        w.register(queue, ahandle)

        @w.on("job_failed")
        async def failed_async(job: pgqueue.Job, seconds: float, exc: BaseException) -> None:
            await asyncio.sleep(0.01)
            note("async job_failed", job.id, type(exc).__name__)

    with pytest.raises(ValueError, match="unknown event 'job_done'"):
        w.on("job_done", print)
    w.on("started", lambda: note("started"))
    w.on("job_started", lambda job: 1 / 0)  # logged, the others still called
    w.on("job_started", lambda job: note("job_started", job.id))
    assert w.on("job_succeeded")(lambda job, s: note("job_succeeded", job.id, s)) is not None
    w.on("job_failed", lambda job, s, exc: note("job_failed", job.id, s, exc))
    w.on("lease_lost", lambda job, why: note("lease_lost", job.id, why))
    w.on("stopped", lambda err: note("stopped", err))
    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: len([s for s in seen if s[0] in ("job_succeeded", "job_failed",
                                                              "lease_lost")]) == 3,
                   30, "an outcome for each job")
        if kind == "asyncio":
            wait_until(lambda: any(s[0] == "async job_failed" for s in seen), 5,
                       "the async callback")
        r.stop()
    assert seen[0] == ("started",) and seen[-1] == ("stopped", None), seen
    assert sorted(s[1] for s in seen if s[0] == "job_started") == sorted([ok, bad, lost])
    (_, sid, seconds), = [s for s in seen if s[0] == "job_succeeded"]
    assert sid == ok and isinstance(seconds, float) and 0 <= seconds < 5
    (_, fid, seconds, exc), = [s for s in seen if s[0] == "job_failed"]
    assert fid == bad and isinstance(exc, ValueError) and str(exc) == "on purpose"
    (_, lid, why), = [s for s in seen if s[0] == "lease_lost"]
    assert lid == lost and "pgq_extend answered NULL" in why
    if kind == "asyncio":
        assert ("async job_failed", bad, "ValueError") in seen
    assert sum("a callback of job_started raised" in m for m in caplog.messages) == 3
    # each job started before its outcome
    order = [s[:2] for s in seen]
    assert order.index(("job_started", bad)) < order.index(("job_failed", bad))


def test_a_failure_is_logged_to_stderr_without_logging_configuration(app, queue):
    """No logging.basicConfig in the process: Python's last-resort handler
    still prints the WARNING of a failed job to stderr."""
    pgqueue.push(app, queue)
    script = """if True:
        import sys, threading, pgqueue
        w = pgqueue.Worker(sys.argv[1], concurrency=1, wait=1, retry_delay=600)
        failed = threading.Event()
        w.on("job_failed", lambda job, seconds, exc: failed.set())

        @w.handler(sys.argv[2])
        def boom(job):
            raise ValueError("nobody configured logging")

        w.start()
        ok = failed.wait(30)
        w.stop()
        sys.exit(0 if ok else 3)
    """
    r = subprocess.run([sys.executable, "-c", script, DSN, queue], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "failed on try 1: ValueError: nobody configured logging" in r.stderr, r.stderr
