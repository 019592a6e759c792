"""The worker: runs handlers for claimed jobs, N at a time, in threads.

Each slot (thread) has its own connection and lock_key (``host:pid:n``) and
loops: a blocking claim (``pgq_claim(..., wait => ...)``) of one job of the
registered queues, the queue's handler, then ``pgq_ack`` on success or
``pgq_nack`` with the error.  One heartbeat thread with a connection of its
own extends the lease of every running job at a third of the lease.

A handler may be a coroutine function (``async def``), or any function that
returns an awaitable: the awaitable is awaited to completion on an event
loop of the slot's thread (one loop per slot, made on its first such job and
reused), and its outcome counts as a plain handler's would.  The loop runs
only while a handler is awaited.

Failure handling, in short:

* handler raises: nack with ``Type: message`` and the traceback's tail
  (``Retry(delay)`` picks the retry delay);
* lease lost (``pgq_extend`` answered NULL): the result is not acked, and
  this is logged;
* an extension that fails otherwise is logged and tried again a quarter
  period later; each runs with ``statement_timeout`` at ``lease / 6`` (at
  most ``EXTEND_TIMEOUT_MAX``), so a stalled one cannot hold up the others,
  and nothing ends the heartbeat thread but ``stop()``;
* an ack or nack that fails otherwise than by the connection is tried
  ``FINISH_ATTEMPTS`` times, then logged (the lease runs out); nothing ends
  a slot's thread but the worker's stop;
* connection lost: the slot reconnects with exponential backoff and retries
  the ack or nack it was sending (a second ack of a job that was acked
  answers false and changes nothing); a claim whose answer was lost is
  undone at once with ``pgq_release`` of the slot's key;
* SIGTERM/SIGINT (``run()``): no new claims (waiting claims are cancelled),
  running handlers get ``shutdown_timeout`` seconds to finish, then the
  jobs still held are given back with ``pgq_release`` (after any ack or
  nack already sent has been answered, ``FINISH_WAIT`` at most).

Nothing here keeps session state on the server and no statement is prepared
on it unless ``prepare_threshold`` asks for it, so a worker runs unchanged
through PgBouncer in transaction pooling.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
import os
import random
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Optional
from uuid import UUID

import psycopg

from .errors import Retry, WorkerSetupError
from .producer import Delay, as_interval

log = logging.getLogger("pgqueue.worker")

Handler = Callable[["Job"], Any]

# Slot numbers are unique in the process, so that two Worker objects in one
# process never share a lock_key.
_slot_numbers = itertools.count()

_CLAIM = ("SELECT id, queue, payload, tries, version, lock_timeout"
          " FROM pgq_claim(%s, 1, %s, %s, %s)")
_EXTEND = "SELECT pgq_extend(%s, %s, %s)"
# for the extend's transaction only (PgBouncer-safe, unlike a session SET)
_EXTEND_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"
_ACK = "SELECT pgq_ack(%s, %s)"
_NACK = "SELECT pgq_nack(%s, %s, %s, %s)"
_RELEASE = "SELECT pgq_release(%s)"

# Errors that no reconnect will mend: stop the worker and say why.
_SETUP_ERRORS = (psycopg.errors.UndefinedFunction,
                 psycopg.errors.InsufficientPrivilege,
                 psycopg.errors.InvalidParameterValue)

# What start() checks on its first connection: is pgq_claim there, and
# where is the extension (if anywhere)?
_CHECK = ("SELECT current_database(),"
          " to_regprocedure('pgq_claim(text, int, interval, text[], interval)') IS NOT NULL,"
          " (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
          "   WHERE e.extname = 'pgqueue')")


def missing_extension(database: str, schema: Optional[str] = None) -> str:
    """What a worker says when pgq_claim is not there (Node's says the same)."""
    if schema is not None:
        return (f"pgqueue is installed in schema {schema} of database \"{database}\", which "
                f"is not on this connection's search_path (pgq_claim was not found): add "
                f"it to the role's search_path (ALTER ROLE ... SET search_path = ...)")
    return (f"the pgqueue extension is not installed in database \"{database}\" (pgq_claim "
            f"does not exist): run CREATE EXTENSION pgqueue; in that database, or connect "
            f"the worker to the database where it is installed")

#: How much of a traceback goes into the job's last_error.
TRACEBACK_FRAMES = 5
ERROR_MAX_CHARS = 4000

#: The longest an extension may take (statement_timeout), in seconds; it is
#: at most half the heartbeat's period (lease / 6) anyway.
EXTEND_TIMEOUT_MAX = 10.0

#: Attempts at an ack or nack that fails for another reason than the
#: connection (a lost connection is retried until it comes back).
FINISH_ATTEMPTS = 3

#: At shutdown, how long past shutdown_timeout an ack or nack already sent
#: may take before the jobs still held are released anyway, in seconds.
FINISH_WAIT = 10.0


@dataclass
class Job:
    """A claimed job, as a handler sees it."""

    id: UUID
    queue: str
    payload: Any
    tries: int
    """The attempt number: 1 on the first claim."""
    version: int
    lock_timeout: datetime
    """The lease's current deadline (moved on by each extension)."""
    lock_key: str
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lease_lost(self) -> bool:
        """True once an extension found the job no longer held by this worker."""
        return self._lost.is_set()


def format_error(exc: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback, for last_error."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    frames = traceback.format_tb(exc.__traceback__)[-TRACEBACK_FRAMES:]
    text = f"{name}: {exc}\nTraceback (most recent call last):\n" + "".join(frames)
    if len(text) > ERROR_MAX_CHARS:
        text = text[:200] + "\n...\n" + text[-(ERROR_MAX_CHARS - 205):]
    return text.rstrip("\n")


class _Slot:
    """One handler thread: its lock_key, its connection and what it is doing."""

    IDLE, CLAIMING, RUNNING = "idle", "claiming", "running"

    def __init__(self, number: int, lock_key: str, reconnect_max_delay: float) -> None:
        self.number = number
        self.lock_key = lock_key
        self.conn: Optional[psycopg.Connection] = None
        self.state = self.IDLE
        self.lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None
        # set at shutdown when the handler outlived shutdown_timeout: its
        # job is released, so its result must not be acked any more
        self.abandoned = threading.Event()
        # an ack or nack is on its way (set and cleared under lock, with
        # `finished` notified): stop() waits for it before releasing
        self.finishing = False
        self.finished = threading.Condition(self.lock)
        self.backoff = _Backoff(reconnect_max_delay)
        # where the slot's async handlers run (made on the first one)
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    def call(self, handler: Handler, job: "Job") -> Any:
        """``handler(job)``, and when it returns an awaitable, that awaited."""
        result = handler(job)
        if not inspect.isawaitable(result):
            return result
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        try:
            return self.loop.run_until_complete(_awaited(result))
        except asyncio.CancelledError as err:  # a BaseException: make it the job's failure
            raise RuntimeError("the handler's awaitable was cancelled") from err

    def close_loop(self) -> None:
        """Cancel what async handlers left running, then close the loop."""
        loop, self.loop = self.loop, None
        if loop is None:
            return
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class Worker:
    """Runs handlers for the jobs of the queues registered with it.

    >>> w = Worker("dbname=app", concurrency=4)
    >>> @w.handler("emails")
    ... def send(job): ...
    >>> w.run()          # until SIGTERM or SIGINT

    A handler may also be ``async def``: see the module's docstring.

    ``conninfo`` is a libpq connection string (PgBouncer's address works).
    ``concurrency``: handlers that run at once (threads, one connection
    each, plus one for the heartbeat).  ``lease``: seconds a claim holds a
    job; extended every ``lease / 3`` while the handler runs.  ``wait``:
    seconds a claim blocks waiting for work (at most 60: a waiting claim
    holds a snapshot).  ``shutdown_timeout``: seconds running handlers get
    after a stop request.  ``retry_delay``: the nack's ``retry_in`` after a
    handler raised (None: the server's exponential backoff).  ``name``:
    the lock_key prefix, ``host:pid`` by default; slot n's key is
    ``name:n``.  ``prepare_threshold``: psycopg's, None (never prepare on
    the server) by default so that PgBouncer's transaction pooling works.
    ``startup_timeout``: seconds :meth:`start` tries to connect (with
    backoff) before it raises :class:`WorkerSetupError`.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        concurrency: int = 4,
        lease: float = 30.0,
        wait: float = 10.0,
        shutdown_timeout: float = 30.0,
        retry_delay: Optional[Delay] = None,
        name: Optional[str] = None,
        prepare_threshold: Optional[int] = None,
        reconnect_max_delay: float = 10.0,
        connect_kwargs: Optional[Dict[str, Any]] = None,
        startup_timeout: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 < lease <= 7 * 86400:
            raise ValueError("lease must be between 0 and 7 days (seconds)")
        if not 0 < wait <= 60:
            raise ValueError("wait must be more than 0 and at most 60 seconds")
        self.conninfo = conninfo
        self.concurrency = concurrency
        self.lease = lease
        self.wait = wait
        self.shutdown_timeout = shutdown_timeout
        self.retry_delay = as_interval(retry_delay)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.prepare_threshold = prepare_threshold
        self.reconnect_max_delay = reconnect_max_delay
        self.startup_timeout = startup_timeout
        self.connect_kwargs = {"connect_timeout": 10, "application_name": "pgqueue worker"}
        self.connect_kwargs.update(connect_kwargs or {})
        self._handlers: Dict[str, Handler] = {}
        self._slots: List[_Slot] = []
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._fatal: Optional[BaseException] = None
        self._heartbeat: Optional[_Heartbeat] = None
        self._started = False

    # -- registration ---------------------------------------------------------

    def register(self, queue: str, handler: Handler) -> None:
        """Run ``handler(job)`` for the jobs of ``queue``."""
        if self._started:
            raise RuntimeError("register handlers before starting the worker")
        self._handlers[queue] = handler

    def handler(self, queue: str) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register`."""
        def decorate(fn: Handler) -> Handler:
            self.register(queue, fn)
            return fn
        return decorate

    @property
    def lock_keys(self) -> List[str]:
        """The lock_keys of this worker's slots (known once started)."""
        return [s.lock_key for s in self._slots]

    # -- running --------------------------------------------------------------

    def start(self) -> None:
        """Check the setup, then start the slots and the heartbeat in background threads.

        The check connects (retried with backoff for up to ``startup_timeout``
        seconds) and looks for the extension; it raises
        :class:`WorkerSetupError` saying what to fix when the server cannot be
        reached or pgqueue is not installed in the database.  Once started,
        a lost server is waited for (reconnection with backoff).
        """
        if not self._handlers:
            raise WorkerSetupError("no handler registered: call register(queue, fn) first")
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True
        self._check_setup()
        self._heartbeat = _Heartbeat(self)
        self._heartbeat.start()
        for _ in range(self.concurrency):
            n = next(_slot_numbers)
            slot = _Slot(n, f"{self.name}:{n}", self.reconnect_max_delay)
            slot.thread = threading.Thread(target=self._slot_loop, args=(slot,),
                                           name=f"pgqueue-slot-{n}", daemon=True)
            self._slots.append(slot)
        log.info("worker %s: %d slots on queues %s, lease %ss", self.name,
                 self.concurrency, ", ".join(sorted(self._handlers)), self.lease)
        for slot in self._slots:
            assert slot.thread is not None
            slot.thread.start()

    def _check_setup(self) -> None:
        """The first connection, within startup_timeout, and the extension's presence."""
        started = time.monotonic()
        deadline = started + self.startup_timeout
        backoff = _Backoff(self.reconnect_max_delay)
        while True:
            # libpq's connect_timeout is whole seconds, at least 2
            left = max(2, math.ceil(deadline - time.monotonic()))
            timeout = min(int(self.connect_kwargs.get("connect_timeout") or left), left)
            try:
                conn = self._connect(connect_timeout=timeout)
                break
            except psycopg.OperationalError as err:
                if self._stopping.is_set() or time.monotonic() >= deadline:
                    raise WorkerSetupError(
                        f"worker {self.name}: cannot connect to the server "
                        f"({backoff.failures + 1} attempts in "
                        f"{time.monotonic() - started:.1f}s, startup_timeout "
                        f"{self.startup_timeout}s): {' '.join(str(err).split())}: check "
                        f"the host, port and database of the connection string, and that "
                        f"the server is up") from err
                backoff.pause(f"worker {self.name}", "cannot connect", err, self._stopping,
                              limit=deadline - time.monotonic())
        with conn:
            database, found, schema = conn.execute(_CHECK).fetchone()
        if not found:
            raise WorkerSetupError(f"worker {self.name}: {missing_extension(database, schema)}")

    def run(self, install_signal_handlers: bool = True) -> None:
        """Start, then block until SIGTERM/SIGINT (or :meth:`request_stop`), then stop.

        Signal handlers are installed only when called from the main thread.
        Raises :class:`WorkerSetupError` when the worker had to stop because
        of its setup (the extension missing, a privilege lacking).
        """
        previous = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self.start()
            self._stopping.wait()
            self.stop()
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        if isinstance(self._fatal, WorkerSetupError):
            raise self._fatal
        if self._fatal is not None:
            raise WorkerSetupError(str(self._fatal)) from self._fatal

    def _on_signal(self, signum: int, _frame: Any) -> None:
        log.info("worker %s: %s received, stopping", self.name, signal.Signals(signum).name)
        self.request_stop()

    def request_stop(self) -> None:
        """Ask the worker to stop (safe from any thread or a signal handler)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop gracefully and wait: see the module's docstring.  Idempotent."""
        self._stopping.set()
        if self._stopped.is_set():
            return
        deadline = time.monotonic() + self.shutdown_timeout
        # Cancel waiting claims, again while one still waits (a cancel that
        # reached the server just before the claim started does nothing).
        while True:
            alive = [s for s in self._slots if s.thread and s.thread.is_alive()]
            if not alive or time.monotonic() >= deadline:
                break
            for slot in alive:
                self._cancel_claim(slot)
            alive[0].thread.join(min(0.2, max(0.0, deadline - time.monotonic())))
        left = [s for s in self._slots if s.thread and s.thread.is_alive()]
        for slot in left:
            # An ack or nack on its way must land before the release, or the
            # release commits first and a job whose handler succeeded runs
            # again.  Under the slot's lock: once abandoned, it sends no more.
            with slot.lock:
                if not slot.finished.wait_for(lambda: not slot.finishing, FINISH_WAIT):
                    log.error("worker %s: %s: an ack or nack still unanswered after %ss: "
                              "releasing anyway", self.name, slot.lock_key, FINISH_WAIT)
                slot.abandoned.set()
        if left:
            self._release([s.lock_key for s in left])
        if self._heartbeat is not None:
            self._heartbeat.stop()
        for slot in self._slots:
            if slot not in left and slot.conn is not None:
                slot.conn.close()
        self._stopped.set()
        log.info("worker %s stopped", self.name)

    def _cancel_claim(self, slot: _Slot) -> None:
        with slot.lock:
            if slot.state == _Slot.CLAIMING and slot.conn is not None:
                try:
                    slot.conn.cancel()
                except psycopg.Error:
                    pass

    def _release(self, keys: List[str]) -> None:
        """Give back the jobs of slots whose handlers outlived shutdown_timeout."""
        try:
            with self._connect() as conn:
                for key in keys:
                    n = conn.execute(_RELEASE, [key]).fetchone()[0]
                    # none: the slot had just finished its job
                    log.log(logging.WARNING if n else logging.DEBUG,
                            "worker %s: handler still running at shutdown: "
                            "released %d job(s) of %s", self.name, n, key)
        except psycopg.Error as err:
            log.error("worker %s: could not release %s at shutdown (their leases will "
                      "run out instead): %s", self.name, ", ".join(keys), err)

    # -- connections ------------------------------------------------------------

    def _connect(self, **overrides: Any) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, autocommit=True,
                               prepare_threshold=self.prepare_threshold,
                               **{**self.connect_kwargs, **overrides})

    def _reconnect(self, what: str, backoff: "_Backoff",
                   give_up: threading.Event) -> Optional[psycopg.Connection]:
        """A new connection, retried after ``backoff`` pauses.

        Returns None when ``give_up`` is set while it waits.
        """
        while not give_up.is_set():
            try:
                conn = self._connect()
                if backoff.failures:
                    log.info("%s: connected again", what)
                return conn
            except psycopg.OperationalError as err:
                backoff.pause(what, "cannot connect", err, give_up)
        return None

    def _slot_conn(self, slot: _Slot, give_up: threading.Event) -> Optional[psycopg.Connection]:
        if slot.conn is not None and not slot.conn.closed:
            return slot.conn
        conn = self._reconnect(slot.lock_key, slot.backoff, give_up)
        with slot.lock:
            slot.conn = conn
        return conn

    def _drop_conn(self, slot: _Slot) -> None:
        with slot.lock:
            conn, slot.conn = slot.conn, None
        if conn is not None:
            conn.close()

    def _fail(self, err: BaseException) -> None:
        if self._fatal is None:
            self._fatal = err
            log.error("worker %s: stopping: %s", self.name, err)
        self._stopping.set()

    # -- one slot ---------------------------------------------------------------

    def _slot_loop(self, slot: _Slot) -> None:
        try:
            self._slot_jobs(slot)
        finally:
            slot.close_loop()

    def _slot_jobs(self, slot: _Slot) -> None:
        queues = sorted(self._handlers)
        lease = timedelta(seconds=self.lease)
        wait = timedelta(seconds=self.wait)
        claim_lost = False
        while not self._stopping.is_set():
            conn = self._slot_conn(slot, self._stopping)
            if conn is None:
                break
            try:
                if claim_lost:
                    # The last claim's answer never came: it may have taken a
                    # job for this key.  Give any such job back at once.
                    n = conn.execute(_RELEASE, [slot.lock_key]).fetchone()[0]
                    if n:
                        log.info("%s: released %d job(s) claimed before the connection "
                                 "was lost", slot.lock_key, n)
                    claim_lost = False
                with slot.lock:
                    if self._stopping.is_set():
                        break
                    slot.state = _Slot.CLAIMING
                try:
                    row = conn.execute(_CLAIM, [slot.lock_key, lease, queues, wait]).fetchone()
                finally:
                    with slot.lock:
                        slot.state = _Slot.IDLE
            except psycopg.errors.QueryCanceled:
                continue  # stop() cancelled the waiting claim: nothing was claimed
            except _SETUP_ERRORS as err:
                if isinstance(err, psycopg.errors.UndefinedFunction):
                    err = WorkerSetupError(f"{missing_extension(conn.info.dbname)}: {err}")
                self._fail(err)
                break
            except psycopg.OperationalError as err:
                self._drop_conn(slot)
                claim_lost = True
                slot.backoff.pause(slot.lock_key, "connection lost while claiming", err,
                                   self._stopping)
                continue
            except Exception as err:  # not the connection: the slot goes on after a pause
                if not isinstance(err, psycopg.Error):
                    self._drop_conn(slot)
                    claim_lost = True
                slot.backoff.pause(slot.lock_key, f"claim failed: {type(err).__name__}", err,
                                   self._stopping)
                continue
            slot.backoff.reset()
            if row is None:
                continue
            job = Job(id=row[0], queue=row[1], payload=row[2], tries=row[3],
                      version=row[4], lock_timeout=row[5], lock_key=slot.lock_key)
            with slot.lock:
                slot.state = _Slot.RUNNING
            try:
                self._run_job(slot, job)
            except Exception:  # a bug of ours: the slot must not die of it
                log.exception("%s: unexpected error with job %s (its lease will run out)",
                              slot.lock_key, job.id)
            finally:
                with slot.lock:
                    slot.state = _Slot.IDLE

    def _run_job(self, slot: _Slot, job: Job) -> None:
        handler = self._handlers[job.queue]
        assert self._heartbeat is not None
        self._heartbeat.add(job)
        error: Optional[str] = None
        retry_in = self.retry_delay
        try:
            log.debug("%s: job %s of %s, try %d", slot.lock_key, job.id, job.queue, job.tries)
            slot.call(handler, job)
        except Retry as r:
            error, retry_in = f"Retry: {r.message}", r.delay
        except Exception as exc:  # a handler's failure is the job's, not the worker's
            error = format_error(exc)
            log.warning("%s: job %s of %s failed on try %d: %s: %s", slot.lock_key,
                        job.id, job.queue, job.tries, type(exc).__name__, exc)
        finally:
            self._heartbeat.remove(job)
        if slot.abandoned.is_set():
            log.warning("%s: job %s finished after shutdown released it: result dropped",
                        slot.lock_key, job.id)
            return
        if job.lease_lost:
            log.error("%s: lease of job %s was lost while its handler ran: result not %s",
                      slot.lock_key, job.id, "acked" if error is None else "nacked")
            return
        self._finish(slot, job, error, retry_in)

    def _finish(self, slot: _Slot, job: Job, error: Optional[str],
                retry_in: Optional[timedelta]) -> None:
        """Ack (error None) or nack the job, retried across lost connections.

        Any other error is retried FINISH_ATTEMPTS times in all, then logged:
        the job's lease runs out and it runs again.
        """
        resent = False
        failures = 0
        what = "ack" if error is None else "nack"
        while True:
            conn = self._slot_conn(slot, slot.abandoned)
            if conn is None:
                return
            with slot.lock:
                if slot.abandoned.is_set():  # stop() released the job meanwhile
                    log.warning("%s: job %s released at shutdown before its %s was sent",
                                slot.lock_key, job.id, what)
                    return
                slot.finishing = True
            try:
                try:
                    if error is None:
                        answer = conn.execute(_ACK, [job.id, slot.lock_key]).fetchone()[0]
                    else:
                        answer = conn.execute(_NACK, [job.id, slot.lock_key, error,
                                                      retry_in]).fetchone()[0]
                finally:
                    with slot.lock:
                        slot.finishing = False
                        slot.finished.notify_all()
                if error is None:
                    if not answer:
                        log.log(logging.INFO if resent else logging.ERROR,
                                "%s: ack of job %s answered false: %s", slot.lock_key, job.id,
                                "the ack sent before the connection was lost committed"
                                if resent else "the job is no longer held (lease lost)")
                else:
                    if answer is None and not resent:
                        log.error("%s: nack of job %s: the job is no longer held",
                                  slot.lock_key, job.id)
                    elif answer == "failed":
                        log.warning("%s: job %s of %s failed for good after %d tries",
                                    slot.lock_key, job.id, job.queue, job.tries)
                slot.backoff.reset()
                return
            except psycopg.errors.QueryCanceled:
                resent = True  # a stray cancel from stop(): the statement rolled back
            except psycopg.OperationalError as err:
                self._drop_conn(slot)
                resent = True
                slot.backoff.pause(slot.lock_key, f"connection lost finishing job {job.id}",
                                   err, slot.abandoned)
            except Exception as err:
                failures += 1
                if not isinstance(err, psycopg.Error):
                    self._drop_conn(slot)  # who knows what state the connection is in
                    resent = True  # nor whether the statement was sent
                if failures >= FINISH_ATTEMPTS:
                    log.error("%s: could not %s job %s after %d attempts (its lease will run "
                              "out and it will run again): %s: %s", slot.lock_key, what, job.id,
                              failures, type(err).__name__, " ".join(str(err).split()))
                    return
                slot.backoff.pause(slot.lock_key, f"{what} of job {job.id} failed: "
                                   f"{type(err).__name__}", err, slot.abandoned)


class _Heartbeat:
    """Extends the lease of every running job at a third of the lease."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.period = worker.lease / 3
        self.lease = timedelta(seconds=worker.lease)
        # an extension that takes longer is cancelled (and tried again after
        # `retry`): one stalled extension must not hold up the others
        self.timeout = f"{max(1, int(min(self.period / 2, EXTEND_TIMEOUT_MAX) * 1000))}ms"
        self.retry = self.period / 4
        self.due: Dict[UUID, float] = {}
        self.jobs: Dict[UUID, Job] = {}
        self.cond = threading.Condition()
        self.done = threading.Event()
        self.backoff = _Backoff(worker.reconnect_max_delay)
        self.conn: Optional[psycopg.Connection] = None
        self.thread = threading.Thread(target=self._loop, name="pgqueue-heartbeat", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.done.set()
            self.cond.notify()
        self.thread.join(5)
        conn = self.conn
        if conn is not None:
            conn.close()

    def add(self, job: Job) -> None:
        # No wake-up needed: the loop never sleeps longer than a period, and
        # this job is due a full period from now.
        with self.cond:
            self.jobs[job.id] = job
            self.due[job.id] = time.monotonic() + self.period

    def remove(self, job: Job) -> None:
        with self.cond:
            self.jobs.pop(job.id, None)
            self.due.pop(job.id, None)

    def _next_due(self) -> List[Job]:
        """Blocks until some job's extension is due; [] when stopping."""
        with self.cond:
            while not self.done.is_set():
                now = time.monotonic()
                ready = [self.jobs[i] for i, t in self.due.items() if t <= now]
                if ready:
                    return ready
                timeout = min(self.due.values()) - now if self.due else self.period
                self.cond.wait(timeout)
            return []

    def _later(self, jobs: List[Job]) -> None:
        """Try these jobs' extensions again a quarter period from now."""
        with self.cond:
            for job in jobs:
                if job.id in self.due:
                    self.due[job.id] = time.monotonic() + self.retry

    def _drop_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _loop(self) -> None:
        """Until stop(): whatever goes wrong is logged and the loop goes on."""
        while not self.done.is_set():
            jobs: List[Job] = []
            try:
                jobs = self._next_due()
                if jobs:
                    self._extend_all(jobs)
            except Exception as err:  # the heartbeat must not die: every lease hangs on it
                log.exception("heartbeat: unexpected error (going on, on a new connection): %s",
                              err)
                self._drop_conn()
                self._later(jobs)
                self.done.wait(self.retry)

    def _extend(self, conn: psycopg.Connection, job: Job) -> Optional[datetime]:
        with conn.transaction():
            conn.execute(_EXTEND_TIMEOUT, [self.timeout])
            return conn.execute(_EXTEND, [job.id, job.lock_key, self.lease]).fetchone()[0]

    def _extend_all(self, jobs: List[Job]) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = self.worker._reconnect("heartbeat", self.backoff, self.done)
            if self.conn is None:
                return
        for job in jobs:
            try:
                until = self._extend(self.conn, job)
            except psycopg.errors.QueryCanceled as err:
                # statement_timeout: this extension stalled (a lock?); the
                # others go on, this one is tried again soon
                log.warning("heartbeat: extending job %s was cancelled (statement_timeout %s), "
                            "trying again in %.2fs: %s", job.id, self.timeout, self.retry,
                            " ".join(str(err).split()))
                self._later([job])
                continue
            except psycopg.OperationalError as err:
                self._drop_conn()
                self.backoff.pause("heartbeat", "connection lost", err, self.done)
                return  # the jobs left are still due: extended on the new connection
            except Exception as err:
                log.error("heartbeat: extending job %s failed, trying again in %.2fs: %s: %s",
                          job.id, self.retry, type(err).__name__, " ".join(str(err).split()))
                self._later([job])
                if not isinstance(err, psycopg.Error):
                    self._drop_conn()  # who knows what state the connection is in
                    return
                continue
            self.backoff.reset()
            with self.cond:
                if job.id not in self.jobs:
                    continue  # finished meanwhile
                if until is None:
                    job._lost.set()
                    self.jobs.pop(job.id)
                    self.due.pop(job.id)
                    log.error("%s: lease of job %s lost (pgq_extend answered NULL): "
                              "its result will not be acked", job.lock_key, job.id)
                else:
                    job.lock_timeout = until
                    self.due[job.id] = time.monotonic() + self.period


class _Backoff:
    """Exponential backoff with jitter between attempts after a connection failure."""

    FIRST = 0.1

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum
        self.delay = 0.0
        self.failures = 0

    def reset(self) -> None:
        """A statement went through: the next failure starts over."""
        self.delay = 0.0
        self.failures = 0

    def pause(self, who: str, what: str, err: BaseException, give_up: threading.Event,
              limit: Optional[float] = None) -> None:
        """Log the failure, then wait the next delay (or until ``give_up`` is set).

        ``limit``: the longest wait, in seconds.
        """
        self.failures += 1
        self.delay = min(max(self.delay * 2, self.FIRST), self.maximum)
        pause = self.delay * random.uniform(0.5, 1.0)
        if limit is not None:
            pause = max(0.0, min(pause, limit))
        log.warning("%s: %s (failure %d, next try in %.2fs): %s", who, what, self.failures,
                    pause, " ".join(str(err).split()))
        give_up.wait(pause)
