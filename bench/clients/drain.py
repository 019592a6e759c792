"""Drain N jobs of a queue with pgqueue.Worker and a trivial handler; print jobs/s.

    python3 drain.py DSN QUEUE N CONCURRENCY
Prints one JSON line: {"client": "python", "concurrency": C, "jobs": N,
"seconds": S, "jobs_per_s": R, "client_ticks": T}.  The worker has the
library's defaults but for its concurrency.  Time and CPU (T: utime + stime
of this process, all its threads, from /proc/self/stat) run from just
before start() to the end of stop(), which waits for the last acks.
"""

import json
import sys
import threading
import time

import pgqueue
from procstat import own_ticks

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


worker = pgqueue.Worker(dsn, concurrency=concurrency)
worker.register(queue, handle)
ticks0 = own_ticks()
t0 = time.monotonic()
worker.start()
while not last.wait(1) and not worker.stopping:
    pass
worker.stop()  # waits for the acks still under way
if count < n:
    sys.exit(f"drain.py: the worker stopped after {count} of {n} jobs")
seconds = time.monotonic() - t0
ticks = own_ticks() - ticks0
print(json.dumps({"client": "python", "concurrency": concurrency, "jobs": n,
                  "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds, 1),
                  "client_ticks": ticks}))
