"""The Worker against a real server (and, in the second pass, PgBouncer)."""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

import psycopg
import pytest

import pgqueue
from conftest import DSN, HERE, job_rows, restart_server, wait_until


def counter(admin: psycopg.Connection, name: str) -> int:
    return admin.execute(f"SELECT {name} FROM pgq_counters()").fetchone()[0]


def test_2000_jobs_over_3_queues_each_done_once(app, admin, queue, running):
    queues = [f"{queue}_{i}" for i in range(3)]
    with app.transaction():
        for i, q in enumerate(queues):
            pgqueue.push_batch(app, q, [{"n": n} for n in range(i, 2000, 3)])
    done: list[tuple[str, int]] = []
    keys: set[str] = set()
    active = [0, 0]  # now, most at once
    lock = threading.Lock()

    def handle(job: pgqueue.Job) -> None:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(0.002)
        with lock:
            active[0] -= 1
            done.append((job.queue, job.payload["n"]))
            keys.add(job.lock_key)

    w = pgqueue.Worker(DSN, concurrency=4, lease=30, wait=5)
    for q in queues:
        w.register(q, handle)
    r = running(w)
    wait_until(lambda: len(done) >= 2000, 120, "2,000 jobs done")
    wait_until(lambda: not any(job_rows(admin, q) for q in queues), 10, "acks")
    r.stop()
    seen = collections.Counter(n for _, n in done)
    assert len(done) == 2000 and set(seen) == set(range(2000)) and max(seen.values()) == 1
    assert {q for q, n in done if n % 3 == 0} == {queues[0]}
    # one lock_key for the whole worker, whatever its concurrency
    assert keys == {w.lock_key} and w.lock_key.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert active[1] > 1, "handlers never ran at the same time"


def test_raising_handler_is_retried_then_failed(app, admin, queue, running):
    admin.execute("SELECT pgq_configure(%s, max_tries => 3)", [queue])
    job_id = pgqueue.push(app, queue, {"x": 1})
    tries: list[int] = []

    def explode(job: pgqueue.Job) -> None:
        tries.append(job.tries)
        raise ValueError(f"boom on try {job.tries}")

    w = pgqueue.Worker(DSN, concurrency=2, retry_delay=0, wait=5)
    w.register(queue, explode)
    r = running(w)
    wait_until(lambda: job_rows(admin, queue)[0][1] == "failed", 30, "the job to fail")
    r.stop()
    assert tries == [1, 2, 3]
    (jid, state, n, last_error, _), = job_rows(admin, queue)
    assert (jid, state, n) == (job_id, "failed", 3)
    assert last_error.startswith("ValueError: boom on try 3\nTraceback")
    assert "in explode" in last_error and 'raise ValueError(f"boom' in last_error


def test_handler_may_choose_the_retry_delay(app, admin, queue, running):
    pgqueue.push(app, queue)
    calls: list[int] = []

    def later(job: pgqueue.Job) -> None:
        calls.append(job.tries)
        raise pgqueue.Retry(timedelta(minutes=10), "rate limited")

    w = pgqueue.Worker(DSN, concurrency=1, wait=5)
    w.register(queue, later)
    r = running(w)
    wait_until(lambda: job_rows(admin, queue)[0][1] == "retry", 20, "the nack")
    r.stop()
    state, error, due_in = admin.execute(
        "SELECT state::text, last_error, extract(epoch FROM run_after - now())"
        "  FROM pgqueue.queue WHERE queue = %s", [queue]).fetchone()
    assert (state, error, calls) == ("retry", "Retry: rate limited", [1])
    assert 590 < due_in <= 600


def test_slow_handler_keeps_its_job(app, admin, queue, running):
    """A handler three times longer than the lease: the heartbeat keeps the job."""
    job_id = pgqueue.push(app, queue)
    stolen_before = counter(admin, "leases_stolen")
    calls: list[tuple[str, int]] = []

    def slow(job: pgqueue.Job) -> None:
        calls.append((job.lock_key, job.tries))
        time.sleep(4.5)
        assert not job.lease_lost

    first = pgqueue.Worker(DSN, concurrency=1, lease=1.5, wait=5)
    first.register(queue, slow)
    running(first)
    wait_until(lambda: calls, 20, "the first claim")
    # a second worker on the same queue, claiming all the while
    second = pgqueue.Worker(DSN, concurrency=2, lease=1.5, wait=1)
    second.register(queue, slow)
    running(second)
    wait_until(lambda: not job_rows(admin, queue), 20, "the ack")
    assert len(calls) == 1 and calls[0][1] == 1
    assert calls[0][0] in first.lock_keys
    assert counter(admin, "leases_stolen") == stolen_before
    assert admin.execute("SELECT count(*) FROM pgqueue.queue WHERE id = %s",
                         [job_id]).fetchone()[0] == 0


