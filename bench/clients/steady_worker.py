"""The worker of the steady load (bench/clients/steady.py drives it):
pgqueue.Worker with the library's defaults but for its concurrency, and a
handler that only notes when it started, for each job.

    python3 steady_worker.py DSN QUEUE CONCURRENCY RECFILE

On stdout "ready" once started.  Then on stdin "go" (CPU sample), and
"stop N": waits until N handlers started (60 s at most) and 0.1 s more for
their acks, samples CPU, stops, writes RECFILE ("JOB_ID START_NS" a line,
START_NS on CLOCK_MONOTONIC, which the producers read too) and prints one
JSON line {"handled": H, "client_ticks": T} (T: utime + stime of this
process between the two samples, from /proc/self/stat).
"""

import json
import sys
import time

import pgqueue
from procstat import own_ticks

dsn, queue, concurrency, recfile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
started = []   # (job id, ns): list.append is atomic


def handle(job: pgqueue.Job) -> None:
    started.append((job.id, time.monotonic_ns()))


worker = pgqueue.Worker(dsn, concurrency=concurrency)
worker.register(queue, handle)
worker.start()
print("ready", flush=True)
ticks0 = None
for line in sys.stdin:
    word = line.split()
    if word == ["go"]:
        ticks0 = own_ticks()
    elif word[:1] == ["stop"]:
        deadline = time.monotonic() + 60
        while len(started) < int(word[1]) and time.monotonic() < deadline and not worker.stopping:
            time.sleep(0.01)
        time.sleep(0.1)
        ticks = own_ticks() - (ticks0 if ticks0 is not None else own_ticks())
        worker.stop()
        with open(recfile, "w") as f:
            f.writelines(f"{i} {t}\n" for i, t in started)
        print(json.dumps({"handled": len(started), "client_ticks": ticks}), flush=True)
        break
