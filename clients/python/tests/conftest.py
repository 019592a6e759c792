"""Fixtures for the pgqueue client tests.

They run against a real server started by test/clients/run.sh, which passes:
PGQ_DSN (where workers and producers connect: the server, or PgBouncer in
the second pass), PGQ_ADMIN_DSN (a superuser, always straight to the
server), PGQ_PASS (``direct`` or ``pgbouncer``), PGQ_DATA and PGQ_BIN (to
restart the server), PGQ_REPO (the checkout, for examples/).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg
import pytest

import pgqueue

ENV = ("PGQ_DSN", "PGQ_ADMIN_DSN", "PGQ_PASS")
if any(v not in os.environ for v in ENV):
    raise pytest.UsageError("run these tests with test/clients/run.sh (needs "
                            + ", ".join(ENV) + ")")

DSN = os.environ["PGQ_DSN"]
ADMIN_DSN = os.environ["PGQ_ADMIN_DSN"]
PASS = os.environ["PGQ_PASS"]
HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "direct_only: not run in the PgBouncer pass")


@pytest.fixture
def dsn() -> str:
    return DSN


@pytest.fixture
def admin() -> Iterator[psycopg.Connection]:
    """A superuser connection straight to the server (autocommit)."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        yield conn


@pytest.fixture
def app() -> Iterator[psycopg.Connection]:
    """The application's connection (through PgBouncer in that pass)."""
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=None) as conn:
        yield conn


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return "t_" + uuid.uuid4().hex[:12]


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Polls ``cond`` (a test's check, not a worker's) until it is true."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Running:
    """A Worker running in a background thread of the test (an AsyncWorker
    in asyncio.run() there)."""

    def __init__(self, worker: pgqueue.Worker | pgqueue.AsyncWorker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if isinstance(self.worker, pgqueue.AsyncWorker):
                asyncio.run(self.worker.run(install_signal_handlers=False))
            else:
                self.worker.run(install_signal_handlers=False)
        except BaseException as err:  # reported by stop()
            self.error = err

    def stop(self) -> None:
        self.worker.request_stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
def running() -> Iterator[Callable[[Any], Running]]:
    """Start workers in threads; all are stopped when the test ends."""
    started: list[Running] = []

    def start(worker: Any) -> Running:
        r = Running(worker)
        started.append(r)
        return r

    yield start
    for r in started:
        if r.thread.is_alive():
            r.stop()


def job_rows(admin: psycopg.Connection, queue: str) -> list[tuple]:
    """(id, state, tries, last_error, lock_key) of every unfinished job of ``queue``."""
    return admin.execute(
        "SELECT q.id, q.state::text, q.tries, q.last_error, w.lock_key"
        "  FROM pgqueue.queue q LEFT JOIN pgqueue.work_queue w USING (id)"
        " WHERE q.queue = %s ORDER BY q.id", [queue]).fetchall()


@contextmanager
def database_at(admin: psycopg.Connection, version: str) -> Iterator[str]:
    """A database of its own with pgqueue ``version`` installed; yields its
    superuser DSN (straight to the server: PgBouncer serves pgq_test only)."""
    name = f"pgq_old_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE DATABASE {name}")
    try:
        dsn = re.sub(r"dbname=\S+", f"dbname={name}", ADMIN_DSN)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE EXTENSION pgqueue VERSION '{version}'")
        yield dsn
    finally:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def push_takes(admin: psycopg.Connection, arg: str) -> bool:
    """Whether this server's pgq_push and pgq_push_batch take ``arg`` by name
    (``max_tries``, ``after``: pgqueue 1.2)."""
    return admin.execute(
        "SELECT count(*) = 2 FROM pg_catalog.pg_proc"
        " WHERE proname IN ('pgq_push', 'pgq_push_batch') AND %s = ANY (proargnames)", [arg]
    ).fetchone()[0]


def assert_needs_1_2(err: pytest.ExceptionInfo, what: str, have: str) -> None:
    """``err`` is the NeedsNewerExtension of ``what`` on pgqueue ``have``
    (the message names both and says what to run)."""
    msg = str(err.value)
    assert f"{what} needs pgqueue 1.2" in msg, msg
    assert f"this database has pgqueue {have}" in msg, msg
    assert "ALTER EXTENSION pgqueue UPDATE" in msg, msg
    assert isinstance(err.value.__cause__, psycopg.errors.UndefinedFunction)


def assert_cli_needs_1_2(dsn: str, *args: str) -> None:
    """``python3 -m pgqueue --dsn DSN ARGS`` on a pgqueue 1.1 database exits 2
    saying that it needs 1.2 and what to run."""
    out = subprocess.run([sys.executable, "-m", "pgqueue", "--dsn", dsn, *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "needs pgqueue 1.2" in out.stderr and "pgqueue 1.1" in out.stderr, out.stderr
    assert "ALTER EXTENSION pgqueue UPDATE" in out.stderr, out.stderr


def restart_server() -> None:
    """Restart the server under the tests (fast shutdown: sessions are cut)."""
    subprocess.run([os.path.join(os.environ["PGQ_BIN"], "pg_ctl"), "-D",
                    os.environ["PGQ_DATA"], "-m", "fast", "-w", "-t", "60", "restart",
                    "-l", os.path.join(os.path.dirname(os.environ["PGQ_DATA"]),
                                       "server.log")],
                   check=True, stdout=subprocess.DEVNULL)
