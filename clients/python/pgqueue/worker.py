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

Handlers are plain functions here (an ``async def`` handler is refused at
registration: :class:`pgqueue.AsyncWorker` runs those, as tasks on the
caller's event loop, with the same claimer, completer and heartbeat
threads).  Each handler may have options (``register(queue, fn,
concurrency=, timeout=, retry=)``):

* ``concurrency``: at most that many jobs of the queue claimed or running at
  once.  Without any such limit the claimer makes one claim over all the
  queues; with limits, a round of claims that do not wait (one over the
  unlimited queues for every free slot, and one per limited queue with
  room, for no more than its room and the slots left; the unlimited
  queues' first in one round, last in the next, so that neither starves
  the other), and when all came back empty one blocking claim over the
  queues with room, for no more than the smallest room among them: never
  more jobs than can start;
* ``timeout``: a handler that runs longer has its job nacked
  (``TimeoutError``), its lease no longer extended; here its thread is
  abandoned (a new thread takes the slot) and whatever it returns later is
  dropped (its ``job.transaction()`` raises :class:`LeaseLost`);
* ``retry``: ``retry(tries)`` gives the nack's ``retry_in`` after a failure
  (a ``Retry(delay)`` raised by the handler still wins).

``worker.on(event, callback)`` calls back on ``started``, ``stopped``,
``job_started``, ``job_succeeded`` (after the ack), ``job_failed`` (after the
nack), ``lease_lost`` (see EVENTS); a callback that raises is logged.  Here
callbacks run in the worker's threads, where the event happens (a job's
ack and nack: the completer's, so keep them short); an AsyncWorker's run on
its event loop.

Failure handling, in short:

* handler raises: nack with ``Type: message`` and the traceback's tail
  (``Retry(delay)`` picks the retry delay), and a WARNING logged (which
  Python's last-resort handler prints to stderr when logging is not
  configured);
* handler returns an awaitable (a plain function that calls a coroutine
  function, not detectable at registration): it is closed unawaited and the
  job nacked with a ``TypeError``, never acked;
* lease lost (``pgq_extend`` answered NULL, or the ack found the job held by
  another claim): the result is not acked, ``job.lease_lost`` turns true and
  an ERROR is logged.  ``pgq_ack_batch`` answers a count only: when it is
  short of the batch, its statement fails on purpose, which rolls the batch
  back, and each job is acked on its own, in one statement, to learn which
  were not held (as the Node worker does);
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
import functools
import inspect
import itertools
import logging
import math
import os
import queue as queuelib
import random
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import (Any, AsyncIterator, Callable, Dict, Iterable, Iterator, List, Optional,
                    Tuple, Type)
from uuid import UUID

import psycopg

from .errors import LeaseLost, Retry, WorkerSetupError
from .producer import Delay, as_interval

log = logging.getLogger("pgqueue.worker")

Handler = Callable[["Job"], Any]
#: A handler's retry policy: the attempt number (``job.tries``, 1 on the
#: first) to the nack's retry_in (seconds, a timedelta, or None for the
#: server's backoff).
RetryPolicy = Callable[[int], Optional[Delay]]

#: What :meth:`Worker.on` calls back on, and with what arguments:
#: started (), stopped (the error that stopped the worker, or None),
#: job_started (job), job_succeeded (job, seconds), job_failed (job, seconds,
#: exception), lease_lost (job, why).
EVENTS = ("started", "stopped", "job_started", "job_succeeded", "job_failed", "lease_lost")


@dataclass(frozen=True)
class _Spec:
    """A registered handler and its options."""

    fn: Handler
    concurrency: Optional[int] = None
    timeout: Optional[float] = None
    retry: Optional[RetryPolicy] = None


