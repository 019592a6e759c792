"""pgqueue: producers and workers for the pgqueue job queue inside PostgreSQL.

Producer side (on your own connection, inside your own transaction)::

    import pgqueue
    pgqueue.push(conn, "emails", {"to": "a@example.com"})
    pgqueue.push_batch(conn, "thumbnails", [{"img": 1}, {"img": 2}])

Worker side::

    w = pgqueue.Worker("dbname=app", concurrency=4)

    @w.handler("emails")
    def send(job: pgqueue.Job) -> None:
        ...                      # return: ack; raise: nack (retried, then failed)

    @w.handler("orders")
    def bill(job: pgqueue.Job) -> None:
        with job.transaction() as conn:      # the writes and the ack commit together
            conn.execute("INSERT INTO bills ...")

    w.run()                      # until SIGTERM / SIGINT

With asyncio (``async def`` handlers, run as tasks on your event loop)::

    w = pgqueue.AsyncWorker("dbname=app", concurrency=20)

    @w.handler("emails", concurrency=5, timeout=30, retry=lambda tries: 10 * tries)
    async def send(job: pgqueue.AsyncJob) -> None:
        async with job.transaction() as conn:
            await conn.execute("INSERT INTO sent ...")

    await w.run()

Operations (``pgqueue.admin``) and the command line: ``python3 -m pgqueue``.
"""

from .admin import (cancel, configure, counters, jobs, pause, purge, resume, retry, retry_failed,
                    stats)
from .asyncworker import AsyncJob, AsyncWorker
from .errors import LeaseLost, NeedsNewerExtension, PgQueueError, Retry, WorkerSetupError
from .producer import push, push_batch
from .worker import EVENTS, Job, Worker, format_error

__version__ = "1.0.0"

__all__ = [
    "AsyncJob", "AsyncWorker", "EVENTS", "Job", "LeaseLost", "NeedsNewerExtension", "PgQueueError",
    "Retry", "Worker", "WorkerSetupError", "cancel", "configure", "counters", "format_error",
    "jobs", "pause", "purge", "push", "push_batch", "resume", "retry", "retry_failed", "stats",
]
