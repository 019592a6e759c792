"""The worker: runs handlers for claimed jobs, N at a time, in threads.

A worker process talks to the server through three threads, each with one
connection, whatever its ``concurrency``:

* the claimer claims for all free handler slots at once
  (``pgq_claim(key, n, ...)``, n = the slots free, never more than can
  start at once), one blocking claim (``wait``) at a time waiting for work,
  and hands the jobs to the slot threads through a local queue;
* the completer acks what finished in the last ``complete_interval``
  seconds in one ``pgq_ack_batch`` (at most ``complete_batch`` jobs), and
  sends the nacks one by one;
* the heartbeat extends the lease of every running job at a third of the
  lease, all of them in one statement.

The slot threads (``concurrency`` of them) run the handlers and hold no
connection.  The worker's lock_key is ``name:n`` (``host:pid:0`` for the
first Worker of a process): one key for all its jobs, so that one
``pgq_ack_batch`` acks them and one ``pgq_release`` at shutdown gives back
what is still held.

A handler may do its writes and ack its job in one transaction:
``with job.transaction() as conn: ...`` runs the block in a transaction on a
connection of a small pool (``transaction_connections``, opened only when
used), then ``pgq_ack`` in the same transaction, and commits: the writes
and the ack commit together or not at all.  When the ack finds the job no
longer held, the transaction is rolled back and :class:`LeaseLost` raised.

A handler may be a coroutine function (``async def``), or any function that
returns an awaitable: the awaitable is awaited to completion on an event
loop of the slot's thread (one loop per slot, made on its first such job and
reused), and its outcome counts as a plain handler's would.  The loop runs
only while a handler is awaited.

Failure handling, in short:

* handler raises: nack with ``Type: message`` and the traceback's tail
  (``Retry(delay)`` picks the retry delay);
* lease lost (``pgq_extend`` answered NULL, or the ack found the job held by
  another claim): the result is not acked, ``job.lease_lost`` turns true and
  an ERROR is logged.  ``pgq_ack_batch`` answers a count only: when it is
  short of the batch (but not 0), the batch is rolled back and each job
  acked on its own, in one statement, to learn which were not held;
* an extension that fails otherwise is logged and tried again a quarter
  period later; each runs with ``statement_timeout`` at ``lease / 6`` (at
  most ``EXTEND_TIMEOUT_MAX``).  When a batch of extensions times out (a
  row locked), each job is extended on its own, and a job whose own
  extension timed out is extended apart, after the others, until one goes
  through: a stalled extension holds up no other lease.  Nothing ends the
  heartbeat thread but ``stop()``;
* an ack or nack that fails otherwise than by the connection is tried
  ``FINISH_ATTEMPTS`` times, then logged (the lease runs out);
* connection lost: each thread reconnects with exponential backoff; the
  completer sends its acks and nacks again (a second ack of a job that was
  acked answers false and changes nothing).  A claim whose answer was lost
  may have taken jobs the worker never heard of: its key is retired (claims
  go on under ``name:n.1``, ``.2`` ...), and released with ``pgq_release``
  as soon as no job the worker knows is held under it, which gives those
  jobs back;
* SIGTERM/SIGINT (``run()``): no new claims (a waiting claim is cancelled),
  running handlers get ``shutdown_timeout`` seconds to finish, the
  completer sends every ack and nack still waiting, then releases what the
  worker's keys still hold (``FINISH_WAIT`` past the deadline at most).

Nothing here keeps session state on the server and no statement is prepared
on it unless ``prepare_threshold`` asks for it, so a worker runs unchanged
through PgBouncer in transaction pooling.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import math
import os
import queue as queuelib
import random
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from uuid import UUID

import psycopg

from .errors import LeaseLost, Retry, WorkerSetupError
from .producer import Delay, as_interval

log = logging.getLogger("pgqueue.worker")

Handler = Callable[["Job"], Any]

# Worker numbers are unique in the process, so that two Worker objects in
# one process never share a lock_key; slot numbers name the slot threads.
_worker_numbers = itertools.count()
_slot_numbers = itertools.count()

_CLAIM = ("SELECT id, queue, payload, tries, version, lock_timeout"
          " FROM pgq_claim(%s, %s::int, %s, %s, %s)")
# For a blocking claim's transaction: the server checks every second that
# the worker is still there, so that a killed worker's waiting claim ends
# instead of taking a job for no one (PgBouncer-safe: transaction-local).
_CLIENT_CHECK = "SELECT set_config('client_connection_check_interval', '1s', true)"
_EXTEND = ("SELECT u.id, pgq_extend(u.id, u.key, %s)"
           " FROM unnest(%s::uuid[], %s::text[]) AS u(id, key)")
# for the extend's transaction only (PgBouncer-safe, unlike a session SET)
_EXTEND_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"
_ACK_BATCH = "SELECT pgq_ack_batch(%s::uuid[], %s)"
_ACK_EACH = "SELECT u.id, pgq_ack(u.id, %s) FROM unnest(%s::uuid[]) AS u(id)"
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

#: At shutdown, how long past shutdown_timeout the completer may take to
#: send what is left and release the keys, in seconds.
FINISH_WAIT = 10.0

#: The most ids pgq_ack_batch takes in one call (and claims in one pgq_claim).
MAX_BATCH = 10000


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
    _pool: Optional["_TxPool"] = field(default=None, repr=False, compare=False)
    _acked: bool = field(default=False, repr=False, compare=False)

    @property
    def lease_lost(self) -> bool:
        """True once an extension or the ack found the job no longer held by this worker."""
        return self._lost.is_set()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """The handler's writes and the job's ack, in one transaction.

        >>> with job.transaction() as conn:
        ...     conn.execute("INSERT INTO bills (order_id) VALUES (%s)", [job.payload["order"]])

        Yields a connection of the worker's transaction pool (at most
        ``transaction_connections``; this waits for one when all are in use)
        in a transaction.  When the block ends without an exception,
        ``pgq_ack`` runs in the same transaction and it commits: the writes
        and the ack commit together, or (an exception, a crash, a lost
        connection) neither does, and the job runs again.  When the ack finds
        the job no longer held (its lease lost to another claim), the
        transaction is rolled back and :class:`LeaseLost` raised.  The worker
        sends no other ack for the job.  Once per job.
        """
        if self._pool is None:
            raise RuntimeError("job.transaction() is for a job a Worker gave to its handler")
        if self._acked:
            raise RuntimeError(f"job {self.id} was acked in a transaction already")
        with self._pool.connection() as conn:
            with conn.transaction():
                yield conn
                if not conn.execute(_ACK, [self.id, self.lock_key]).fetchone()[0]:
                    self._lost.set()
                    raise LeaseLost(f"job {self.id} is no longer held by {self.lock_key} (its "
                                    f"lease was lost): its transaction is rolled back")
            self._acked = True


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


def _oneline(err: BaseException) -> str:
    return " ".join(str(err).split())


class _TxPool:
    """The connections of job.transaction(): at most ``size``, each made when
    first needed and kept while it is healthy and idle."""

    def __init__(self, worker: "Worker", size: int) -> None:
        self.worker = worker
        self.free = threading.BoundedSemaphore(size)
        self.lock = threading.Lock()
        self.idle: List[psycopg.Connection] = []
        self.closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self.free:
            with self.lock:
                conn = self.idle.pop() if self.idle else None
            if conn is None or conn.closed:
                conn = self.worker._connect()
            try:
                yield conn
            finally:
                with self.lock:
                    keep = (not self.closed and not conn.closed and conn.info.transaction_status
                            == psycopg.pq.TransactionStatus.IDLE)
                    if keep:
                        self.idle.append(conn)
                if not keep:
                    conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


class _Slot:
    """One handler thread and its event loop for async handlers."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.thread: Optional[threading.Thread] = None
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