def test_lost_lease_is_not_acked(app, admin, queue, running, caplog):
    job_id = pgqueue.push(app, queue)
    started, lost = threading.Event(), threading.Event()

    def handle(job: pgqueue.Job) -> None:
        started.set()
        wait_until(lambda: job.lease_lost, 10, "the heartbeat to notice")
        lost.set()

    w = pgqueue.Worker(DSN, concurrency=1, lease=1.5, wait=5)
    w.register(queue, handle)
    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        r = running(w)
        assert started.wait(20)
        # another holder takes the job behind the worker's back
        admin.execute("UPDATE pgqueue.work_queue SET lock_key = 'intruder' WHERE id = %s",
                      [job_id])
        assert lost.wait(15)
        time.sleep(0.5)
        r.stop()
    assert [(s, k) for _, s, _, _, k in job_rows(admin, queue)] == [("scheduled", "intruder")]
    assert any("lease of job" in m and str(job_id) in m and "not acked" in m
               for m in caplog.messages), caplog.messages


class _AsyncCall:
    async def __call__(self, job: pgqueue.Job) -> None:
        pass


def test_registering_a_handler_of_the_wrong_kind_raises_type_error():
    """async handlers (coroutine functions, objects whose __call__ is one,
    partials of them) belong to AsyncWorker, plain functions to Worker."""
    async def coro(job: pgqueue.Job, extra: int = 0) -> None:
        pass

    def plain(job: pgqueue.Job) -> None:
        pass

    w = pgqueue.Worker(DSN)
    for fn in (coro, _AsyncCall(), functools.partial(coro, extra=1),
               functools.partial(functools.partial(_AsyncCall())), _AsyncCall().__call__):
        with pytest.raises(TypeError, match="AsyncWorker"):
            w.register("q", fn)
        with pytest.raises(TypeError, match="AsyncWorker"):
            w.handler("q")(fn)
    aw = pgqueue.AsyncWorker(DSN)
    for fn in (plain, lambda job: coro(job), functools.partial(plain)):
        with pytest.raises(TypeError, match="not a coroutine function.*pgqueue.Worker"):
            aw.register("q", fn)
    with pytest.raises(TypeError, match="not callable"):
        w.register("q", 42)
    # what each does take
    w.register("q", plain)
    w.register("r", functools.partial(plain))
    aw.register("q", coro)
    aw.register("r", _AsyncCall())
    aw.register("s", functools.partial(coro, extra=2))
    assert sorted(w._specs) == ["q", "r"] and sorted(aw._specs) == ["q", "r", "s"]


def test_a_handler_that_returns_an_awaitable_fails_its_job(app, admin, queue, running, caplog):
    """A plain function that returns a coroutine passes registration; at run
    time its job is nacked with a TypeError, never acked, and the coroutine
    is closed unawaited."""
    admin.execute("SELECT pgq_configure(%s, max_tries => 1)", [queue])
    job_id = pgqueue.push(app, queue)
    awaited: list[str] = []

    async def work(job: pgqueue.Job) -> None:
        awaited.append(str(job.id))

    w = pgqueue.Worker(DSN, concurrency=1, wait=2)
    w.register(queue, lambda job: work(job))
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: [s for _, s, _, _, _ in job_rows(admin, queue)] == ["failed"], 20,
                   "the job to be nacked")
        r.stop()
    (jid, _, tries, last_error, _), = job_rows(admin, queue)
    assert (jid, tries, awaited) == (job_id, 1, [])
    assert last_error.startswith("TypeError: the handler of") and "returned an awaitable" \
        in last_error and "AsyncWorker" in last_error, last_error
    assert any("failed on try 1: TypeError" in m for m in caplog.messages), caplog.messages


class _After:
    """An entry of _Flaky's errors: the statement runs, then ``error`` is
    raised (an answer lost after the server committed: inside a transaction,
    after its commit).  With ``when``, only once a statement's rows pass it."""

    def __init__(self, error: BaseException, when: Callable[[list], bool] | None = None) -> None:
        self.error, self.when = error, when


class _Flaky:
    """A connection whose ``execute`` raises ``errors[word]`` (in turn) on
    statements containing ``word``, then behaves; an entry that is a function
    is called instead, before the statement is sent (a delay, say); an
    _After entry raises after the statement ran.
    ``sent[word]`` counts those statements that went through, ``tried[word]``
    those sent to the server (an error of its own included)."""

    def __init__(self, conn: psycopg.Connection, errors: dict[str, list]) -> None:
        self._conn, self._errors = conn, errors
        self.sent: collections.Counter[str] = collections.Counter()
        self.tried: collections.Counter[str] = collections.Counter()
        self._after_commit: BaseException | None = None

    def execute(self, query, params=None):
        word = next((w for w in self._errors if w in query), None)
        fault = None
        if word is not None and self._errors[word]:
            fault = self._errors[word][0]
            if not isinstance(fault, _After):
                self._errors[word].pop(0)
                if not callable(fault):
                    raise fault
                fault()
        if word is not None:
            self.tried[word] += 1
        cur = self._conn.execute(query, params)
        if word is not None:
            self.sent[word] += 1
        if isinstance(fault, _After):
            rows = cur.fetchall()
            if rows:
                cur.scroll(0, "absolute")
            if fault.when is None or fault.when(rows):
                self._errors[word].pop(0)
                if self._conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
                    raise fault.error
                self._after_commit = fault.error
        return cur

    @contextlib.contextmanager
    def transaction(self):
        with self._conn.transaction() as tx:
            yield tx
        error, self._after_commit = self._after_commit, None
        if error is not None:
            raise error

    def __getattr__(self, name):
        return getattr(self._conn, name)