def is_async_callable(fn: Any) -> bool:
    """True for a coroutine function, a callable object whose ``__call__`` is
    one, and a functools.partial of either."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isroutine(fn) and inspect.iscoroutinefunction(getattr(fn, "__call__", None)))


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _discard(awaitable: Any) -> None:
    """Close a coroutine (or cancel a future) that will not be awaited."""
    close = getattr(awaitable, "close", None) or getattr(awaitable, "cancel", None)
    if close is not None:
        close()


# Guards Job._ended and Job._lost's first setting (brief, rare contention).
_end_lock = threading.Lock()

# Worker numbers are unique in the process, so that two Worker objects in
# one process never share a lock_key; slot numbers name the slot threads.
_worker_numbers = itertools.count()
_slot_numbers = itertools.count()

# The claim and the acks run for every job: their parameters go as text
# with casts in the statement (see _text_array, _interval), which psycopg
# sends as they are instead of finding and running a dumper for each value
# (about a third of the claim's CPU in the client).
_CLAIM = ("SELECT id, queue, payload, tries, version, lock_timeout"
          " FROM pgq_claim(%s::text, %s::int, %s::interval, %s::text[], %s::interval)")
# For a blocking claim's transaction: the server checks every second that
# the worker is still there, so that a killed worker's waiting claim ends
# instead of taking a job for no one (PgBouncer-safe: transaction-local).
_CLIENT_CHECK = "SELECT set_config('client_connection_check_interval', '1s', true)"
_EXTEND = ("SELECT u.id, pgq_extend(u.id, u.key, %s)"
           " FROM unnest(%s::uuid[], %s::text[]) AS u(id, key)")
# for the extend's transaction only (PgBouncer-safe, unlike a session SET)
_EXTEND_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"
# pgq_ack_batch answers how many of the jobs it acked.  When that is fewer
# than it was given, the statement fails on purpose (with this text in the
# server's log), which rolls the acks back, and _ACK_EACH says which job was
# not held: one statement, as the Node worker's ACK_BATCH.
_ACK_BATCH = ("SELECT CASE WHEN a.n = cardinality(%(ids)s::uuid[]) THEN a.n"
              " ELSE ('pgqueue worker: ' || (cardinality(%(ids)s::uuid[]) - a.n)"
              " || ' of the batch no longer held by ' || %(key)s::text"
              " || ', acking one by one')::int END"
              " FROM (SELECT pgq_ack_batch(%(ids)s::uuid[], %(key)s::text) AS n OFFSET 0) a")
_ACK_EACH = "SELECT u.id, pgq_ack(u.id, %s::text) FROM unnest(%s::uuid[]) AS u(id)"
_ACK = "SELECT pgq_ack(%s, %s)"
_NACK = "SELECT pgq_nack(%s, %s, %s, %s)"
_RELEASE = "SELECT pgq_release(%s)"


def _text_array(items: Iterable[Any]) -> str:
    """A text[] literal of ``items`` (each quoted, so any text is kept as it is)."""
    return "{" + ",".join('"' + str(i).replace("\\", "\\\\").replace('"', '\\"') + '"'
                          for i in items) + "}"


def _interval(seconds: float) -> str:
    """An interval literal of ``seconds`` (to the microsecond)."""
    return f"{seconds:.6f} seconds"


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
    _worker: Optional["_Core"] = field(default=None, repr=False, compare=False)
    _acked: bool = field(default=False, repr=False, compare=False)
    # how the job's run ended: None while it runs, "returned" (its handler
    # returned, or its transaction is acking it), "timeout", "shutdown"
    _ended: Optional[str] = field(default=None, repr=False, compare=False)
    _started: float = field(default=0.0, repr=False, compare=False)
    _duration: float = field(default=0.0, repr=False, compare=False)
    _exc: Optional[BaseException] = field(default=None, repr=False, compare=False)

    @property
    def lease_lost(self) -> bool:
        """True once an extension or the ack found the job no longer held by this worker."""
        return self._lost.is_set()

    def _set_lost(self) -> bool:
        """lease_lost turns true: True the first time."""
        with _end_lock:
            first = not self._lost.is_set()
            self._lost.set()
        return first

    def _end(self, why: str) -> bool:
        """The first end of the job's run wins: True when ``why`` is (or was) it."""
        with _end_lock:
            if self._ended is None:
                self._ended = why
            return self._ended == why

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
        transaction is rolled back and :class:`LeaseLost` raised; the same,
        without an ack, once the handler's ``timeout`` has ended the job.
        The worker sends no other ack for the job.  Once per job.
        """
        worker = self._tx_worker()
        with worker._tx_pool.connection() as conn:
            with conn.transaction():
                yield conn
                self._tx_before_ack()
                self._tx_acked(conn.execute(_ACK, [self.id, self.lock_key]).fetchone()[0])
            self._acked = True

    # The steps of transaction() that are not I/O, shared with AsyncJob's.

    def _tx_worker(self) -> "_Core":
        if self._worker is None:
            raise RuntimeError("job.transaction() is for a job a Worker gave to its handler")
        if self._acked:
            raise RuntimeError(f"job {self.id} was acked in a transaction already")
        if self._ended not in (None, "returned"):
            raise self._ended_elsewhere()
        return self._worker

    def _tx_before_ack(self) -> None:
        """From here on the job is the transaction's to end (a timeout no longer can)."""
        if not self._end("returned"):
            raise self._ended_elsewhere()

    def _tx_acked(self, held: bool) -> None:
        if not held:
            assert self._worker is not None
            self._worker._lose(self, "its ack in job.transaction() answered false: another "
                                     "worker took it, or it was cancelled")
            raise LeaseLost(f"job {self.id} is no longer held by {self.lock_key} (its "
                            f"lease was lost): its transaction is rolled back")

    def _ended_elsewhere(self) -> LeaseLost:
        why = ("its handler ran longer than its timeout and the job was nacked"
               if self._ended == "timeout" else "the worker gave it up at shutdown")
        return LeaseLost(f"job {self.id} is no longer this worker's ({why}): its "
                         f"transaction is rolled back, not acked")