class _Keys:
    """The worker's lock_keys, and how many of its jobs each holds.

    Claims use one key at a time.  When a claim's answer is lost with its
    connection, the claim may have taken jobs the worker never heard of:
    that key is retired, claims go on under the next one, and the retired
    key is released once none of the jobs the worker knows under it is left
    (handlers done, acks and nacks answered).
    """

    def __init__(self, base: str) -> None:
        self.lock = threading.Lock()
        self.base = base
        self.current = base
        self.generation = 0
        self.used = [base]
        # jobs claimed under each key that are not finished yet
        self.held: Dict[str, int] = {base: 0}
        self.retired: List[str] = []

    def claimed(self, key: str, n: int) -> None:
        with self.lock:
            self.held[key] += n

    def finished(self, key: str) -> bool:
        """One job of ``key`` is done with; True when the key may be released now."""
        with self.lock:
            self.held[key] -= 1
            return key in self.retired and self.held[key] == 0

    def retire(self) -> bool:
        """Claims go on under a new key; True when the old one may be released now."""
        with self.lock:
            old = self.current
            self.generation += 1
            self.current = f"{self.base}.{self.generation}"
            self.used.append(self.current)
            self.held[self.current] = 0
            self.retired.append(old)
            return self.held[old] == 0

    def releasable(self) -> bool:
        with self.lock:
            return any(self.held[k] == 0 for k in self.retired)

    def take_releasable(self) -> List[str]:
        """The retired keys none of whose jobs is left: forgotten here, to be released."""
        with self.lock:
            keys = [k for k in self.retired if self.held[k] == 0]
            for k in keys:
                self.retired.remove(k)
                del self.held[k]
            return keys

    def unreleased(self) -> List[str]:
        with self.lock:
            return list(self.held)


