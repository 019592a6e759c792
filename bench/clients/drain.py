"""Drain N jobs of a queue with pgqueue.Worker and a trivial handler; print jobs/s.

    python3 drain.py DSN QUEUE N CONCURRENCY
Prints one JSON line: {"client": "python", "concurrency": C, "jobs": N, "seconds": S, "jobs_per_s": R}.
"""

import json
import sys
import threading
import time

import pgqueue

dsn, queue, n, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
count = 0
lock = threading.Lock()
last = threading.Event()


def handle(job: pgqueue.Job) -> None:
    global count
    with lock:
        count += 1
        if count == n:
            last.set()


worker = pgqueue.Worker(dsn, concurrency=concurrency, wait=5)
worker.register(queue, handle)
t0 = time.monotonic()
worker.start()
last.wait()
worker.stop()  # waits for the acks still under way
seconds = time.monotonic() - t0
print(json.dumps({"client": "python", "concurrency": concurrency, "jobs": n,
                  "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds, 1)}))