def format_error(exc: BaseException) -> str:
    """``Type: message`` and the last frames of the traceback, for last_error."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    return _error_text(f"{name}: {exc}", "Traceback",
                       traceback.format_tb(exc.__traceback__))


def _error_text(head: str, title: str, frames: List[str]) -> str:
    """``head``, then the last frames under ``title``, at most ERROR_MAX_CHARS."""
    frames = frames[-TRACEBACK_FRAMES:]
    text = head
    if frames:
        text += f"\n{title} (most recent call last):\n" + "".join(frames)
    if len(text) > ERROR_MAX_CHARS:
        text = text[:200] + "\n...\n" + text[-(ERROR_MAX_CHARS - 205):]
    return text.rstrip("\n")


def _oneline(err: BaseException) -> str:
    return " ".join(str(err).split())


class _TxPool:
    """The connections of job.transaction(): at most ``size``, each made when
    first needed and kept while it is healthy and idle.  A Worker's are
    psycopg connections (:meth:`connection`), an AsyncWorker's async ones
    (:meth:`aconnection`, opened on its event loop)."""

    def __init__(self, worker: "_Core", size: int) -> None:
        self.worker = worker
        self.size = size
        self.free = threading.BoundedSemaphore(size)
        self.afree: Any = None  # asyncio.Semaphore, made on the loop when first used
        self.lock = threading.Lock()
        self.idle: List[Any] = []
        self.closed = False

    def _take(self) -> Any:
        """An idle connection that is still open, or None."""
        with self.lock:
            conn = self.idle.pop() if self.idle else None
        return None if conn is None or conn.closed else conn

    def _keep(self, conn: Any) -> bool:
        """Back to the idle ones when healthy and idle: False when it must be closed."""
        with self.lock:
            keep = (not self.closed and not conn.closed and conn.info.transaction_status
                    == psycopg.pq.TransactionStatus.IDLE)
            if keep:
                self.idle.append(conn)
        return keep

    def _close_all(self) -> List[Any]:
        """No more keeping: the idle connections, to be closed."""
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        return idle

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self.free:
            conn = self._take()
            if conn is None:
                conn = self.worker._connect()
            try:
                yield conn
            finally:
                if not self._keep(conn):
                    conn.close()

    @contextlib.asynccontextmanager
    async def aconnection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if self.afree is None:
            self.afree = asyncio.Semaphore(self.size)
        async with self.afree:
            conn = self._take()
            if conn is None:
                conn = await self.worker._aconnect()
            try:
                yield conn
            finally:
                if not self._keep(conn):
                    await conn.close()

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        for conn in self._close_all():
            conn.close()

    async def aclose(self) -> None:
        for conn in self._close_all():
            await conn.close()


class _Slot:
    """One handler thread (a new one when a handler outlives its timeout)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.thread: Optional[threading.Thread] = None


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