class _FlakyMixin:
    """A worker whose connections made in threads named ``thread*`` are _Flaky."""

    def __init__(self, *args, thread: str, errors: dict[str, list], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.flaky: list[_Flaky] = []
        self._flaky_args = (thread, errors)

    def _connect(self, **overrides):
        conn = super()._connect(**overrides)
        thread, errors = self._flaky_args
        if not threading.current_thread().name.startswith(thread):
            return conn
        self.flaky.append(_Flaky(conn, errors))
        return self.flaky[-1]

    def sent(self, word: str) -> int:
        return sum(f.sent[word] for f in self.flaky)

    def tried(self, word: str) -> int:
        return sum(f.tried[word] for f in self.flaky)


class _FlakyWorker(_FlakyMixin, pgqueue.Worker):
    pass


class _FlakyAsyncWorker(_FlakyMixin, pgqueue.AsyncWorker):
    pass


def test_heartbeat_survives_errors_that_are_not_the_connection(app, admin, queue, running,
                                                               caplog):
    """pgq_extend raises a DataError, then a RuntimeError: the lease is still extended."""
    pgqueue.push(app, queue)
    seen: list[tuple] = []

    def slow(job: pgqueue.Job) -> None:
        first = job.lock_timeout
        time.sleep(3)
        seen.append((first, job.lock_timeout, job.lease_lost))

    w = _FlakyWorker(DSN, concurrency=1, lease=1.5, wait=2, thread="pgqueue-heartbeat",
                     errors={"pgq_extend": [psycopg.errors.DataError("injected DataError"),
                                            RuntimeError("injected RuntimeError")]})
    w.register(queue, slow)
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: seen and not job_rows(admin, queue), 20, "the ack")
        r.stop()
    (first, last, lost), = seen
    extends = w.sent("pgq_extend")
    # 3 s at a period of 0.5 s: about 6 extends, the first two failing
    assert extends >= 3 and last > first and not lost, (extends, first, last)
    text = "\n".join(caplog.messages)
    assert "injected DataError" in text and "injected RuntimeError" in text, text


def test_a_slot_survives_errors_of_its_claim_and_ack(app, admin, queue, running, caplog):
    """A claim and two acks raise errors that are not the connection's: the
    claimer and the completer go on, the ack is sent again, the next job is
    done too."""
    ids = pgqueue.push_batch(app, queue, [{"n": 0}, {"n": 1}])
    done: list[str] = []
    w = _FlakyWorker(DSN, concurrency=1, wait=2, reconnect_max_delay=0.5, thread="pgqueue-",
                     errors={"pgq_claim": [psycopg.errors.InternalError_("injected claim error")],
                             "pgq_ack": [psycopg.errors.DataError("injected DataError"),
                                         RuntimeError("injected RuntimeError")]})
    w.register(queue, lambda job: done.append(str(job.id)))
    with caplog.at_level(logging.WARNING, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: not job_rows(admin, queue), 20, "both jobs acked")
        r.stop()
    assert sorted(done) == sorted(str(i) for i in ids)  # each ran once: the acks went through
    assert w.sent("pgq_ack") in (1, 2)  # both jobs in one batch, or one each
    text = "\n".join(caplog.messages)
    assert all(m in text for m in ("injected claim error", "injected DataError",
                                   "injected RuntimeError")), text


def test_shutdown_waits_for_an_ack_in_flight_before_releasing(app, admin, queue, running,
                                                              caplog):
    """The handler is done and its ack on the way (slowed down here) when
    shutdown_timeout runs out: stop() lets the ack finish before it releases
    what is still held, so the job is not given back to run again."""
    job_id = pgqueue.push(app, queue)
    done: list[str] = []
    acking = threading.Event()

    def slow_ack() -> None:
        acking.set()
        time.sleep(1.5)  # the ack's round trip, past the shutdown deadline

    w = _FlakyWorker(DSN, concurrency=1, wait=2, shutdown_timeout=0.5,
                     thread="pgqueue-completer", errors={"pgq_ack": [slow_ack]})
    w.register(queue, lambda job: done.append(str(job.id)))
    with caplog.at_level(logging.INFO, logger="pgqueue.worker"):
        r = running(w)
        assert acking.wait(20)
        r.stop()
        # the slot's thread, if stop() left it behind, sends its ack now
        wait_until(lambda: not any(s.thread.is_alive() for s in w._slots), 10, "the slot to end")
    assert done == [str(job_id)]
    assert job_rows(admin, queue) == [], "the job was released while its ack was in flight"
    assert w.sent("pgq_ack") == 1
    assert not any("answered false" in m or "released 1 job" in m for m in caplog.messages), \
        caplog.messages