class Worker:
    """Runs handlers for the jobs of the queues registered with it.

    >>> w = Worker("dbname=app", concurrency=4)
    >>> @w.handler("emails")
    ... def send(job): ...
    >>> w.run()          # until SIGTERM or SIGINT

    A handler may also be ``async def``: see the module's docstring.

    ``conninfo`` is a libpq connection string (PgBouncer's address works).
    ``concurrency``: handlers that run at once (threads; the worker uses
    three connections whatever this is).  ``lease``: seconds a claim holds a
    job; extended every ``lease / 3`` while the handler runs.  ``wait``:
    seconds a claim blocks waiting for work (at most 60: a waiting claim
    holds a snapshot).  ``shutdown_timeout``: seconds running handlers get
    after a stop request.  ``retry_delay``: the nack's ``retry_in`` after a
    handler raised (None: the server's exponential backoff).
    ``complete_interval``: seconds a finished job may wait for others to be
    acked with (at most ``lease / 3``: its lease is not extended meanwhile);
    ``complete_batch``: the most jobs acked in one call.
    ``transaction_connections``: the most connections :meth:`Job.transaction`
    uses at once (opened when first used).  ``name``: the
    lock_key prefix, ``host:pid`` by default; the worker's key is
    ``name:n``, n numbering the Workers of the process from 0.
    ``prepare_threshold``: psycopg's, None (never prepare on the server) by
    default so that PgBouncer's transaction pooling works.
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
        complete_interval: float = 0.005,
        complete_batch: int = 100,
        transaction_connections: int = 2,
        name: Optional[str] = None,
        prepare_threshold: Optional[int] = None,
        reconnect_max_delay: float = 10.0,
        connect_kwargs: Optional[Dict[str, Any]] = None,
        startup_timeout: float = 30.0,
    ) -> None:
        if not 1 <= concurrency <= MAX_BATCH:
            raise ValueError(f"concurrency must be between 1 and {MAX_BATCH}")
        if not 0 < lease <= 7 * 86400:
            raise ValueError("lease must be between 0 and 7 days (seconds)")
        if not 0 < wait <= 60:
            raise ValueError("wait must be more than 0 and at most 60 seconds")
        if not 0 <= complete_interval <= lease / 3:
            raise ValueError("complete_interval must be between 0 and lease / 3 (seconds)")
        if not 1 <= complete_batch <= MAX_BATCH:
            raise ValueError(f"complete_batch must be between 1 and {MAX_BATCH}")
        if transaction_connections < 1:
            raise ValueError("transaction_connections must be at least 1")
        self.conninfo = conninfo
        self.concurrency = concurrency
        self.lease = lease
        self.wait = wait
        self.shutdown_timeout = shutdown_timeout
        self.retry_delay = as_interval(retry_delay)
        self.complete_interval = complete_interval
        self.complete_batch = complete_batch
        self.transaction_connections = transaction_connections
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.prepare_threshold = prepare_threshold
        self.reconnect_max_delay = reconnect_max_delay
        self.startup_timeout = startup_timeout
        self.connect_kwargs = {"connect_timeout": 10, "application_name": "pgqueue worker"}
        self.connect_kwargs.update(connect_kwargs or {})
        self._handlers: Dict[str, Handler] = {}
        self._slots: List[_Slot] = []
        self._keys: Optional[_Keys] = None
        # jobs claimed and not yet taken by a slot (None: a slot's signal to end)
        self._jobs: "queuelib.SimpleQueue[Optional[Job]]" = queuelib.SimpleQueue()
        # slots with no job (claimed or running): what the next claim may take
        self._free = 0
        self._free_cond = threading.Condition()
        self._claimer: Optional[threading.Thread] = None
        self._claim_conn: Optional[psycopg.Connection] = None
        self._claim_lock = threading.Lock()
        self._claiming = False
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._fatal: Optional[BaseException] = None
        self._heartbeat: Optional[_Heartbeat] = None
        self._completer: Optional[_Completer] = None
        self._tx_pool = _TxPool(self, transaction_connections)
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
    def lock_key(self) -> Optional[str]:
        """The key this worker claims with (known once started)."""
        return self._keys.current if self._keys else None

    @property
    def lock_keys(self) -> List[str]:
        """Every key this worker has claimed with: one, and one more after
        each claim whose answer was lost with its connection."""
        return list(self._keys.used) if self._keys else []

    # -- running --------------------------------------------------------------

    def start(self) -> None:
        """Check the setup, then start the claimer, the completer, the heartbeat
        and the slots in background threads.

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
        self._keys = _Keys(f"{self.name}:{next(_worker_numbers)}")
        self._free = self.concurrency
        self._heartbeat = _Heartbeat(self)
        self._heartbeat.start()
        self._completer = _Completer(self)
        self._completer.start()
        for _ in range(self.concurrency):
            slot = _Slot(next(_slot_numbers))
            slot.thread = threading.Thread(target=self._slot_loop, args=(slot,),
                                           name=f"pgqueue-slot-{slot.number}", daemon=True)
            self._slots.append(slot)
        log.info("worker %s: %d slots on queues %s, lease %ss, lock_key %s", self.name,
                 self.concurrency, ", ".join(sorted(self._handlers)), self.lease,
                 self._keys.current)
        for slot in self._slots:
            assert slot.thread is not None
            slot.thread.start()
        self._claimer = threading.Thread(target=self._claim_loop, name="pgqueue-claimer",
                                         daemon=True)
        self._claimer.start()

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
                        f"{self.startup_timeout}s): {_oneline(err)}: check "
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
        with self._free_cond:
            self._free_cond.notify_all()  # a claimer waiting for a free slot
        # Cancel the waiting claim, again while one still waits (a cancel that
        # reached the server just before the claim started does nothing).
        while self._claimer is not None and self._claimer.is_alive():
            if time.monotonic() >= deadline:
                break
            self._cancel_claim()
            self._claimer.join(min(0.2, max(0.0, deadline - time.monotonic())))
        # Each slot runs the jobs handed to it already, then ends.
        for _ in self._slots:
            self._jobs.put(None)
        for slot in self._slots:
            assert slot.thread is not None
            slot.thread.join(max(0.0, deadline - time.monotonic()))
        left = [s for s in self._slots if s.thread and s.thread.is_alive()]
        if left:
            log.warning("worker %s: %d handler(s) still running after shutdown_timeout "
                        "(%ss): their jobs are released", self.name, len(left),
                        self.shutdown_timeout)
        if self._completer is not None:
            # The acks and nacks still waiting, then the release of what the
            # keys still hold, in this order on one connection.
            self._completer.close(max(0.0, deadline - time.monotonic()) + FINISH_WAIT)
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._tx_pool.close()
        with self._claim_lock:
            conn, self._claim_conn = self._claim_conn, None
        if conn is not None:
            conn.close()
        self._stopped.set()
        log.info("worker %s stopped", self.name)

    def _cancel_claim(self) -> None:
        with self._claim_lock:
            if self._claiming and self._claim_conn is not None:
                try:
                    self._claim_conn.cancel()
                except psycopg.Error:
                    pass

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

    def _fail(self, err: BaseException) -> None:
        if self._fatal is None:
            self._fatal = err
            log.error("worker %s: stopping: %s", self.name, err)
        self._stopping.set()

    # -- the claimer -----------------------------------------------------------

    def _claim_loop(self) -> None:
        try:
            self._claim_jobs()
        except Exception:  # a bug of ours: say so, and stop rather than hang
            log.exception("worker %s: the claimer failed", self.name)
            self._fail(RuntimeError("the claimer failed: see the log"))

    def _claim_conn_again(self, backoff: "_Backoff") -> Optional[psycopg.Connection]:
        conn = self._claim_conn
        if conn is not None and not conn.closed:
            return conn
        conn = self._reconnect("claimer", backoff, self._stopping)
        with self._claim_lock:
            self._claim_conn = conn
        return conn

    def _drop_claim_conn(self) -> None:
        with self._claim_lock:
            conn, self._claim_conn = self._claim_conn, None
        if conn is not None:
            conn.close()

    def _claim_jobs(self) -> None:
        assert self._keys is not None and self._completer is not None
        queues = sorted(self._handlers)
        lease = timedelta(seconds=self.lease)
        wait = timedelta(seconds=self.wait)
        backoff = _Backoff(self.reconnect_max_delay)
        # After a claim that found jobs, the next one does not wait (one
        # statement); after one that found none, it waits for work.
        busy = False
        while not self._stopping.is_set():
            with self._free_cond:
                while self._free == 0 and not self._stopping.is_set():
                    self._free_cond.wait()
                n = self._free
            conn = self._claim_conn_again(backoff)
            if conn is None:
                break
            key = self._keys.current
            try:
                with self._claim_lock:
                    if self._stopping.is_set():
                        break
                    self._claiming = True
                try:
                    rows = self._claim(conn, [key, n, lease, queues], None if busy else wait)
                finally:
                    with self._claim_lock:
                        self._claiming = False
            except psycopg.errors.QueryCanceled:
                continue  # stop() cancelled the waiting claim: nothing was claimed
            except _SETUP_ERRORS as err:
                if isinstance(err, psycopg.errors.UndefinedFunction):
                    err = WorkerSetupError(f"{missing_extension(conn.info.dbname)}: {err}")
                self._fail(err)
                break
            except psycopg.OperationalError as err:
                self._drop_claim_conn()
                self._claim_lost(key)
                backoff.pause("claimer", "connection lost while claiming", err, self._stopping)
                continue
            except Exception as err:  # not the connection: the claimer goes on after a pause
                if not isinstance(err, psycopg.Error):
                    self._drop_claim_conn()
                    self._claim_lost(key)
                backoff.pause("claimer", f"claim failed: {type(err).__name__}", err,
                              self._stopping)
                continue
            backoff.reset()
            busy = bool(rows)
            if not rows:
                continue
            self._keys.claimed(key, len(rows))
            with self._free_cond:
                self._free -= len(rows)
            for row in rows:
                self._jobs.put(Job(id=row[0], queue=row[1], payload=row[2], tries=row[3],
                                   version=row[4], lock_timeout=row[5], lock_key=key,
                                   _pool=self._tx_pool))

    @staticmethod
    def _claim(conn: psycopg.Connection, args: List[Any],
               wait: Optional[timedelta]) -> List[Any]:
        """One claim; a blocking one (``wait``) in a transaction that has the
        server check that the worker is still connected while it waits."""
        if wait is None:
            return conn.execute(_CLAIM, [*args, timedelta(0)]).fetchall()
        with conn.transaction():
            conn.execute(_CLIENT_CHECK)
            return conn.execute(_CLAIM, [*args, wait]).fetchall()

    def _claim_lost(self, key: str) -> None:
        """The claim's answer never came: it may hold jobs for ``key`` that we
        do not know.  Claim under a new key; the old one is released as soon
        as none of the jobs we know under it is left."""
        assert self._keys is not None and self._completer is not None
        now = self._keys.retire()
        log.warning("worker %s: a claim's answer was lost with its connection: claiming as "
                    "%s from now on; %s is released %s", self.name, self._keys.current, key,
                    "at once" if now else "once its jobs are done")
        if now:
            self._completer.wake()

    # -- the slots ----------------------------------------------------------------

    def _slot_loop(self, slot: _Slot) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                try:
                    self._run_job(slot, job)
                finally:
                    with self._free_cond:
                        self._free += 1
                        self._free_cond.notify()
        finally:
            slot.close_loop()

    def _run_job(self, slot: _Slot, job: Job) -> None:
        assert self._heartbeat is not None and self._completer is not None
        handed = False
        try:
            handler = self._handlers[job.queue]
            self._heartbeat.add(job)
            error: Optional[str] = None
            retry_in = self.retry_delay
            try:
                log.debug("slot %d: job %s of %s, try %d", slot.number, job.id, job.queue,
                          job.tries)
                slot.call(handler, job)
            except Retry as r:
                error, retry_in = f"Retry: {r.message}", r.delay
            except Exception as exc:  # a handler's failure is the job's, not the worker's
                error = format_error(exc)
                log.warning("%s: job %s of %s failed on try %d: %s: %s", job.lock_key,
                            job.id, job.queue, job.tries, type(exc).__name__, exc)
            finally:
                self._heartbeat.remove(job)
            if job.lease_lost:
                log.error("%s: lease of job %s was lost while its handler ran: result not %s",
                          job.lock_key, job.id, "acked" if error is None else "nacked")
                return
            if job._acked:  # in the handler's own transaction
                if error is not None:
                    log.warning("%s: job %s raised after its transaction acked it: not nacked",
                                job.lock_key, job.id)
                return
            handed = self._completer.submit(job, error, retry_in)
            if not handed:
                log.warning("%s: job %s finished after shutdown released it: result dropped",
                            job.lock_key, job.id)
        except Exception:  # a bug of ours: the slot must not die of it
            log.exception("%s: unexpected error with job %s (its lease will run out)",
                          job.lock_key, job.id)
        finally:
            if not handed:
                self._completer.forget(job)


