"""The AsyncWorker against a real server (and, in the second pass, PgBouncer)."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest

import pgqueue
from conftest import DSN, job_rows, wait_until
from test_worker import _peak_sessions, _work_table, counter


def test_async_worker_runs_each_job_once_in_overlapping_tasks(app, admin, queue, running):
    queues = [queue, queue + "_b"]
    with app.transaction():
        for q in queues:
            pgqueue.push_batch(app, q, [{"n": n} for n in range(150)])
    acked_before = counter(admin, "acked")
    done: collections.Counter = collections.Counter()
    succeeded: collections.Counter = collections.Counter()
    active = [0, 0]  # now, most at once
    where: set = set()

    async def handle(job: pgqueue.AsyncJob) -> None:
        active[0] += 1
        active[1] = max(active[1], active[0])
        where.add((threading.get_ident(), id(asyncio.get_running_loop())))
        await asyncio.sleep(0.01)
        active[0] -= 1
        done[(job.queue, job.payload["n"])] += 1

    w = pgqueue.AsyncWorker(DSN, concurrency=8, wait=2)
    for q in queues:
        w.register(q, handle)
    w.on("job_succeeded", lambda job, seconds: succeeded.update([job.id]))
    r = running(w)
    wait_until(lambda: sum(done.values()) >= 300, 120, "300 jobs done")
    wait_until(lambda: not any(job_rows(admin, q) for q in queues), 10, "the acks")
    wait_until(lambda: sum(succeeded.values()) >= 300, 10, "job_succeeded 300 times")
    r.stop()
    assert set(done) == {(q, n) for q in queues for n in range(150)}
    assert max(done.values()) == 1, "a job ran twice"
    assert len(succeeded) == 300 and max(succeeded.values()) == 1
    # acked once each (the counter moves when the acks commit)
    wait_until(lambda: counter(admin, "acked") - acked_before >= 300, 5, "the counter")
    assert counter(admin, "acked") - acked_before == 300
    assert active[1] > 1, "the handlers' tasks never overlapped"
    assert len(where) == 1, "handlers ran on more than one thread or loop"
    assert isinstance(w.lock_key, str)


def test_an_async_handler_keeps_its_lease(app, admin, queue, running):
    pgqueue.push(app, queue)
    seen: list[tuple] = []

    async def slow(job: pgqueue.AsyncJob) -> None:
        first = job.lock_timeout
        await asyncio.sleep(2)
        seen.append((first, job.lock_timeout, job.lease_lost))

    w = pgqueue.AsyncWorker(DSN, concurrency=1, lease=1.5, wait=2)
    w.register(queue, slow)
    r = running(w)
    wait_until(lambda: seen and not job_rows(admin, queue), 20, "the ack")
    r.stop()
    (first, last, lost), = seen
    assert last > first and not lost  # the heartbeat extended it while awaited


def test_async_worker_shutdown_timeout_cancels_the_handler_and_releases(app, admin, queue,
                                                                        running):
    job_id = pgqueue.push(app, queue)
    cancelled = threading.Event()

    async def stuck(job: pgqueue.AsyncJob) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    w = pgqueue.AsyncWorker(DSN, concurrency=1, wait=2, lease=600, shutdown_timeout=0.5)
    w.register(queue, stuck)
    r = running(w)
    wait_until(lambda: job_rows(admin, queue)[0][4] is not None, 20, "the claim")
    r.stop()
    assert cancelled.is_set()
    # released (not nacked): claimable at once, tries not recorded as a failure
    (jid, state, _, last_error, key), = job_rows(admin, queue)
    assert (jid, state, last_error, key) == (job_id, "scheduled", None, None)


def test_async_timeout_cancels_the_task_and_nacks(app, admin, queue, running):
    job_id = pgqueue.push(app, queue)
    cancelled: list[int] = []
    failed: list[tuple] = []

    async def slow(job: pgqueue.AsyncJob) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(job.tries)
            raise

    w = pgqueue.AsyncWorker(DSN, concurrency=2, wait=2)
    w.register(queue, slow, timeout=0.5, retry=lambda tries: 600)
    w.on("job_failed", lambda job, seconds, exc: failed.append((job.id, seconds, exc)))
    r = running(w)
    wait_until(lambda: [s for _, s, _, _, _ in job_rows(admin, queue)] == ["retry"], 20,
               "the nack")
    wait_until(lambda: failed, 5, "job_failed")
    r.stop()
    state, tries, error, due_in = admin.execute(
        "SELECT state::text, tries, last_error, extract(epoch FROM run_after - now())"
        "  FROM pgqueue.queue WHERE id = %s", [job_id]).fetchone()
    assert (state, tries, error) == ("retry", 1, "TimeoutError: handler ran longer than 0.5s")
    assert 590 < due_in <= 600
    assert cancelled == [1]
    (jid, seconds, exc), = failed
    assert jid == job_id and 0.45 <= seconds < 2 and isinstance(exc, TimeoutError)


@pytest.mark.direct_only
def test_an_async_worker_uses_at_most_three_connections_and_its_pool(app, admin, queue,
                                                                      running):
    """At concurrency 12 with every handler in job.transaction(): the
    claimer's, the completer's and the heartbeat's connections, and at most
    transaction_connections (2) more, counted in pg_stat_activity."""
    name = f"pgqueue async conn test {queue}"
    table = _work_table(admin, queue)
    pgqueue.push_batch(app, queue, [{"n": i} for i in range(36)])
    inside = [0, 0]

    async def handle(job: pgqueue.AsyncJob) -> None:
        async with job.transaction() as conn:
            inside[0] += 1
            inside[1] = max(inside[1], inside[0])
            await conn.execute(f"INSERT INTO {table} (job) VALUES (%s)", [job.id])
            await asyncio.sleep(0.1)
            inside[0] -= 1

    w = pgqueue.AsyncWorker(DSN, concurrency=12, lease=3, wait=2, transaction_connections=2,
                            connect_kwargs={"application_name": name})
    w.register(queue, handle)
    peak = _peak_sessions(admin, queue, name, running(w))
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 36
    assert inside[1] == 2, inside
    # the claimer's and the pool's two at least (the completer has nothing to
    # send: the jobs are acked in their transactions)
    assert 3 <= peak <= 5, peak


def test_async_worker_start_and_stop_from_a_coroutine(app, admin, queue):
    """await start() ... await stop(), without run(); events on the loop,
    coroutine callbacks included."""
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(3)])
    seen: list[tuple] = []

    async def main() -> None:
        w = pgqueue.AsyncWorker(DSN, concurrency=2, wait=1)
        done = asyncio.Event()

        @w.handler(queue)
        async def handle(job: pgqueue.AsyncJob) -> None:
            pass

        @w.on("job_succeeded")
        async def succeeded(job: pgqueue.AsyncJob, seconds: float) -> None:
            await asyncio.sleep(0)
            seen.append(("succeeded", job.id, threading.get_ident()))
            if len(seen) == 3:
                done.set()

        w.on("stopped", lambda err: seen.append(("stopped", err, threading.get_ident())))
        await w.start()
        await asyncio.wait_for(done.wait(), 30)
        await w.stop()
        await w.stop()  # idempotent

    asyncio.run(main())
    assert sorted(i for e, i, _ in seen if e == "succeeded") == sorted(ids)
    assert seen[-1][:2] == ("stopped", None)
    assert len({t for _, _, t in seen}) == 1 and seen[0][2] == threading.get_ident()
    assert not job_rows(admin, queue)