def test_an_ack_batch_with_a_fenced_job_acks_the_others_and_reports_it(app, admin, queue,
                                                                      running, caplog):
    """Three jobs end together and go in one pgq_ack_batch; one of them lost
    its lease meanwhile and another worker claimed it.  The other two are
    acked, the fenced one is not (its new holder keeps it), and it is
    reported: an ERROR and job.lease_lost."""
    pgqueue.push_batch(app, queue, [{"n": i} for i in range(3)])
    jobs: dict[int, pgqueue.Job] = {}
    together = threading.Barrier(3)

    def handle(job: pgqueue.Job) -> None:
        jobs[job.payload["n"]] = job
        together.wait(20)
        if job.payload["n"] == 0:
            # its lease runs out, and another worker claims it
            with psycopg.connect(os.environ["PGQ_ADMIN_DSN"], autocommit=True) as other:
                other.execute("UPDATE pgqueue.work_queue SET lock_timeout = now() - interval "
                              "'1 second' WHERE id = %s", [job.id])
                taken = other.execute("SELECT id FROM pgq_claim('intruder', 1, '10 minutes', "
                                      "ARRAY[%s])", [queue]).fetchall()
            assert taken == [(job.id,)]
        together.wait(20)

    w = _FlakyWorker(DSN, concurrency=3, wait=2, complete_interval=1, thread="pgqueue-completer",
                     errors={"pgq_ack_batch": [], "pgq_ack(": []})  # counted, not failed
    w.register(queue, handle)
    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: len(job_rows(admin, queue)) == 1, 20, "two acks")
        r.stop()
    fenced = jobs[0]
    assert [(i, k) for i, _, _, _, k in job_rows(admin, queue)] == [(fenced.id, "intruder")]
    assert (fenced.lease_lost, jobs[1].lease_lost, jobs[2].lease_lost) == (True, False, False)
    # one batch, whose statement fails on purpose (it acked 2 of 3: rolled
    # back), then each job on its own to learn which was not held
    assert (w.tried("pgq_ack_batch"), w.sent("pgq_ack_batch"), w.sent("pgq_ack(")) == (1, 0, 1)
    assert any(str(fenced.id) in m and "no longer held" in m for m in caplog.messages), \
        caplog.messages


def test_shutdown_sends_the_acks_still_waiting_before_the_release(app, admin, queue, running,
                                                                  caplog):
    """Finished jobs wait for their batch (complete_interval 10 s here): stop()
    acks them at once, then releases (nothing: no job is given back)."""
    pgqueue.push_batch(app, queue, [{"n": i} for i in range(5)])
    done: list[str] = []
    w = pgqueue.Worker(DSN, concurrency=5, wait=2, complete_interval=10)
    w.register(queue, lambda job: done.append(str(job.id)))
    with caplog.at_level(logging.DEBUG, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: len(done) == 5, 20, "5 handlers done")
        time.sleep(0.3)
        # not acked yet: still held by the worker
        assert [k for _, _, _, _, k in job_rows(admin, queue)] == [w.lock_key] * 5
        t0 = time.monotonic()
        r.stop()
        took = time.monotonic() - t0
    assert job_rows(admin, queue) == []  # acked, not released
    assert took < 5, f"stop() took {took:.1f}s"
    text = "\n".join(caplog.messages)
    assert f"released 0 job(s) of {w.lock_key} at shutdown" in text, text


def test_a_claim_answer_lost_is_released_once_the_jobs_of_its_key_are_done(app, admin, queue,
                                                                           running, caplog):
    """A claim commits but its answer is lost: the job it took is unknown to the
    worker.  Claims go on under a new key; the old key is released when the
    job still running under it is done (not before: that would give a running
    job away), which gives the lost job back at once (not a lease later)."""
    slow_id = pgqueue.push(app, queue, {"slow": True})
    done: list[tuple[str, int, str]] = []
    started = threading.Event()

    def handle(job: pgqueue.Job) -> None:
        if job.payload.get("slow"):
            started.set()
            time.sleep(2)
        done.append((str(job.id), job.tries, job.lock_key))

    w = _FlakyWorker(DSN, concurrency=2, lease=30, wait=2, thread="pgqueue-claimer",
                     errors={"pgq_claim": [_After(
                         psycopg.OperationalError("injected: the claim's answer was lost"),
                         when=lambda rows: any(not r[2].get("slow") for r in rows))]})
    w.register(queue, handle)
    with caplog.at_level(logging.INFO, logger="pgqueue.worker"):
        r = running(w)
        assert started.wait(20)
        lost_id, next_id = pgqueue.push_batch(app, queue, [{"n": 1}, {"n": 2}])
        wait_until(lambda: not job_rows(admin, queue), 20, "all three acked")
        r.stop()
    first, second = w.lock_keys
    assert second == first + ".1"
    assert sorted(done) == sorted([(str(slow_id), 1, first), (str(next_id), 1, second),
                                   (str(lost_id), 2, second)])
    # released after the slow job's ack, before the lost job's lease ran out
    text = "\n".join(caplog.messages)
    assert f"released 1 job(s) of {first}" in text, text
    assert [i for i, _, _ in done].index(str(lost_id)) > [i for i, _, _ in done].index(
        str(slow_id))


