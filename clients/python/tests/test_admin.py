"""pgqueue.admin's queue settings: configure, pause, resume."""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import pgqueue
from conftest import DSN, database_at, job_rows, wait_until

OPS_DSN = DSN.replace("user=app", "user=ops")


def test_admin_configure_pause_and_resume(app, admin, queue, running):
    def settings() -> tuple:
        return admin.execute("SELECT weight, max_tries, paused FROM pgqueue.queues "
                             "WHERE queue = %s", [queue]).fetchone()

    def in_flight_cap() -> int:
        return admin.execute("SELECT coalesce(max_in_flight, 0) FROM pgqueue.queues "
                             "WHERE queue = %s", [queue]).fetchone()[0]

    has_retention = admin.execute(
        "SELECT to_regprocedure('pgq_configure(text, int, int, int, boolean, interval)')"
        " IS NOT NULL").fetchone()[0]
    with psycopg.connect(OPS_DSN, autocommit=True, prepare_threshold=None) as ops:
        pgqueue.configure(ops, queue, weight=3, max_in_flight=2, max_tries=7)
        assert settings() == (3, 7, False) and in_flight_cap() == 2
        pgqueue.configure(ops, queue, max_in_flight=0)  # 0 removes the cap; the rest stays
        assert settings() == (3, 7, False) and in_flight_cap() == 0
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            pgqueue.configure(ops, queue, weight=0, max_tries=9)
        assert settings() == (3, 7, False)  # nothing changed
        if has_retention:
            pgqueue.configure(ops, queue, retention=3600)
            pgqueue.configure(ops, queue + "_r", retention="2 days")
            assert admin.execute("SELECT queue, retention FROM pgqueue.queues WHERE queue "
                                 "IN (%s, %s) ORDER BY queue", [queue, queue + "_r"]
                                 ).fetchall() == [(queue, timedelta(hours=1)),
                                                  (queue + "_r", timedelta(days=2))]
        pgqueue.pause(ops, queue)
        assert settings() == (3, 7, True)
        job_id = pgqueue.push(app, queue)
        done: list[str] = []
        w = pgqueue.Worker(DSN, concurrency=1, wait=1)
        w.register(queue, lambda job: done.append(str(job.id)))
        r = running(w)
        time.sleep(2)
        assert done == [] and [s for _, s, _, _, _ in job_rows(admin, queue)] == ["pending"]
        pgqueue.resume(ops, queue)
        assert settings() == (3, 7, False)
        wait_until(lambda: not job_rows(admin, queue), 20, "the job done after resume")
        r.stop()
        assert done == [str(job_id)]
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=None) as app_only:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pgqueue.pause(app_only, queue)


def test_admin_functions_are_exported():
    for name in ("configure", "pause", "resume"):
        assert name in pgqueue.__all__ and getattr(pgqueue, name)
    assert os.path.basename(pgqueue.admin.__file__) == "admin.py"


# --- rate_limit and rate_period (pgqueue 1.2) ----------------------------------

def has_rate_limit(admin: psycopg.Connection) -> bool:
    """Whether this server's pgq_configure takes rate_limit and rate_period (1.2)."""
    return admin.execute(
        "SELECT count(*) = 1 FROM pg_catalog.pg_proc WHERE proname = 'pgq_configure'"
        " AND proargnames @> ARRAY['rate_limit', 'rate_period']").fetchone()[0]


@pytest.fixture
def rate_limits(admin):
    if not has_rate_limit(admin):
        pytest.skip("needs pgqueue 1.2's pgq_configure(..., rate_limit, rate_period), "
                    "which this server's extension does not have yet")


