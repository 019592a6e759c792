"""A pgqueue worker in Python: "sends" the emails of queue emails.

    PGQUEUE_DSN="host=/var/run/postgresql dbname=app user=job_runner" \
        python3 examples/python_worker.py [QUEUE ...]

Needs the pgqueue package (pip install clients/python) and a role with
pgqueue_consumer.  Stops gracefully on SIGTERM or Ctrl-C.  A job whose
payload has no "to" fails: it is nacked with the traceback, retried with
backoff, and ends in state failed when out of tries.
"""

import logging
import os
import sys

import pgqueue

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

worker = pgqueue.Worker(os.environ.get("PGQUEUE_DSN", ""),
                        concurrency=int(os.environ.get("CONCURRENCY", "4")))


def send_email(job: pgqueue.Job) -> None:
    to = job.payload.get("to") if isinstance(job.payload, dict) else None
    if not to:
        raise ValueError("payload has no 'to'")
    # one write with its newline: handlers run in threads, and print()
    # writes the text and the newline separately
    sys.stdout.write(f"job {job.id}: email to {to} (try {job.tries})\n")
    sys.stdout.flush()


for queue in sys.argv[1:] or ["emails"]:
    worker.register(queue, send_email)
worker.run()