def test_one_claim_takes_the_handlers_that_end_together(app, admin, queue, running, monkeypatch):
    """After a claim that found jobs, the claimer waits up to claim_delay for
    the other handlers to end, so that one claim takes a job for each (not
    one claim per job): counted on the claims the worker sends."""
    pgqueue.push_batch(app, queue, [{"n": i} for i in range(400)])
    wait_until(lambda: admin.execute("SELECT count(*) FROM pgqueue.queue WHERE queue = %s"
                                     " AND state = 'scheduled'", [queue]).fetchone()[0] == 400,
               30, "the backlog scheduled")
    sizes: list[int] = []
    claim = pgqueue.worker._Core._claim

    def counted(conn: Any, args: list[Any], wait: Any) -> list[Any]:
        rows = claim(conn, args, wait)
        if rows:
            assert len(rows) <= args[1] <= 8
            sizes.append(len(rows))
        return rows

    monkeypatch.setattr(pgqueue.worker._Core, "_claim", staticmethod(counted))
    done: list[int] = []
    w = pgqueue.Worker(DSN, concurrency=8, wait=2, claim_delay=0.05)

    def handle(job: pgqueue.Job) -> None:
        time.sleep(0.005 * (job.payload["n"] % 4))  # they end at different times
        done.append(job.payload["n"])

    w.register(queue, handle)
    r = running(w)
    wait_until(lambda: len(done) >= 400, 60, "400 jobs done")
    r.stop()
    assert sorted(done) == list(range(400))
    # 50 claims of 8 at best; one per job without the delay
    assert sum(sizes) == 400 and len(sizes) <= 80, sizes
    with pytest.raises(ValueError, match="claim_delay"):
        pgqueue.Worker(DSN, claim_delay=2)


@pytest.mark.direct_only
def test_a_worker_at_concurrency_16_uses_at_most_three_connections(app, admin, queue, running):
    """Counted in pg_stat_activity by application_name while 16 handlers run
    (the claimer, the completer and the heartbeat).  Not through PgBouncer,
    whose server connections are the pool's, not the worker's."""
    name = f"pgqueue conn test {queue}"
    pgqueue.push_batch(app, queue, [{"n": i} for i in range(48)])
    active = [0, 0]
    lock = threading.Lock()

    def handle(job: pgqueue.Job) -> None:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(1.2)  # the heartbeat (lease 3: every second) extends them
        with lock:
            active[0] -= 1

    w = pgqueue.Worker(DSN, concurrency=16, lease=3, wait=2,
                       connect_kwargs={"application_name": name})
    w.register(queue, handle)
    peak = _peak_sessions(admin, queue, name, running(w))
    assert active[1] == 16, active
    assert 2 <= peak <= 3, peak


def _peak_sessions(admin: psycopg.Connection, queue: str, name: str, r: Any) -> int:
    """The most sessions with application_name ``name`` seen in
    pg_stat_activity while ``queue`` has jobs; then the worker ``r`` is stopped."""
    peak = 0
    while job_rows(admin, queue):
        n = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                          [name]).fetchone()[0]
        peak = max(peak, n)
        time.sleep(0.02)
    r.stop()
    return peak


def test_a_stalled_extend_does_not_hold_up_the_other_leases(app, admin, queue, running):
    """Extends time out (statement_timeout), so one job's stalled extend (its row
    locked) does not stop the other job's lease from being extended."""
    stuck, other = pgqueue.push_batch(app, queue, [{"n": 0}, {"n": 1}])
    started = {}
    changes: dict[str, list[float]] = collections.defaultdict(list)
    results = {}

    def handle(job: pgqueue.Job) -> None:
        started[str(job.id)] = True
        last = job.lock_timeout
        end = time.monotonic() + 5.5
        while time.monotonic() < end:
            if job.lock_timeout != last:
                last = job.lock_timeout
                changes[str(job.id)].append(time.monotonic())
            time.sleep(0.02)
        results[str(job.id)] = job.lease_lost

    w = pgqueue.Worker(DSN, concurrency=2, lease=3, wait=2)
    w.register(queue, handle)
    r = running(w)
    wait_until(lambda: len(started) == 2, 20, "both handlers")
    with psycopg.connect(os.environ["PGQ_ADMIN_DSN"]) as locker:
        locker.execute("SELECT 1 FROM pgqueue.work_queue WHERE id = %s FOR UPDATE", [stuck])
        t0 = time.monotonic()
        time.sleep(3)
        t1 = time.monotonic()
        locker.rollback()
    wait_until(lambda: len(results) == 2 and not job_rows(admin, queue), 20, "the acks")
    r.stop()
    during = [t for t in changes[str(other)] if t0 < t < t1]
    # a period of 1 s: the other job's lease moved on while the first was stuck
    assert len(during) >= 2, (changes, t0, t1)
    assert results == {str(stuck): False, str(other): False}