class _Core:
    """What Worker and AsyncWorker share: the settings, the handlers and their
    options, the events, the claimer, the completer, the heartbeat and what
    happens when a job's run ends.  How handlers run is the subclass's."""

    #: the class of the jobs handed to handlers
    _job_class: Type[Job] = Job

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
        claim_delay: float = 0.002,
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
        if not 0 <= claim_delay <= 1:
            raise ValueError("claim_delay must be between 0 and 1 (seconds)")
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
        self.claim_delay = claim_delay
        self.transaction_connections = transaction_connections
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.prepare_threshold = prepare_threshold
        self.reconnect_max_delay = reconnect_max_delay
        self.startup_timeout = startup_timeout
        self.connect_kwargs = {"connect_timeout": 10, "application_name": "pgqueue worker"}
        self.connect_kwargs.update(connect_kwargs or {})
        self._specs: Dict[str, _Spec] = {}
        self._listeners: Dict[str, List[Callable[..., Any]]] = {e: [] for e in EVENTS}
        self._keys: Optional[_Keys] = None
        # slots with no job (claimed or running): what the next claim may take
        self._free = 0
        # the queues with a concurrency of their own: their limit, and their
        # jobs claimed or running (under _free_cond)
        self._limits: Dict[str, int] = {}
        self._busy: Dict[str, int] = {}
        self._unlimited: List[str] = []
        self._limited_first = False
        self._free_cond = threading.Condition()
        self._claimer: Optional[threading.Thread] = None
        self._claim_conn: Optional[psycopg.Connection] = None
        self._claim_lock = threading.Lock()
        self._claiming = False
        # the queues of the claim that waits for work, while it waits
        self._waiting_on: Optional[frozenset] = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._fatal: Optional[BaseException] = None
        self._heartbeat: Optional[_Heartbeat] = None
        self._completer: Optional[_Completer] = None
        self._tx_pool = _TxPool(self, transaction_connections)
        self._started = False
        self._launched = False
        self._init_runner()

    def _init_runner(self) -> None:
        """The subclass's own attributes (what runs the handlers)."""

    # -- registration ---------------------------------------------------------

    def register(self, queue: str, handler: Handler, *, concurrency: Optional[int] = None,
                 timeout: Optional[float] = None, retry: Optional[RetryPolicy] = None) -> None:
        """Run ``handler(job)`` for the jobs of ``queue``.

        ``concurrency``: at most that many jobs of the queue claimed or
        running at once (1 to the worker's ``concurrency``).  ``timeout``:
        seconds the handler may run; then its job is nacked with a
        ``TimeoutError``.  ``retry``: ``retry(job.tries)`` is the nack's
        ``retry_in`` after a failure (seconds, a timedelta, or None for the
        server's backoff) instead of the worker's ``retry_delay``; a
        :class:`Retry` raised by the handler still wins.
        """
        if self._started:
            raise RuntimeError("register handlers before starting the worker")
        if not callable(handler):
            raise TypeError(f"the handler of {queue!r} is not callable: {handler!r}")
        self._check_handler(queue, handler)
        if concurrency is not None and not (
                isinstance(concurrency, int) and 1 <= concurrency <= self.concurrency):
            raise ValueError(f"concurrency of {queue!r} must be between 1 and the worker's "
                             f"concurrency ({self.concurrency}), not {concurrency!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout of {queue!r} must be more than 0 seconds")
        if retry is not None and not callable(retry):
            raise TypeError(f"retry of {queue!r} must be a function of the attempt number")
        self._specs[queue] = _Spec(handler, concurrency, timeout, retry)

    def handler(self, queue: str, *, concurrency: Optional[int] = None,
                timeout: Optional[float] = None,
                retry: Optional[RetryPolicy] = None) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`register` (same options)."""
        def decorate(fn: Handler) -> Handler:
            self.register(queue, fn, concurrency=concurrency, timeout=timeout, retry=retry)
            return fn
        return decorate

    def _check_handler(self, queue: str, handler: Handler) -> None:
        """Raise TypeError for a handler of the wrong kind (sync or async)."""
        raise NotImplementedError

    # -- events -----------------------------------------------------------------

    def on(self, event: str, callback: Optional[Callable[..., Any]] = None) -> Any:
        """Call ``callback`` on ``event`` (see EVENTS); returns it, so that
        ``@worker.on("job_failed")`` works as a decorator.  A callback that
        raises is logged (ERROR), never stops the worker."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: one of {', '.join(EVENTS)}")
        if callback is None:
            return functools.partial(self.on, event)
        if not callable(callback):
            raise TypeError(f"the callback of {event!r} is not callable: {callback!r}")
        self._check_callback(event, callback)
        self._listeners[event].append(callback)
        return callback

    def _check_callback(self, event: str, callback: Callable[..., Any]) -> None:
        if is_async_callable(callback):
            raise TypeError(f"the callback of {event!r} ({_name(callback)}) is a coroutine "
                            f"function: a Worker calls plain functions (pgqueue.AsyncWorker "
                            f"takes both)")

    def _emit(self, event: str, *args: Any) -> None:
        """Call the event's callbacks, here and now (a Worker's)."""
        for callback in self._listeners[event]:
            try:
                result = callback(*args)
            except Exception:
                log.exception("worker %s: a callback of %s raised (ignored)", self.name, event)
                continue
            self._callback_result(event, result)

    def _callback_result(self, event: str, result: Any) -> None:
        if inspect.isawaitable(result):
            _discard(result)
            log.error("worker %s: a callback of %s returned an awaitable, not awaited (a "
                      "Worker's callbacks are plain functions)", self.name, event)

    @property
    def lock_key(self) -> Optional[str]:
        """The key this worker claims with (known once started)."""
        return self._keys.current if self._keys else None

    @property
    def lock_keys(self) -> List[str]:
        """Every key this worker has claimed with: one, and one more after
        each claim whose answer was lost with its connection."""
        return list(self._keys.used) if self._keys else []

    # -- starting and stopping -------------------------------------------------

    def _prepare(self) -> None:
        """start()'s first step: a worker with handlers, started once."""
        if not self._specs:
            raise WorkerSetupError("no handler registered: call register(queue, fn) first")
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True

    def _launch(self) -> None:
        """start()'s last step, once the setup is checked: the threads."""
        self._keys = _Keys(f"{self.name}:{next(_worker_numbers)}")
        self._free = self.concurrency
        self._limits = {q: s.concurrency for q, s in self._specs.items()
                        if s.concurrency is not None}
        self._busy = dict.fromkeys(self._limits, 0)
        self._unlimited = sorted(q for q in self._specs if q not in self._limits)
        self._heartbeat = _Heartbeat(self)
        self._heartbeat.start()
        self._completer = _Completer(self)
        self._completer.start()
        self._start_slots()
        log.info("worker %s: %d slots on queues %s, lease %ss, lock_key %s", self.name,
                 self.concurrency, ", ".join(sorted(self._specs)), self.lease,
                 self._keys.current)
        self._launched = True
        self._emit("started")
        self._claimer = threading.Thread(target=self._claim_loop, name="pgqueue-claimer",
                                         daemon=True)
        self._claimer.start()

    def _start_slots(self) -> None:
        """Whatever runs handlers, before the first claim."""

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

    def _raise_fatal(self) -> None:
        """run()'s end: raise what stopped the worker, if anything did."""
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

    def _stop_claiming(self, deadline: float) -> None:
        """stop()'s first step: no more claims (the waiting one cancelled)."""
        with self._free_cond:
            self._free_cond.notify_all()  # a claimer waiting for a free slot
        # Cancel the waiting claim, again while one still waits (a cancel that
        # reached the server just before the claim started does nothing).
        while self._claimer is not None and self._claimer.is_alive():
            if time.monotonic() >= deadline:
                break
            self._cancel_claim()
            self._claimer.join(min(0.2, max(0.0, deadline - time.monotonic())))

    def _stop_threads(self, deadline: float) -> None:
        """stop()'s last step, once the handlers are done or given up on."""
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

    def _connect_args(self, overrides: Dict[str, Any]) -> Dict[str, Any]:
        return {"autocommit": True, "prepare_threshold": self.prepare_threshold,
                **self.connect_kwargs, **overrides}

    def _connect(self, **overrides: Any) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, **self._connect_args(overrides))

    async def _aconnect(self, **overrides: Any) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(self.conninfo,
                                                     **self._connect_args(overrides))

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
        self.request_stop()

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

    def _can_claim(self) -> bool:
        """Under _free_cond: is there a free slot, and a queue with room?"""
        return self._free > 0 and (bool(self._unlimited) or any(
            self._busy[q] < limit for q, limit in self._limits.items()))

    def _claim_jobs(self) -> None:
        assert self._keys is not None and self._completer is not None
        backoff = _Backoff(self.reconnect_max_delay)
        # After a round that found jobs, the next one does not wait; after
        # one that found none, one claim waits for work.
        busy = False
        while not self._stopping.is_set():
            with self._free_cond:
                while not self._can_claim() and not self._stopping.is_set():
                    self._free_cond.wait()
                if busy and self.claim_delay > 0:
                    # jobs are coming: gather the slots that free up in the
                    # next claim_delay (one claim for them all, not one each)
                    deadline = time.monotonic() + self.claim_delay
                    while self._free < self.concurrency and not self._stopping.is_set():
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._free_cond.wait(left)
                free = self._free
                room = {q: limit - self._busy[q] for q, limit in self._limits.items()}
            conn = self._claim_conn_again(backoff)
            if conn is None:
                break
            key = self._keys.current
            try:
                got = self._claim_round(conn, key, free, room, blocking=not busy)
            except _Stopping:
                break
            except psycopg.errors.QueryCanceled:
                # stop() cancelled the waiting claim, or a queue it left out
                # (full) has room again: nothing was claimed; claim at once
                busy = True
                continue
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
            busy = got > 0

    def _claim_round(self, conn: psycopg.Connection, key: str, free: int, room: Dict[str, int],
                     blocking: bool) -> int:
        """Claims for the ``free`` slots (``room``: what each limited queue may
        take), and hands the jobs over; returns how many.  Never more than can
        start: see the module's docstring."""
        if not self._limits:
            return self._claim_into(conn, key, sorted(self._specs), free, blocking)
        open_ = sorted(q for q, n in room.items() if n > 0)
        if blocking:
            n = min([free] + [room[q] for q in open_])
            return self._claim_into(conn, key, self._unlimited + open_, n, True)
        # the unlimited queues first, then each limited one, or the other way
        # round: in turn, so that neither takes every free slot round after round
        claims = [(q, [q]) for q in open_]
        if self._unlimited:
            claims.insert(len(claims) if self._limited_first else 0, (None, self._unlimited))
        self._limited_first = not self._limited_first
        got = 0
        for limited, queues in claims:
            n = free - got if limited is None else min(room[limited], free - got)
            if n > 0:
                got += self._claim_into(conn, key, queues, n, False)
        return got

    def _claim_into(self, conn: psycopg.Connection, key: str, queues: List[str], n: int,
                    blocking: bool) -> int:
        """One pgq_claim; its jobs handed over.  Raises _Stopping once stopping."""
        with self._claim_lock:
            if self._stopping.is_set():
                raise _Stopping()
            self._claiming = True
            self._waiting_on = frozenset(queues) if blocking else None
        try:
            rows = self._claim(conn, [key, n, _interval(self.lease), _text_array(queues)],
                               _interval(self.wait) if blocking else None)
        finally:
            with self._claim_lock:
                self._claiming = False
                self._waiting_on = None
        if rows:
            assert self._keys is not None
            self._keys.claimed(key, len(rows))
            with self._free_cond:
                self._free -= len(rows)
                for row in rows:
                    if row[1] in self._busy:
                        self._busy[row[1]] += 1
            for row in rows:
                self._hand_over(self._job_class(
                    id=row[0], queue=row[1], payload=row[2], tries=row[3], version=row[4],
                    lock_timeout=row[5], lock_key=key, _worker=self))
        return len(rows)

    def _hand_over(self, job: Job) -> None:
        """A claimed job, to whatever runs handlers (called in the claimer's thread)."""
        raise NotImplementedError

    @staticmethod
    def _claim(conn: psycopg.Connection, args: List[Any],
               wait: Optional[str]) -> List[Any]:
        """One claim (``args``: key, n, the lease and the queues as
        _interval and _text_array give them); a blocking one (``wait``, an
        _interval) in a transaction that has the server check that the
        worker is still connected while it waits."""
        key, n, lease, queues = args
        params = [key, str(n), lease, queues, wait or "0"]
        if wait is None:
            return conn.execute(_CLAIM, params).fetchall()
        with conn.transaction():
            conn.execute(_CLIENT_CHECK)
            return conn.execute(_CLAIM, params).fetchall()

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

    # -- a job's run --------------------------------------------------------------

    def _begin(self, job: Job) -> _Spec:
        """Before the handler: the heartbeat takes the job; job_started."""
        assert self._heartbeat is not None
        job._started = time.monotonic()
        self._heartbeat.add(job)
        log.debug("%s: job %s of %s, try %d", job.lock_key, job.id, job.queue, job.tries)
        self._emit("job_started", job)
        return self._specs[job.queue]

    def _finish(self, job: Job, exc: Optional[BaseException],
                error: Optional[str] = None) -> None:
        """The end of a job's run, once the caller won ``job._end(...)``: the
        heartbeat lets it go, the completer acks it (``exc`` None) or nacks it
        (``error``: last_error, made from ``exc`` when not given), and its
        slot is free again."""
        assert self._heartbeat is not None and self._completer is not None
        handed = False
        try:
            job._duration = time.monotonic() - job._started
            self._heartbeat.remove(job)
            retry_in: Optional[timedelta] = None
            if isinstance(exc, Retry):
                error, retry_in = f"Retry: {exc.message}", exc.delay
            elif exc is not None:
                error = error or format_error(exc)
                retry_in = self._retry_in(job)
                log.warning("%s: job %s of %s failed on try %d: %s: %s", job.lock_key,
                            job.id, job.queue, job.tries, type(exc).__name__, exc)
            job._exc = exc
            if job.lease_lost:
                log.error("%s: lease of job %s was lost while its handler ran: result not %s",
                          job.lock_key, job.id, "acked" if exc is None else "nacked")
                return
            if job._acked:  # in the handler's own transaction
                if exc is not None:
                    log.warning("%s: job %s raised after its transaction acked it: not nacked",
                                job.lock_key, job.id)
                self._emit("job_succeeded", job, job._duration)
                return
            handed = self._completer.submit(job, error, retry_in)
            if not handed:
                log.warning("%s: job %s finished after shutdown released it: result dropped",
                            job.lock_key, job.id)
        except Exception:  # a bug of ours: the worker must not die of it
            log.exception("%s: unexpected error with job %s (its lease will run out)",
                          job.lock_key, job.id)
        finally:
            if not handed:
                self._completer.forget(job)
            self._freed(job)

    def _freed(self, job: Job) -> None:
        """The job's slot (and its queue's share) may be claimed for again."""
        with self._free_cond:
            self._free += 1
            if job.queue in self._busy:
                self._busy[job.queue] -= 1
                self._free_cond.notify()
            elif self._free == 1 or self._free == self.concurrency:
                # the claimer waits for a first free slot, or gathers more
                # until all are (a wake-up per job would cost more than it saves)
                self._free_cond.notify()
        # The claim waiting for work left this queue out (it was full): cancel
        # it, so that the next round claims for the room just made, rather
        # than after up to `wait` seconds.
        with self._claim_lock:
            waiting_on = self._waiting_on
            left_out = waiting_on is not None and job.queue not in waiting_on
            if left_out:
                self._waiting_on = None
        if left_out:
            self._cancel_claim()

    def _retry_in(self, job: Job) -> Optional[timedelta]:
        """The nack's retry_in after a failure: the handler's policy, or retry_delay."""
        policy = self._specs[job.queue].retry
        if policy is None:
            return self.retry_delay
        try:
            return as_interval(policy(job.tries))
        except Exception as err:
            log.error("%s: the retry policy of %s failed on try %d (retry_delay used "
                      "instead): %s: %s", job.lock_key, job.queue, job.tries,
                      type(err).__name__, err)
            return self.retry_delay

    def _lose(self, job: Job, why: str) -> None:
        """The job is no longer held by this worker: lease_lost (once)."""
        if job._set_lost():
            self._emit("lease_lost", job, why)


