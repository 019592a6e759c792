"""Per handler options (concurrency, timeout, retry), on Worker and AsyncWorker."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import pytest

import pgqueue
from conftest import DSN, job_rows, wait_until
from test_worker import _FlakyWorker

KINDS = ["threads", "asyncio"]


def make_worker(kind: str, **settings: Any) -> Any:
    return (pgqueue.Worker if kind == "threads" else pgqueue.AsyncWorker)(DSN, **settings)


def handler_of(kind: str, body: Callable[[pgqueue.Job], Any], pause: float = 0) -> Any:
    """A handler of the worker's kind that sleeps ``pause`` seconds, then runs
    ``body(job)`` (a plain function either way)."""
    if kind == "threads":
        def handle(job: pgqueue.Job) -> Any:
            time.sleep(pause)
            return body(job)
        return handle

    async def ahandle(job: pgqueue.Job) -> Any:
        await asyncio.sleep(pause)
        return body(job)
    return ahandle


def test_options_are_checked_at_registration():
    w = pgqueue.Worker(DSN, concurrency=4)
    aw = pgqueue.AsyncWorker(DSN, concurrency=4)

    async def coro(job: pgqueue.Job) -> None:
        pass

    for worker, fn in ((w, lambda job: None), (aw, coro)):
        for bad in (0, 5, -1, 2.5):
            with pytest.raises(ValueError, match="concurrency of 'q' must be between 1 and "
                                                 "the worker's concurrency \\(4\\)"):
                worker.register("q", fn, concurrency=bad)
        for bad in (0, -1.5):
            with pytest.raises(ValueError, match="timeout"):
                worker.register("q", fn, timeout=bad)
        with pytest.raises(TypeError, match="retry"):
            worker.register("q", fn, retry=5)
        worker.register("q", fn, concurrency=4, timeout=0.1, retry=lambda tries: None)
        worker.handler("r", concurrency=1, timeout=2)(fn)
        assert (worker._specs["q"].concurrency, worker._specs["r"].timeout) == (4, 2)


@pytest.mark.parametrize("kind", KINDS)
def test_per_handler_concurrency_is_reached_and_never_passed(app, admin, queue, running, kind):
    """A queue limited to 2 runs at most 2 jobs at once (and does reach 2),
    while an unlimited queue of the same worker (concurrency 6) runs beside
    it; jobs pushed while the worker waits come through its blocking claim."""
    limited, unlimited = queue + "_lim", queue + "_free"
    active: collections.Counter = collections.Counter()
    peak: collections.Counter = collections.Counter()
    together = [0]
    done: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def push_some() -> None:
        with app.transaction():
            pgqueue.push_batch(app, limited, [{}] * 12)
            pgqueue.push_batch(app, unlimited, [{}] * 24)

    def enter(job: pgqueue.Job) -> None:
        with lock:
            active[job.queue] += 1
            peak[job.queue] = max(peak[job.queue], active[job.queue])
            if active[limited] and active[unlimited]:
                together[0] += 1

    def leave(job: pgqueue.Job) -> None:
        with lock:
            active[job.queue] -= 1
            done[job.queue] += 1

    if kind == "threads":
        def handle(job: pgqueue.Job) -> None:
            enter(job)
            time.sleep(0.05)
            leave(job)
    else:
        async def handle(job: pgqueue.Job) -> None:  # type: ignore[misc]
            enter(job)
            await asyncio.sleep(0.05)
            leave(job)

    push_some()
    w = make_worker(kind, concurrency=6, wait=1)
    w.register(limited, handle, concurrency=2)
    w.register(unlimited, handle)
    r = running(w)
    wait_until(lambda: done[limited] == 12 and done[unlimited] == 24, 60, "the first jobs")
    time.sleep(1.5)  # the worker waits in a blocking claim now
    push_some()
    wait_until(lambda: done[limited] == 24 and done[unlimited] == 48, 60, "the rest")
    r.stop()
    assert peak[limited] == 2, peak
    assert peak[unlimited] > 2, peak
    assert together[0] > 0, "the two queues never ran at the same time"
    assert not job_rows(admin, limited) and not job_rows(admin, unlimited)


def test_a_limited_queue_alone_never_passes_its_limit(app, admin, queue, running):
    """Only limited queues (limits 1 and 3, worker concurrency 8): no more
    than the limits run at once, though the worker has free slots (and the
    limits are reached)."""
    one, three = queue + "_1", queue + "_3"
    with app.transaction():
        pgqueue.push_batch(app, one, [{}] * 6)
        pgqueue.push_batch(app, three, [{}] * 15)
    active: collections.Counter = collections.Counter()
    peak: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def handle(job: pgqueue.Job) -> None:
        with lock:
            active[job.queue] += 1
            peak[job.queue] = max(peak[job.queue], active[job.queue])
        time.sleep(0.1)
        with lock:
            active[job.queue] -= 1

    w = pgqueue.Worker(DSN, concurrency=8, wait=1)
    w.register(one, handle, concurrency=1)
    w.register(three, handle, concurrency=3)
    r = running(w)
    wait_until(lambda: not job_rows(admin, one) and not job_rows(admin, three), 60,
               "all jobs done")
    r.stop()
    assert (peak[one], peak[three]) == (1, 3), peak


def test_timeout_nacks_the_job_and_abandons_its_thread(app, admin, queue, running, caplog):
    """A handler runs past its timeout: its job is nacked with a TimeoutError
    (retry policy applied), a new thread takes the slot (the next job runs
    meanwhile), and when the old thread returns its result is dropped: its
    job.transaction() raises LeaseLost and nothing is acked for it."""
    slow_id = pgqueue.push(app, queue, {"slow": True})
    let_go = threading.Event()
    late: dict[str, Any] = {}
    quick: list[str] = []
    failed: list[tuple] = []

    def handle(job: pgqueue.Job) -> None:
        if not job.payload.get("slow"):
            quick.append(threading.current_thread().name)
            return
        late["thread"] = threading.current_thread().name
        let_go.wait(30)
        try:
            with job.transaction():
                late["tx"] = "entered"
        except pgqueue.LeaseLost as err:
            late["tx"] = str(err)
        late["returned"] = True

    w = _FlakyWorker(DSN, concurrency=1, wait=1, thread="pgqueue-",
                     errors={"pgq_ack": [], "pgq_nack": []})  # counted, not failed
    w.register(queue, handle, timeout=0.5, retry=lambda tries: timedelta(minutes=10))
    w.on("job_failed", lambda job, seconds, exc: failed.append((job.id, seconds, exc)))
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: [s for _, s, _, _, _ in job_rows(admin, queue)] == ["retry"], 20,
                   "the timeout's nack")
        quick_id = pgqueue.push(app, queue, {"slow": False})
        wait_until(lambda: quick and not any(i == quick_id for i, *_ in job_rows(admin, queue)),
                   20, "the next job on the slot's new thread")
        let_go.set()
        wait_until(lambda: late.get("returned"), 10, "the old thread to return")
        time.sleep(0.5)
        r.stop()
    (jid, state, tries, error, key), = job_rows(admin, queue)
    assert (jid, state, tries, key) == (slow_id, "retry", 1, None)
    assert error.startswith("TimeoutError: handler ran longer than 0.5s\n"
                            "Where the handler was (most recent call last):"), error
    assert "let_go.wait(30)" in error, error
    due_in = admin.execute("SELECT extract(epoch FROM run_after - now()) FROM pgqueue.queue "
                           "WHERE id = %s", [slow_id]).fetchone()[0]
    assert 590 < due_in <= 600
    assert quick and quick[0] == late["thread"]  # the same slot, a new thread (same name)
    assert "ran longer than its timeout" in late["tx"], late
    (fid, seconds, exc), = failed
    assert fid == slow_id and 0.5 <= seconds < 2 and isinstance(exc, TimeoutError)
    assert (w.sent("pgq_ack"), w.sent("pgq_nack")) == (1, 1)  # the quick job's ack only
    text = "\n".join(caplog.messages)
    assert "ran longer than its timeout (0.5s)" in text and "abandoned" in text, text
    assert "returned" in text and "after its timeout: result dropped" in text, text


@pytest.mark.parametrize("kind", KINDS)
def test_retry_policy_sets_the_delay_of_each_attempt(app, admin, queue, running, kind):
    """retry(tries) = 3 s x tries: run_after is 3 s after the first try's
    nack, 6 s after the second's; a Retry(delay) raised by the handler wins
    over it.  (Read as each nack is seen: at most a poll late.)"""
    job_id = pgqueue.push(app, queue, {"n": 1})
    wins = pgqueue.push(app, queue, {"explicit": True})

    def fail(job: pgqueue.Job) -> None:
        if job.payload.get("explicit"):
            raise pgqueue.Retry(timedelta(seconds=30), "explicit")
        raise ValueError(f"try {job.tries}")

    def nacked(job: Any, tries: int) -> Callable[[], Any]:
        def check() -> Any:
            row = admin.execute(
                "SELECT state::text, tries, last_error, extract(epoch FROM run_after - now())"
                "  FROM pgqueue.queue WHERE id = %s", [job]).fetchone()
            return row[:2] == ("retry", tries) and (row[2], float(row[3]))
        return check

    w = make_worker(kind, concurrency=2, wait=1, retry_delay=1)
    w.register(queue, handler_of(kind, fail), retry=lambda tries: 3 * tries)
    r = running(w)
    first = wait_until(nacked(job_id, 1), 20, "the first nack")
    explicit = wait_until(nacked(wins, 1), 20, "the Retry's nack")
    second = wait_until(nacked(job_id, 2), 20, "the second nack")
    r.stop()
    assert first[0].startswith("ValueError: try 1") and 2.3 < first[1] <= 3, first
    assert second[0].startswith("ValueError: try 2") and 5.3 < second[1] <= 6, second
    assert explicit[0] == "Retry: explicit" and 28 < explicit[1] <= 30, explicit


@pytest.mark.parametrize("kind", KINDS)
def test_room_in_a_full_queue_ends_the_waiting_claim(app, admin, queue, running, kind):
    """A queue limited to 1 is full, so the claim that waits for work leaves
    it out; when its job ends, that claim is cancelled and the queue's next
    job starts at once, not after the claim's `wait` (10 s here)."""
    limited, other = queue + "_lim", queue + "_other"
    starts: list = []
    ends: list = []

    def body(job: pgqueue.Job) -> None:
        ends.append(time.monotonic())

    def record(job: pgqueue.Job) -> None:
        starts.append(time.monotonic())

    inner = handler_of(kind, body, pause=1.0)
    if kind == "threads":
        def handle(job: pgqueue.Job) -> Any:
            record(job)
            return inner(job)
    else:
        async def handle(job: pgqueue.Job) -> Any:  # type: ignore[misc]
            record(job)
            return await inner(job)

    with app.transaction():
        pgqueue.push_batch(app, limited, [{}] * 2)
    w = make_worker(kind, concurrency=4, wait=10)
    w.register(limited, handle, concurrency=1)
    w.register(other, handle)
    r = running(w)
    wait_until(lambda: starts, 30, "the first job")
    time.sleep(0.5)
    # while the first job runs, a claim waits for work on `other` alone: the
    # claim to be cancelled (else this test proves nothing)
    waiting = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%pgq_claim%%'"
        " AND state = 'active' AND pid <> pg_backend_pid()").fetchone()[0]
    wait_until(lambda: len(ends) == 2, 30, "both jobs of the limited queue")
    r.stop()
    assert waiting == 1, "no claim waited for work while the first job ran"
    assert starts[1] - ends[0] < 3.0, (starts, ends)
    assert not job_rows(admin, limited)
