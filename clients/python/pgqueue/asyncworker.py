"""The asyncio worker: ``async def`` handlers, as tasks on the caller's event loop.

>>> w = AsyncWorker("dbname=app", concurrency=50)
>>> @w.handler("emails", timeout=30)
... async def send(job): ...
>>> await w.run()        # until SIGTERM or SIGINT (or: await w.start() ... await w.stop())

It is the threaded :class:`~pgqueue.Worker` with tasks in place of slot
threads: the claimer, the completer (batched acks, nacks, releases) and the
heartbeat are the same threads with the same code, each on its own
connection, and the claimer hands each claimed job to the event loop
(``loop.call_soon_threadsafe``), where it runs as a task; ``concurrency``
tasks at most.  What a task's handler does ends the job as a thread's would:
acked when it returns, nacked when it raises.  Handler options
(``concurrency``, ``timeout``, ``retry``) and events are the Worker's; a
timeout cancels the task and nacks the job with ``TimeoutError``.

``async with job.transaction() as conn:`` runs the block in a transaction
on a psycopg ``AsyncConnection`` of a small pool (``transaction_connections``,
opened when first used), then ``pgq_ack`` in the same transaction: the
writes and the ack commit together (:class:`LeaseLost` and a rollback when
the job is no longer held), as the threaded worker's ``job.transaction()``.

Connections: the three threads' and at most ``transaction_connections``;
``start()`` checks the setup on a connection of its own first, as the
Worker's does.  Event callbacks run on the event loop; a callback that is a
coroutine function is scheduled as a task (not awaited where the event
happens; ``stop()`` waits for those still running, at most
``FINISH_WAIT`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, Optional, Set

import psycopg

from .worker import (_ACK, FINISH_WAIT, Handler, Job, _Core, _discard, _name,
                     is_async_callable, log)


class AsyncJob(Job):
    """A claimed job, as an :class:`AsyncWorker`'s handler sees it."""

    @contextlib.asynccontextmanager  # type: ignore[override]
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """The handler's writes and the job's ack, in one transaction.

        >>> async with job.transaction() as conn:
        ...     await conn.execute("INSERT INTO bills (order_id) VALUES (%s)", [order])

        As :meth:`Job.transaction`, on an ``AsyncConnection`` of the worker's
        pool (at most ``transaction_connections``; this waits for one when
        all are in use).
        """
        worker = self._tx_worker()
        async with worker._tx_pool.aconnection() as conn:
            async with conn.transaction():
                yield conn
                self._tx_before_ack()
                cur = await conn.execute(_ACK, [self.id, self.lock_key])
                row = await cur.fetchone()
                assert row is not None
                self._tx_acked(row[0])
            self._acked = True