class _Stopping(Exception):
    """The claimer found the worker stopping."""


class Worker(_Core):
    """Runs handlers for the jobs of the queues registered with it, in threads.

    >>> w = Worker("dbname=app", concurrency=4)
    >>> @w.handler("emails", timeout=60)
    ... def send(job): ...
    >>> w.run()          # until SIGTERM or SIGINT

    Handlers are plain functions (``async def`` ones: :class:`AsyncWorker`).

    ``conninfo`` is a libpq connection string (PgBouncer's address works).
    ``concurrency``: handlers that run at once (threads; the worker uses
    three connections whatever this is).  ``lease``: seconds a claim holds a
    job; extended every ``lease / 3`` while the handler runs.  ``wait``:
    seconds a claim blocks waiting for work (at most 60: a waiting claim
    holds a snapshot).  ``shutdown_timeout``: seconds running handlers get
    after a stop request.  ``retry_delay``: the nack's ``retry_in`` after a
    handler raised (None: the server's exponential backoff), unless the
    handler has a ``retry`` policy.
    ``complete_interval``: seconds a finished job may wait for others to be
    acked with (at most ``lease / 3``: its lease is not extended meanwhile);
    ``complete_batch``: the most jobs acked in one call.
    ``claim_delay``: after a claim that found jobs, seconds the next one
    waits for more handlers to end (all of them at most) once one has, so
    that one claim takes several jobs rather than one per round trip.
    ``transaction_connections``: the most connections :meth:`Job.transaction`
    uses at once (opened when first used).  ``name``: the
    lock_key prefix, ``host:pid`` by default; the worker's key is
    ``name:n``, n numbering the Workers of the process from 0.
    ``prepare_threshold``: psycopg's, None (never prepare on the server) by
    default so that PgBouncer's transaction pooling works.
    ``startup_timeout``: seconds :meth:`start` tries to connect (with
    backoff) before it raises :class:`WorkerSetupError`.
    """

    def _init_runner(self) -> None:
        self._slots: List[_Slot] = []
        # jobs claimed and not yet taken by a slot (None: a slot's signal to end)
        self._jobs: "queuelib.SimpleQueue[Optional[Job]]" = queuelib.SimpleQueue()
        self._watchdog: Optional[_Watchdog] = None

    def _check_handler(self, queue: str, handler: Handler) -> None:
        if is_async_callable(handler):
            raise TypeError(f"the handler of {queue!r} ({_name(handler)}) is a coroutine "
                            f"function: pgqueue.Worker runs plain functions in threads; run "
                            f"async handlers with pgqueue.AsyncWorker")

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
        self._prepare()
        self._check_setup()
        self._launch()

    def _start_slots(self) -> None:
        if any(s.timeout is not None for s in self._specs.values()):
            self._watchdog = _Watchdog(self)
            self._watchdog.start()
        for _ in range(self.concurrency):
            slot = _Slot(next(_slot_numbers))
            self._slots.append(slot)
            self._slot_thread(slot)

    def _slot_thread(self, slot: _Slot) -> None:
        """A new thread for the slot (the first, or one that replaces a thread
        whose handler outlived its timeout)."""
        slot.thread = threading.Thread(target=self._slot_loop, args=(slot,),
                                       name=f"pgqueue-slot-{slot.number}", daemon=True)
        slot.thread.start()

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
        self._raise_fatal()

    def stop(self) -> None:
        """Stop gracefully and wait: see the module's docstring.  Idempotent."""
        self.request_stop()
        if self._stopped.is_set():
            return
        deadline = time.monotonic() + self.shutdown_timeout
        self._stop_claiming(deadline)
        # Each slot runs the jobs handed to it already, then ends.
        for _ in self._slots:
            self._jobs.put(None)
        for slot in self._slots:
            thread = None
            while slot.thread is not thread:  # a thread replaced meanwhile: the new one
                thread = slot.thread
                assert thread is not None
                thread.join(max(0.0, deadline - time.monotonic()))
        left = [s for s in self._slots if s.thread and s.thread.is_alive()]
        if left:
            log.warning("worker %s: %d handler(s) still running after shutdown_timeout "
                        "(%ss): their jobs are released", self.name, len(left),
                        self.shutdown_timeout)
        if self._watchdog is not None:
            self._watchdog.stop()
        self._stop_threads(deadline)
        if self._launched:
            self._emit("stopped", self._fatal)

    # -- the slots ----------------------------------------------------------------

    def _hand_over(self, job: Job) -> None:
        self._jobs.put(job)

    def _slot_loop(self, slot: _Slot) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            if not self._run_job(slot, job):
                break  # abandoned: the slot has another thread

    def _run_job(self, slot: _Slot, job: Job) -> bool:
        """Runs the job's handler; False when its timeout came first (this
        thread is then abandoned: its result is dropped, it ends)."""
        spec = self._begin(job)
        if self._watchdog is not None and spec.timeout is not None:
            self._watchdog.add(job, slot, spec.timeout)
        exc: Optional[BaseException] = None
        try:
            result = spec.fn(job)
            if inspect.isawaitable(result):
                _discard(result)
                raise TypeError(f"the handler of {job.queue!r} ({_name(spec.fn)}) returned an "
                                f"awaitable, which a Worker does not await (not acked): run "
                                f"async handlers with pgqueue.AsyncWorker")
        except BaseException as err:  # a handler's failure is the job's, not the worker's
            exc = err
        if self._watchdog is not None:
            self._watchdog.remove(job)
        if not job._end("returned"):
            log.warning("slot %d: the handler of job %s (%s) returned %.1fs after its timeout: "
                        "result dropped (the job was nacked), its thread ends", slot.number,
                        job.id, "raised " + type(exc).__name__ if exc else "returned",
                        time.monotonic() - job._started - (spec.timeout or 0))
            return False
        self._finish(job, exc)
        return True

    def _time_out(self, job: Job, slot: _Slot, timeout: float) -> None:
        """The watchdog's: the job's handler ran longer than ``timeout``."""
        thread = slot.thread
        if not job._end("timeout"):
            return  # it returned meanwhile (or its transaction is acking it)
        frame = sys._current_frames().get(thread.ident) if thread and thread.ident else None
        exc = TimeoutError(f"handler ran longer than {timeout:g}s")
        error = _error_text(f"TimeoutError: {exc}", "Where the handler was",
                            traceback.format_stack(frame) if frame else [])
        log.warning("slot %d: the handler of job %s of %s ran longer than its timeout (%gs): "
                    "the job is nacked and thread %s abandoned (its result will be "
                    "dropped); a new thread takes the slot", slot.number, job.id, job.queue,
                    timeout, thread.name if thread else "?")
        self._slot_thread(slot)
        self._finish(job, exc, error)