def test_configure_rate_limit(admin, queue, rate_limits):
    def rate() -> tuple:
        return admin.execute("SELECT rate_limit, rate_period, weight FROM pgqueue.queues"
                             " WHERE queue = %s", [queue]).fetchone()

    with psycopg.connect(OPS_DSN, autocommit=True, prepare_threshold=None) as ops:
        pgqueue.configure(ops, queue, rate_limit=5, rate_period=timedelta(minutes=1))
        assert rate() == (5, timedelta(minutes=1), 1)
        pgqueue.configure(ops, queue, weight=2)  # None keeps them
        assert rate() == (5, timedelta(minutes=1), 2)
        pgqueue.configure(ops, queue, rate_period="250 milliseconds")  # an interval's text
        assert rate() == (5, timedelta(milliseconds=250), 2)
        pgqueue.configure(ops, queue, rate_limit=7, rate_period=2.5)  # seconds
        assert rate() == (7, timedelta(seconds=2.5), 2)
        pgqueue.configure(ops, queue, rate_limit=0)  # removes the limit; the period stays
        assert rate() == (0, timedelta(seconds=2.5), 2)
        # out of range: the server's 22023, nothing changed
        for bad in ({"rate_period": "1 month"}, {"rate_period": timedelta(milliseconds=5)},
                    {"rate_period": timedelta(days=1, seconds=1)}, {"rate_period": -1},
                    {"rate_limit": -1}, {"rate_limit": 3, "rate_period": "1 year"}):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                pgqueue.configure(ops, queue, **bad)
            assert rate() == (0, timedelta(seconds=2.5), 2), bad
        # the edges are taken
        pgqueue.configure(ops, queue, rate_limit=1, rate_period=timedelta(milliseconds=10))
        assert rate() == (1, timedelta(milliseconds=10), 2)
        pgqueue.configure(ops, queue, rate_period="1 day")
        assert rate() == (1, timedelta(days=1), 2)
    admin.execute("DELETE FROM pgqueue.queues WHERE queue = %s", [queue])


@pytest.mark.direct_only  # PgBouncer serves pgq_test only
def test_rate_limit_on_pgqueue_1_1_says_what_to_run(admin):
    def needs(err: pytest.ExceptionInfo) -> None:
        msg = str(err.value)
        assert "needs pgqueue 1.2" in msg and "rate_limit" in msg, msg
        assert "this database has pgqueue 1.1" in msg, msg
        assert "ALTER EXTENSION pgqueue UPDATE" in msg, msg
        assert isinstance(err.value.__cause__, psycopg.errors.UndefinedFunction)

    with database_at(admin, "1.1") as dsn:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as old:
            # without them nothing changed: 1.1's pgq_configure is called as before
            pgqueue.configure(old, "q", weight=2, retention=60, rate_limit=None,
                              rate_period=None)
            pgqueue.pause(old, "q")
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.configure(old, "q", weight=3, rate_limit=5)
            needs(err)
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.configure(old, "q", rate_period=timedelta(seconds=1))
            needs(err)
            assert old.execute("SELECT weight, paused, retention FROM pgqueue.queues"
                               " WHERE queue = 'q'").fetchone() == (2, True, timedelta(minutes=1))


def most_in_a_window(times: list, period: float) -> int:
    """The most of ``times`` (seconds) in any half-open window of ``period`` seconds."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + period) for i, t in enumerate(times)),
               default=0)


def test_rate_limited_queue_is_claimed_at_its_rate(app, admin, queue, running, rate_limits):
    """rate_limit 5 per second, 20 jobs: a Worker running 2.5 s gets at least
    5 of them and never more than 5 in a second.

    The server's promise is on the releases into work_queue (the scheduling
    pass's now, work_queue.created): at most 5 in any window of 1 s, checked
    exactly.  The claims follow the releases by a few milliseconds each, not
    always the same few (up to 6 ms seen between one release's claims and the
    next's), so the claims are checked in windows 50 ms shorter: still never
    a sixth.
    """
    lease = 30
    pgqueue.configure(admin, queue, rate_limit=5, rate_period="1 second")
    claimed: list = []
    released: list = []
    lock = threading.Lock()

    def handler(job: pgqueue.Job) -> None:
        # the claim's time by the server's clock: its lease ends lease seconds later
        claimed.append((job.lock_timeout - timedelta(seconds=lease)).timestamp())
        with lock:  # the job is in work_queue until its ack
            released.append(admin.execute(
                "SELECT extract(epoch FROM created)::float8 FROM pgqueue.work_queue"
                " WHERE id = %s", [job.id]).fetchone()[0])

    w = pgqueue.Worker(DSN, concurrency=20, wait=1, lease=lease)
    w.register(queue, handler)
    r = running(w)
    time.sleep(0.5)  # the worker is up and waiting before the jobs come
    pgqueue.push_batch(app, queue, [{"n": n} for n in range(20)])
    time.sleep(2.5)
    r.stop()
    first = min(claimed, default=0)
    seen = (len(claimed), [round(t - first, 4) for t in sorted(claimed)],
            [round(t - first, 4) for t in sorted(released)])
    assert 5 <= len(claimed) <= 15, seen
    assert most_in_a_window(released, 1.0) <= 5, seen
    assert most_in_a_window(claimed, 0.95) <= 5, seen
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])
    admin.execute("DELETE FROM pgqueue.queues WHERE queue = %s", [queue])