class AsyncWorker(_Core):
    """Runs ``async def`` handlers for the jobs of the queues registered with
    it, as tasks on the event loop that starts it.

    Takes the settings of :class:`~pgqueue.Worker` (``concurrency`` is the
    most handler tasks at once).  Use it from a coroutine::

        worker = AsyncWorker("dbname=app", concurrency=20)
        worker.register("emails", send)          # async def send(job): ...
        await worker.run()

    See the module's docstring.
    """

    _job_class = AsyncJob

    def _init_runner(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[int] = None
        self._stop_requested: Optional[asyncio.Event] = None
        # the handlers' tasks, and their jobs
        self._tasks: Dict["asyncio.Task[None]", Job] = {}
        # coroutines of event callbacks still running
        self._callback_tasks: Set["asyncio.Future[Any]"] = set()
        self._stopping_task: Optional["asyncio.Future[None]"] = None

    def _check_handler(self, queue: str, handler: Handler) -> None:
        if not is_async_callable(handler):
            raise TypeError(f"the handler of {queue!r} ({_name(handler)}) is not a coroutine "
                            f"function (async def): pgqueue.AsyncWorker awaits its handlers; "
                            f"run plain functions with pgqueue.Worker")

    def _check_callback(self, event: str, callback: Callable[..., Any]) -> None:
        pass  # plain functions and coroutine functions alike

    # -- running --------------------------------------------------------------

    async def start(self) -> None:
        """Check the setup (in a thread: it may retry for ``startup_timeout``
        seconds), then start the claimer, the completer and the heartbeat
        threads; handlers run on this event loop.  Raises
        :class:`~pgqueue.WorkerSetupError` as the Worker's ``start()``."""
        self._prepare()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop_requested = asyncio.Event()
        await asyncio.to_thread(self._check_setup)
        self._launch()

    async def run(self, install_signal_handlers: bool = True) -> None:
        """Start, then wait until SIGTERM/SIGINT (or :meth:`request_stop`), then stop.

        The signal handlers (``loop.add_signal_handler``) are installed only
        when the loop runs in the main thread, and removed at the end.
        Raises :class:`~pgqueue.WorkerSetupError` as :meth:`Worker.run`.
        """
        loop = asyncio.get_running_loop()
        installed = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig, None)
                installed.append(sig)
        try:
            await self.start()
            assert self._stop_requested is not None
            if not self._stopping.is_set():
                await self._stop_requested.wait()
            await self.stop()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        self._raise_fatal()

    def request_stop(self) -> None:
        """Ask the worker to stop (safe from any thread or a signal handler)."""
        super().request_stop()
        loop, event = self._loop, self._stop_requested
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed
                pass

    async def stop(self) -> None:
        """Stop gracefully: no more claims, the running handlers get
        ``shutdown_timeout`` seconds (then their tasks are cancelled and their
        jobs released), the acks and nacks are sent.  Idempotent (a second
        call waits for the first one's end)."""
        self.request_stop()
        if self._stopping_task is None:
            self._stopping_task = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping_task)

    async def _stop(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        await asyncio.to_thread(self._stop_claiming, deadline)
        await asyncio.sleep(0)  # the jobs handed over last get their tasks
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.0, deadline - time.monotonic()))
        left = [(task, job) for task, job in self._tasks.items() if not task.done()]
        if left:
            log.warning("worker %s: %d handler(s) still running after shutdown_timeout "
                        "(%ss): cancelled, their jobs are released", self.name, len(left),
                        self.shutdown_timeout)
            for task, job in left:
                if job._end("shutdown"):
                    self._give_up(job)
                task.cancel()
            await asyncio.wait([t for t, _ in left], timeout=1.0)
        await self._tx_pool.aclose()
        await asyncio.to_thread(self._stop_threads, deadline)
        if self._launched:
            self._emit("stopped", self._fatal)
        if self._callback_tasks:
            await asyncio.wait(list(self._callback_tasks), timeout=FINISH_WAIT)

    # -- the tasks ----------------------------------------------------------------

    def _hand_over(self, job: Job) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_task, job)

    def _start_task(self, job: Job) -> None:
        task = asyncio.ensure_future(self._run_job(job))
        self._tasks[task] = job
        task.add_done_callback(self._task_done)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        job = self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:  # a bug of ours
            log.error("worker %s: the task of job %s failed", self.name,
                      job.id if job else "?", exc_info=task.exception())

    async def _run_job(self, job: Job) -> None:
        spec = self._begin(job)
        exc: Optional[BaseException] = None
        try:
            result = spec.fn(job)
            if not inspect.isawaitable(result):
                raise TypeError(f"the handler of {job.queue!r} ({_name(spec.fn)}) returned "
                                f"{type(result).__name__}, not an awaitable")
            if spec.timeout is None:
                await result
            elif not await self._within(job, result, spec.timeout):
                return
        except asyncio.CancelledError:
            if job._ended is not None:
                return  # the worker's shutdown gave the job up: nothing to send
            # cancelled by someone else than the worker: a failure of the job
            if job._end("returned"):
                self._finish(job, RuntimeError("the handler's task was cancelled"))
            raise
        except Exception as err:  # a handler's failure is the job's, not the worker's
            exc = err
        if job._end("returned"):
            self._finish(job, exc)

    async def _within(self, job: Job, awaitable: Any, timeout: float) -> bool:
        """Awaits the handler for ``timeout`` seconds at most (raising what it
        raises); False when the time ran out: its task is then cancelled and
        the job nacked with TimeoutError."""
        inner = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait([inner], timeout=timeout)
        except asyncio.CancelledError:
            inner.cancel()
            raise
        if inner.done() or not job._end("timeout"):
            await inner  # done, or its transaction is acking it: let it end
            return True
        inner.cancel()
        inner.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        log.warning("%s: the handler of job %s of %s ran longer than its timeout (%gs): its "
                    "task is cancelled and the job nacked", job.lock_key, job.id, job.queue,
                    timeout)
        self._finish(job, TimeoutError(f"handler ran longer than {timeout:g}s"))
        return False

    def _give_up(self, job: Job) -> None:
        """Shutdown left the job's handler running: no ack nor nack, the
        release at the end gives the job back."""
        assert self._completer is not None and self._heartbeat is not None
        self._heartbeat.remove(job)
        self._completer.forget(job)
        self._freed(job)

    # -- events ---------------------------------------------------------------------

    def _emit(self, event: str, *args: Any) -> None:
        """The callbacks run on the event loop (called there from the worker's threads)."""
        if not self._listeners[event]:
            return
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            super()._emit(event, *args)
            return
        try:
            loop.call_soon_threadsafe(lambda: super(AsyncWorker, self)._emit(event, *args))
        except RuntimeError:  # the loop is closed
            log.warning("worker %s: %s not called back: the event loop is closed", self.name,
                        event)

    def _callback_result(self, event: str, result: Any) -> None:
        if not inspect.isawaitable(result):
            return
        if self._loop is None or self._loop.is_closed():
            _discard(result)
            return
        task = asyncio.ensure_future(result)
        self._callback_tasks.add(task)

        def done(t: "asyncio.Future[Any]") -> None:
            self._callback_tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("worker %s: a callback of %s raised (ignored)", self.name, event,
                          exc_info=t.exception())

        task.add_done_callback(done)
