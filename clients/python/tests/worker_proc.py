"""A worker process for the tests that kill or signal one.

    python worker_proc.py DSN QUEUE LOG --concurrency N --lease S --sleep S
                          [--shutdown-timeout S] [--complete-interval S] [--wait S]
                          [--app-name NAME] [--tx-table TABLE] [--async]

Runs pgqueue.Worker.run() on QUEUE (with --async: pgqueue.AsyncWorker.run()
in asyncio.run(), an ``async def`` handler that sleeps with asyncio.sleep
and writes in ``async with job.transaction()``).  Its handler appends ``start ID TRIES``
to LOG, sleeps ``--sleep`` seconds, then appends ``done ID``; each line is
flushed at once, so a test can read what happened before a SIGKILL.  With
``--tx-table``, the handler inserts the job's id into TABLE in
``job.transaction()`` and appends ``written ID`` before its sleep, inside
the transaction.
"""

import argparse
import asyncio
import logging
import os
import sys
import threading
import time

import pgqueue


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dsn")
    p.add_argument("queue")
    p.add_argument("log")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--sleep", type=float, default=0)
    p.add_argument("--shutdown-timeout", type=float, default=30)
    p.add_argument("--complete-interval", type=float, default=0.005)
    p.add_argument("--wait", type=float, default=10)
    p.add_argument("--app-name", default="pgqueue worker")
    p.add_argument("--tx-table")
    p.add_argument("--async", dest="aio", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(levelname)s %(message)s")
    lock = threading.Lock()
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        with lock:
            os.write(fd, (line + "\n").encode())

    settings = dict(concurrency=args.concurrency, lease=args.lease, wait=args.wait,
                    shutdown_timeout=args.shutdown_timeout,
                    complete_interval=args.complete_interval,
                    connect_kwargs={"application_name": args.app_name})
    if args.aio:
        aworker = pgqueue.AsyncWorker(args.dsn, **settings)

        @aworker.handler(args.queue)
        async def handle_async(job: pgqueue.AsyncJob) -> None:
            note(f"start {job.id} {job.tries}")
            if args.tx_table:
                async with job.transaction() as conn:
                    await conn.execute(f"INSERT INTO {args.tx_table} (job) VALUES (%s)",
                                       [job.id])
                    note(f"written {job.id}")
                    await asyncio.sleep(args.sleep)
            else:
                await asyncio.sleep(args.sleep)
            note(f"done {job.id}")

        note("ready")
        asyncio.run(aworker.run())
        note("exit")
        return 0

    worker = pgqueue.Worker(args.dsn, **settings)

    @worker.handler(args.queue)
    def handle(job: pgqueue.Job) -> None:
        note(f"start {job.id} {job.tries}")
        if args.tx_table:
            with job.transaction() as conn:
                conn.execute(f"INSERT INTO {args.tx_table} (job) VALUES (%s)", [job.id])
                note(f"written {job.id}")
                time.sleep(args.sleep)
        else:
            time.sleep(args.sleep)
        note(f"done {job.id}")

    note("ready")
    worker.run()
    note("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