def _work_table(admin: psycopg.Connection, queue: str) -> str:
    """A table the handlers of ``queue`` write to (role app may insert)."""
    table = f"tx_{queue}"
    admin.execute(f"CREATE TABLE {table} (job uuid PRIMARY KEY, n int)")
    admin.execute(f"GRANT SELECT, INSERT ON {table} TO app")
    return table


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_job_transaction_commits_the_work_with_the_ack(app, admin, queue, running, caplog,
                                                       kind):
    """job.transaction(): the writes and the ack commit together; a block that
    raises commits neither (the job is nacked); a job fenced meanwhile gets
    LeaseLost and commits neither (not nacked: its new holder keeps it).
    (asyncio: an AsyncWorker's async job.transaction(), on an AsyncConnection.)"""
    admin.execute("SELECT pgq_configure(%s, max_tries => 1)", [queue])
    table = _work_table(admin, queue)
    good = pgqueue.push_batch(app, queue, [{"n": i} for i in range(4)])
    bad = pgqueue.push(app, queue, {"n": 10, "fail": True})
    fenced = pgqueue.push(app, queue, {"n": 20, "fence": True})
    raised: dict[str, str] = {}
    lost: list[tuple] = []
    insert = f"INSERT INTO {table} VALUES (%s, %s)"

    def after_the_write(job: pgqueue.Job) -> None:
        if job.payload.get("fail"):
            raise ValueError("failed after the write")
        if job.payload.get("fence"):
            with psycopg.connect(os.environ["PGQ_ADMIN_DSN"], autocommit=True) as other:
                other.execute("UPDATE pgqueue.work_queue SET lock_key = 'intruder' "
                              "WHERE id = %s", [job.id])

    settings = dict(concurrency=3, wait=2, thread="pgqueue-completer",
                    errors={"pgq_ack": [], "pgq_nack": []})  # counted, not failed
    if kind == "threads":
        w: Any = _FlakyWorker(DSN, **settings)

        @w.handler(queue)
        def handle(job: pgqueue.Job) -> None:
            try:
                with job.transaction() as conn:
                    conn.execute(insert, [job.id, job.payload["n"]])
                    after_the_write(job)
            except Exception as err:
                raised[str(job.id)] = type(err).__name__
                raise
    else:
        w = _FlakyAsyncWorker(DSN, **settings)

        @w.handler(queue)
        async def ahandle(job: pgqueue.AsyncJob) -> None:
            try:
                async with job.transaction() as conn:
                    assert isinstance(conn, psycopg.AsyncConnection)
                    await conn.execute(insert, [job.id, job.payload["n"]])
                    after_the_write(job)
            except Exception as err:
                raised[str(job.id)] = type(err).__name__
                raise

    w.on("lease_lost", lambda job, why: lost.append((job.id, why)))
    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        r = running(w)
        wait_until(lambda: [s for _, s, _, _, _ in job_rows(admin, queue)]
                   == ["failed", "scheduled"], 20, "the acks and the nack")
        r.stop()
    written = admin.execute(f"SELECT job FROM {table} ORDER BY job").fetchall()
    assert [j for j, in written] == sorted(good)
    assert [(i, k) for i, _, _, _, k in job_rows(admin, queue)] == [(bad, None),
                                                                   (fenced, "intruder")]
    assert raised == {str(bad): "ValueError", str(fenced): "LeaseLost"}
    # acked in their transactions: the completer sent the nack only
    assert (w.sent("pgq_ack"), w.sent("pgq_nack")) == (0, 1)
    assert any(str(fenced) in m and "lost" in m for m in caplog.messages), caplog.messages
    assert [i for i, _ in lost] == [fenced] and "ack in job.transaction()" in lost[0][1]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_job_transaction_crash_between_the_work_and_the_commit(app, admin, queue, running,
                                                               tmp_path, kind):
    """SIGKILL after the handler wrote, before its transaction (work + ack)
    committed: neither is kept; the job runs again, and its work and ack
    commit once.  (asyncio: an AsyncWorker's async job.transaction().)"""
    table = _work_table(admin, queue)
    job_id = pgqueue.push(app, queue)
    log = str(tmp_path / "tx.log")
    p = _proc(queue, log, *_kind_flag(kind), "--tx-table", table, "--sleep", "60",
              "--lease", "3")
    _kill_when(p, lambda: _lines(log, "written"), "the handler's write")
    wait_until(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE state = "
                                     "'idle in transaction' AND usename = 'app'"
                                     ).fetchone()[0] == 0, 10, "the transaction to end")
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
    assert [i for i, _, _, _, _ in job_rows(admin, queue)] == [job_id]
    tries: list[int] = []
    insert = f"INSERT INTO {table} (job) VALUES (%s)"

    if kind == "threads":
        w: Any = pgqueue.Worker(DSN, concurrency=1, wait=2)

        @w.handler(queue)
        def handle(job: pgqueue.Job) -> None:
            tries.append(job.tries)
            with job.transaction() as conn:
                conn.execute(insert, [job.id])
    else:
        w = pgqueue.AsyncWorker(DSN, concurrency=1, wait=2)

        @w.handler(queue)
        async def ahandle(job: pgqueue.AsyncJob) -> None:
            tries.append(job.tries)
            async with job.transaction() as conn:
                await conn.execute(insert, [job.id])

    r = running(w)
    wait_until(lambda: not job_rows(admin, queue), 30, "the job acked")
    r.stop()
    assert tries == [2]
    assert admin.execute(f"SELECT job FROM {table}").fetchall() == [(job_id,)]