class _Completer:
    """Sends the acks (in batches) and nacks of finished jobs, and the releases.

    Acks wait up to ``complete_interval`` for others (or until there are
    ``complete_batch``), then go in one ``pgq_ack_batch`` per lock_key.  At
    shutdown (:meth:`close`) it sends what is left, then releases every key
    of the worker; nothing is taken after that.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        assert worker._keys is not None
        self.keys = worker._keys
        self.interval = worker.complete_interval
        self.batch = worker.complete_batch
        self.cond = threading.Condition()
        # (when it came, job, error or None for an ack, retry_in)
        self.pending: List[Tuple[float, Job, Optional[str], Optional[timedelta]]] = []
        self.closing = False  # close(): send what is left, release, end
        self.closed = False   # nothing more is taken: the keys are (being) released
        self.give_up = threading.Event()  # close() stopped waiting: send no more
        self.backoff = _Backoff(worker.reconnect_max_delay)
        self.conn: Optional[psycopg.Connection] = None
        self.thread = threading.Thread(target=self._loop, name="pgqueue-completer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job, error: Optional[str], retry_in: Optional[timedelta]) -> bool:
        """Ack (error None) or nack the job soon; False once the keys are released."""
        with self.cond:
            if self.closed:
                return False
            self.pending.append((time.monotonic(), job, error, retry_in))
            if len(self.pending) == 1 or len(self.pending) >= self.batch:
                self.cond.notify()
            return True

    def forget(self, job: Job) -> None:
        """A job that gets no ack nor nack (lease lost, result dropped)."""
        if self.keys.finished(job.lock_key):
            self.wake()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def close(self, timeout: float) -> None:
        """Send what is left, release the keys; wait ``timeout`` seconds at most."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.give_up.set()
            with self.cond:
                self.closed = True
                left = len(self.pending)
            log.error("worker %s: acks, nacks and the release still unsent after %.1fs "
                      "(%d job(s) waiting): giving up, their leases will run out",
                      self.worker.name, timeout, left)
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _due(self) -> bool:
        """Under cond: is there something to send now?"""
        return bool(self.pending) and (
            self.closing or len(self.pending) >= self.batch
            or time.monotonic() - self.pending[0][0] >= self.interval)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not (self._due() or self.keys.releasable()
                           or (self.closing and not self.pending)):
                    timeout = (self.pending[0][0] + self.interval - time.monotonic()
                               if self.pending else None)
                    self.cond.wait(timeout)
                done, self.pending = self.pending[:self.batch], self.pending[self.batch:]
                last = self.closing and not self.pending
                if last:
                    self.closed = True
            try:
                if done:
                    self._send(done)
                self._release(self.keys.take_releasable(), "claimed by a claim whose answer "
                              "was lost with its connection")
            except Exception:  # a bug of ours: the completer must not die of it
                log.exception("worker %s: completer: unexpected error (going on)",
                              self.worker.name)
                self._drop_conn()
            if last:
                break
        self._release(self.keys.unreleased(), "still held at shutdown (handlers that "
                      "outlived shutdown_timeout)", shutdown=True)

    # -- sending ------------------------------------------------------------------

    def _send(self, done: List[Tuple[float, Job, Optional[str], Optional[timedelta]]]) -> None:
        acks: Dict[str, List[Job]] = {}
        for _, job, error, retry_in in done:
            if error is None:
                acks.setdefault(job.lock_key, []).append(job)
            else:
                self._nack(job, error, retry_in)
        for key, jobs in acks.items():
            self._ack(key, jobs)

    def _ack(self, key: str, jobs: List[Job]) -> None:
        what = f"ack of {len(jobs)} job(s)" if len(jobs) > 1 else f"ack of job {jobs[0].id}"
        sent, held, resent = self._call(what, lambda conn: self._ack_batch(conn, key, jobs))
        for job in jobs:
            if sent and not held.get(job.id, False):
                if resent:
                    log.info("%s: ack of job %s answered false after a resend: the first "
                             "ack probably committed before the connection was lost", key,
                             job.id)
                else:
                    job._lost.set()
                    log.error("%s: ack of job %s answered false: the job is no longer held "
                              "(lease lost): not acked", key, job.id)
            self.forget(job)

    @staticmethod
    def _ack_batch(conn: psycopg.Connection, key: str, jobs: List[Job]) -> Dict[UUID, bool]:
        """{id: acked} for the jobs; exact, although pgq_ack_batch answers a count."""
        ids = [job.id for job in jobs]
        if len(ids) == 1:
            n = conn.execute(_ACK_BATCH, [ids, key]).fetchone()[0]
            return {ids[0]: n == 1}
        with conn.transaction():
            n = conn.execute(_ACK_BATCH, [ids, key]).fetchone()[0]
            if 0 < n < len(ids):
                raise psycopg.Rollback()  # which were not held? ask each, below
        if n in (0, len(ids)):
            return dict.fromkeys(ids, n == len(ids))
        return dict(conn.execute(_ACK_EACH, [key, ids]).fetchall())

    def _nack(self, job: Job, error: str, retry_in: Optional[timedelta]) -> None:
        sent, answer, resent = self._call(
            f"nack of job {job.id}",
            lambda conn: conn.execute(_NACK, [job.id, job.lock_key, error,
                                              retry_in]).fetchone()[0])
        if sent and answer is None and not resent:
            job._lost.set()
            log.error("%s: nack of job %s: the job is no longer held", job.lock_key, job.id)
        elif answer == "failed":
            log.warning("%s: job %s of %s failed for good after %d tries", job.lock_key,
                        job.id, job.queue, job.tries)
        self.forget(job)

    def _call(self, what: str,
              send: Callable[[psycopg.Connection], Any]) -> Tuple[bool, Any, bool]:
        """``send(conn)``, retried across lost connections: (sent, its answer, resent).

        ``resent``: sent again after a lost connection (the first may have
        committed).  Any other error is retried FINISH_ATTEMPTS times in all,
        then logged and given up (sent False): the jobs' leases run out and
        they run again.
        """
        resent = False
        failures = 0
        while True:
            conn = self._connection()
            if conn is None:
                log.error("worker %s: %s not sent (stopped waiting for the server): the "
                          "leases will run out", self.worker.name, what)
                return False, None, resent
            try:
                answer = send(conn)
                self.backoff.reset()
                return True, answer, resent
            except psycopg.OperationalError as err:
                self._drop_conn()
                resent = True
                self.backoff.pause("completer", f"connection lost sending the {what}", err,
                                   self.give_up)
            except Exception as err:
                failures += 1
                if not isinstance(err, psycopg.Error):
                    self._drop_conn()  # who knows what state the connection is in
                    resent = True  # nor whether the statement was sent
                if failures >= FINISH_ATTEMPTS:
                    log.error("worker %s: could not send the %s after %d attempts (the "
                              "leases will run out and the jobs run again): %s: %s",
                              self.worker.name, what, failures, type(err).__name__,
                              _oneline(err))
                    return False, None, resent
                self.backoff.pause("completer", f"{what} failed: {type(err).__name__}", err,
                                   self.give_up)

    def _release(self, keys: List[str], why: str, shutdown: bool = False) -> None:
        for key in keys:
            sent, n, _ = self._call(f"release of {key}",
                                    lambda conn: conn.execute(_RELEASE, [key]).fetchone()[0])
            if not sent:
                continue
            log.log(logging.WARNING if n else logging.DEBUG,
                    "worker %s: released %d job(s) of %s %s", self.worker.name, n, key,
                    why if n or not shutdown else "at shutdown")

    def _connection(self) -> Optional[psycopg.Connection]:
        if self.conn is None or self.conn.closed:
            self.conn = self.worker._reconnect("completer", self.backoff, self.give_up)
        return self.conn

    def _drop_conn(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class _Heartbeat:
    """Extends the lease of every running job at a third of the lease."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.period = worker.lease / 3
        self.lease = timedelta(seconds=worker.lease)
        # an extension that takes longer is cancelled (and tried again after
        # `retry`): one stalled extension must not hold up the others
        self.timeout = max(0.001, min(self.period / 2, EXTEND_TIMEOUT_MAX))
        self.retry = self.period / 4
        self.due: Dict[UUID, float] = {}
        self.jobs: Dict[UUID, Job] = {}
        # jobs whose extension timed out: extended on their own, after the others
        self.apart: set = set()
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
            self.apart.discard(job.id)

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

    def _extend(self, conn: psycopg.Connection, jobs: List[Job],
                timeout: float) -> Dict[UUID, Optional[datetime]]:
        """One round of extensions in one statement: {id: new deadline or None}."""
        with conn.transaction():
            conn.execute(_EXTEND_TIMEOUT, [f"{max(1, int(timeout * 1000))}ms"])
            rows = conn.execute(_EXTEND, [self.lease, [j.id for j in jobs],
                                          [j.lock_key for j in jobs]]).fetchall()
        return dict(rows)

    def _extend_all(self, jobs: List[Job]) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = self.worker._reconnect("heartbeat", self.backoff, self.done)
            if self.conn is None:
                return
        with self.cond:
            together = [j for j in jobs if j.id not in self.apart]
            apart = [j for j in jobs if j.id in self.apart]
        # the jobs in one statement (each on its own when it stalls), then
        # those seen stalled, one by one
        if together and not self._try(together, self.timeout):
            return
        self._try_each(apart)

    def _try_each(self, jobs: List[Job]) -> bool:
        """Each job in a statement of its own, with half the timeout (its row
        is locked, or may be); False when the connection is gone."""
        for job in jobs:
            if not self._try([job], self.timeout / 2):
                return False
        return True

    def _try(self, jobs: List[Job], timeout: float) -> bool:
        """Extends ``jobs`` in one statement; False when the connection is gone
        (the rest waits for the next round), True otherwise.  A job whose
        extension timed out alone is set apart; a batch that timed out is
        tried again one by one."""
        assert self.conn is not None
        try:
            answers = self._extend(self.conn, jobs, timeout)
        except psycopg.errors.QueryCanceled as err:
            # statement_timeout: a row locked?  The others go on.
            if len(jobs) > 1:
                log.warning("heartbeat: extending %d jobs at once was cancelled "
                            "(statement_timeout %.3fs): extending each on its own",
                            len(jobs), timeout)
                return self._try_each(jobs)
            log.warning("heartbeat: extending job %s was cancelled (statement_timeout %.3fs), "
                        "trying again in %.2fs: %s", jobs[0].id, timeout, self.retry,
                        _oneline(err))
            with self.cond:
                self.apart.update(j.id for j in jobs if j.id in self.jobs)
            self._later(jobs)
            return True
        except psycopg.OperationalError as err:
            self._drop_conn()
            self.backoff.pause("heartbeat", "connection lost", err, self.done)
            return False  # the jobs left are still due: extended on the new connection
        except Exception as err:
            log.error("heartbeat: extending %s failed, trying again in %.2fs: %s: %s",
                      f"job {jobs[0].id}" if len(jobs) == 1 else f"{len(jobs)} jobs",
                      self.retry, type(err).__name__, _oneline(err))
            self._later(jobs)
            if not isinstance(err, psycopg.Error):
                self._drop_conn()  # who knows what state the connection is in
                return False
            return True
        self.backoff.reset()
        for job in jobs:
            self._extended(job, answers.get(job.id))
        return True

    def _extended(self, job: Job, until: Optional[datetime]) -> None:
        with self.cond:
            if job.id not in self.jobs:
                return  # finished meanwhile
            self.apart.discard(job.id)
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
                    pause, _oneline(err))
        give_up.wait(pause)