class _Watchdog:
    """Times out the handlers of a Worker that run longer than their ``timeout``
    (a thread, started only when a handler has one)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.cond = threading.Condition()
        self.deadlines: Dict[UUID, Tuple[float, Job, _Slot, float]] = {}
        self.done = False
        self.thread = threading.Thread(target=self._loop, name="pgqueue-watchdog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify()
        self.thread.join(5)

    def add(self, job: Job, slot: _Slot, timeout: float) -> None:
        with self.cond:
            self.deadlines[job.id] = (time.monotonic() + timeout, job, slot, timeout)
            self.cond.notify()

    def remove(self, job: Job) -> None:
        with self.cond:
            self.deadlines.pop(job.id, None)

    def _loop(self) -> None:
        while True:
            with self.cond:
                due = None
                while not self.done:
                    now = time.monotonic()
                    due = [d for d in self.deadlines.values() if d[0] <= now]
                    if due:
                        break
                    first = min((d[0] for d in self.deadlines.values()), default=None)
                    self.cond.wait(None if first is None else first - now)
                if self.done:
                    return
                for _, job, _, _ in due:
                    del self.deadlines[job.id]
            for _, job, slot, timeout in due:
                try:
                    self.worker._time_out(job, slot, timeout)
                except Exception:  # a bug of ours: the watchdog must not die of it
                    log.exception("watchdog: unexpected error timing out job %s", job.id)


class _Completer:
    """Sends the acks (in batches) and nacks of finished jobs, and the releases.

    Acks wait up to ``complete_interval`` for others (or until there are
    ``complete_batch``), then go in one ``pgq_ack_batch`` per lock_key.  At
    shutdown (:meth:`close`) it sends what is left, then releases every key
    of the worker; nothing is taken after that.
    """

    def __init__(self, worker: _Core) -> None:
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
                    log.error("%s: ack of job %s answered false: the job is no longer held "
                              "(lease lost): not acked", key, job.id)
                    self.worker._lose(job, "its ack answered false: another worker took "
                                           "it, or it was cancelled")
            if sent and not job.lease_lost:
                self.worker._emit("job_succeeded", job, job._duration)
            self.forget(job)

    @staticmethod
    def _ack_batch(conn: psycopg.Connection, key: str, jobs: List[Job]) -> Dict[UUID, bool]:
        """{id: acked} for the jobs; exact, although pgq_ack_batch answers a count."""
        ids = [job.id for job in jobs]
        try:
            conn.execute(_ACK_BATCH, {"ids": _text_array(ids), "key": key}).fetchone()
            return dict.fromkeys(ids, True)
        except psycopg.errors.InvalidTextRepresentation as e:
            if "no longer held" not in str(e):
                raise
        # rolled back: which were not held? ask each
        return dict(conn.execute(_ACK_EACH, [key, _text_array(ids)]).fetchall())

    def _nack(self, job: Job, error: str, retry_in: Optional[timedelta]) -> None:
        sent, answer, resent = self._call(
            f"nack of job {job.id}",
            lambda conn: conn.execute(_NACK, [job.id, job.lock_key, error,
                                              retry_in]).fetchone()[0])
        if sent and answer is None and not resent:
            log.error("%s: nack of job %s: the job is no longer held", job.lock_key, job.id)
            self.worker._lose(job, "its nack answered NULL: another worker took it, or it "
                                   "was cancelled")
        elif sent:
            if answer == "failed":
                log.warning("%s: job %s of %s failed for good after %d tries", job.lock_key,
                            job.id, job.queue, job.tries)
            self.worker._emit("job_failed", job, job._duration, job._exc)
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

    def __init__(self, worker: _Core) -> None:
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
            if self._extended(job, answers.get(job.id)):
                self.worker._emit("lease_lost", job, "pgq_extend answered NULL: another "
                                                     "worker took it, or it was cancelled")
        return True

    def _extended(self, job: Job, until: Optional[datetime]) -> bool:
        """Records an extension's answer; True when it says the lease was lost
        (first found so: lease_lost is then to be emitted).  lease_lost turns
        true under the lock, so that a handler's end, which takes the job
        from the heartbeat, sees it."""
        with self.cond:
            if job.id not in self.jobs:
                return False  # finished meanwhile
            self.apart.discard(job.id)
            if until is None:
                self.jobs.pop(job.id)
                self.due.pop(job.id)
                log.error("%s: lease of job %s lost (pgq_extend answered NULL): "
                          "its result will not be acked", job.lock_key, job.id)
                return job._set_lost()
            job.lock_timeout = until
            self.due[job.id] = time.monotonic() + self.period
            return False


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