def _kind_flag(kind: str) -> list[str]:
    """worker_proc.py's flag for an AsyncWorker."""
    return ["--async"] if kind == "asyncio" else []


def _proc(queue: str, log: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(HERE, "worker_proc.py"),
                             DSN, queue, log, *args],
                            stderr=open(log + ".stderr", "w"))


def _lines(log: str, word: str) -> list[list[str]]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split()[1:] for line in f if line.split()[:1] == [word]]


def _kill_when(p: subprocess.Popen, cond: Callable[[], Any], what: str) -> None:
    """SIGKILL the worker process once ``cond()`` is true (30 s at most)."""
    try:
        wait_until(cond, 30, what)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        p.kill()


def test_sigkill_mid_job_is_stolen_after_the_lease(app, admin, queue, running, tmp_path):
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(3)])
    log = str(tmp_path / "killed.log")
    p = _proc(queue, log, "--concurrency", "1", "--lease", "2", "--sleep", "60")
    _kill_when(p, lambda: _lines(log, "start"), "the first job to start")
    (victim, tries), = _lines(log, "start")
    assert tries == "1"
    done: list[tuple[str, int]] = []
    w = pgqueue.Worker(DSN, concurrency=2, lease=30, wait=2)
    w.register(queue, lambda job: done.append((str(job.id), job.tries)))
    r = running(w)
    wait_until(lambda: not job_rows(admin, queue), 30, "all jobs acked")
    r.stop()
    assert sorted(done) == sorted([(str(i), 2 if str(i) == victim else 1) for i in ids])


def test_a_crash_between_the_handler_and_the_ack_runs_the_job_again_once(app, admin, queue,
                                                                         running, tmp_path):
    """SIGKILL after the handlers ended, before their acks were sent (they wait
    for the batch: complete_interval 2 s): each job runs again, once.  (The
    killed worker's blocking claim, 10 s, must end with it, or it takes a
    job when the leases run out, and that job runs on try 3.)"""
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(3)])
    log = str(tmp_path / "crash.log")
    p = _proc(queue, log, "--concurrency", "3", "--lease", "6", "--complete-interval", "2")
    _kill_when(p, lambda: len(_lines(log, "done")) == 3, "3 handlers done")
    rows = job_rows(admin, queue)
    assert len(rows) == 3 and all(r[4] is not None for r in rows), "acked before the crash"
    done: list[tuple[str, int]] = []
    w = pgqueue.Worker(DSN, concurrency=2, wait=2)
    w.register(queue, lambda job: done.append((str(job.id), job.tries)))
    r = running(w)
    wait_until(lambda: not job_rows(admin, queue), 30, "all jobs acked")
    r.stop()
    assert sorted(done) == sorted((str(i), 2) for i in ids)


def test_a_killed_worker_leaves_no_waiting_claim_behind(app, admin, queue, tmp_path):
    """SIGKILL while the worker waits for work (a 30 s blocking claim): the
    server notices within a second or so and ends that claim, which would
    otherwise take the next job for a worker that is gone (the job would
    wait out a lease and lose a try)."""
    name = f"pgqueue orphan test {queue}"
    log = str(tmp_path / "orphan.log")

    def claims() -> int:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                             " AND state = 'active' AND query LIKE '%%pgq_claim%%'",
                             [name]).fetchone()[0]

    p = _proc(queue, log, "--wait", "30", "--app-name", name)
    _kill_when(p, claims, "the worker's blocking claim")
    wait_until(lambda: not claims(), 10, "the server to end the dead worker's claim")
    job_id = pgqueue.push(app, queue)
    time.sleep(1)
    assert job_rows(admin, queue) == [(job_id, "scheduled", 0, None, None)]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_sigterm_lets_running_handlers_finish(app, admin, queue, running, tmp_path, kind):
    """(asyncio: an AsyncWorker's run(), its handlers tasks that sleep.)"""
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(10)])
    log = str(tmp_path / "term.log")
    p = _proc(queue, log, *_kind_flag(kind), "--concurrency", "4", "--sleep", "1.5")
    try:
        wait_until(lambda: len(_lines(log, "start")) == 4, 30, "4 running handlers")
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
        took = time.monotonic() - t0
    finally:
        p.kill()
    started = {i for i, _ in _lines(log, "start")}
    finished = {i for i, in _lines(log, "done")}
    assert len(started) == 4 and finished == started
    assert took < 4, f"exit took {took:.1f}s: waiting claims were not cancelled"
    with open(log) as f:
        assert f.read().splitlines()[-1] == "exit"
    with open(log + ".stderr") as f:
        assert "SIGTERM received, stopping" in f.read()
    rows = job_rows(admin, queue)
    assert {str(r[0]) for r in rows} == {str(i) for i in ids} - started
    assert all(r[4] is None and r[2] == 0 for r in rows)  # none held, none tried
    done: list[str] = []
    w = pgqueue.Worker(DSN, concurrency=2, wait=2)
    w.register(queue, lambda job: done.append(str(job.id)))
    r = running(w)
    wait_until(lambda: not job_rows(admin, queue), 30, "the rest done")
    r.stop()
    assert sorted(done + list(started)) == sorted(str(i) for i in ids)


def test_sigterm_past_the_timeout_releases_the_job(app, admin, queue, tmp_path):
    job_id = pgqueue.push(app, queue)
    log = str(tmp_path / "timeout.log")
    p = _proc(queue, log, "--sleep", "60", "--shutdown-timeout", "0.5", "--lease", "600")
    try:
        wait_until(lambda: _lines(log, "start"), 30, "the handler to start")
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 0
    finally:
        p.kill()
    assert not _lines(log, "done")
    # released: claimable at once although its 10-minute lease has not run out
    row = admin.execute("SELECT id, tries FROM pgq_claim('probe', 1, '1 minute', ARRAY[%s])",
                        [queue]).fetchone()
    assert row == (job_id, 2)
    with open(log + ".stderr") as f:
        assert "released 1 job(s)" in f.read()


def test_server_restart_under_a_running_worker(app, admin, queue, running):
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(400)])
    done: list[str] = []

    def handle(job: pgqueue.Job) -> None:
        time.sleep(0.01)
        done.append(str(job.id))

    w = pgqueue.Worker(DSN, concurrency=4, lease=30, wait=5, reconnect_max_delay=1)
    w.register(queue, handle)
    r = running(w)
    wait_until(lambda: len(done) >= 100, 60, "100 jobs done")
    admin.close()
    restart_server()
    assert len(done) < 400, "the restart came too late to test anything"
    wait_until(lambda: len(done) >= 400, 120, "the rest after the restart")
    with psycopg.connect(os.environ["PGQ_ADMIN_DSN"], autocommit=True) as again:
        wait_until(lambda: not job_rows(again, queue), 30, "the last acks")
    r.stop()
    assert sorted(done) == sorted(str(i) for i in ids)


@pytest.mark.direct_only
def test_missing_extension_stops_the_worker_with_a_reason(queue):
    w = pgqueue.Worker(DSN.replace("dbname=pgq_test", "dbname=postgres"), concurrency=1)
    w.register(queue, lambda job: None)
    with pytest.raises(pgqueue.WorkerSetupError, match="pgq_claim"):
        w.run(install_signal_handlers=False)


@pytest.mark.direct_only
def test_start_without_the_extension_says_how_to_fix_it(queue):
    for start in ("run", "start"):
        w = pgqueue.Worker(DSN.replace("dbname=pgq_test", "dbname=postgres"), concurrency=1)
        w.register(queue, lambda job: None)
        try:
            with pytest.raises(pgqueue.WorkerSetupError) as caught:
                if start == "start":
                    w.start()  # raises itself, before any thread starts
                else:
                    w.run(install_signal_handlers=False)
        finally:
            w.stop()
        msg = str(caught.value)
        assert 'database "postgres"' in msg and "CREATE EXTENSION pgqueue" in msg, msg


def test_start_fails_in_bounded_time_where_no_server_listens(queue):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    w = pgqueue.Worker(f"host=127.0.0.1 port={port} dbname=pgq_test user=app", concurrency=2,
                       startup_timeout=1.5, reconnect_max_delay=0.5)
    w.register(queue, lambda job: None)
    t0 = time.monotonic()
    try:
        with pytest.raises(pgqueue.WorkerSetupError, match=r"cannot connect .*attempts.*"
                                                           r"startup_timeout 1\.5s.*port"):
            w.start()
    finally:
        w.stop()
    took = time.monotonic() - t0
    assert 1.4 < took < 4, took
    assert not w.lock_keys  # no slot was started


def test_the_claims_text_parameters_reach_the_server_as_they_were(app):
    """The claim and the acks send their arrays and intervals as text: every
    name comes back as it was (quotes, backslashes, commas, spaces, braces,
    'NULL'), and every interval to the microsecond."""
    names = ["plain", 'a"b', "c\\d", "e,f", " g ", "{h}", "NULL", "", "ü"]
    got = app.execute("SELECT %s::text[]", [pgqueue.worker._text_array(names)]).fetchone()[0]
    assert got == names
    ids = [uuid.uuid4() for _ in range(3)]
    assert app.execute("SELECT %s::uuid[]",
                       [pgqueue.worker._text_array(ids)]).fetchone()[0] == ids
    for seconds in (0, 0.000001, 0.5, 30, 86400 * 3 + 0.25):
        got = app.execute("SELECT %s::interval", [pgqueue.worker._interval(seconds)]).fetchone()[0]
        assert got == timedelta(seconds=seconds), (seconds, got)


def test_format_error_has_type_message_and_traceback_tail():
    def inner() -> None:
        raise KeyError("missing")
    try:
        inner()
    except KeyError as e:
        text = pgqueue.format_error(e)
    first, *rest = text.splitlines()
    assert first == "KeyError: 'missing'"
    assert rest[0] == "Traceback (most recent call last):" and "in inner" in text
    big = RuntimeError("x" * 10000)
    assert len(pgqueue.format_error(big)) <= pgqueue.worker.ERROR_MAX_CHARS
