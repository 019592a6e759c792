"""Steady load for bench/clients.sh: producers push single jobs at a fixed
total rate while one worker process (steady_worker.py or steady_worker.mjs)
runs them; measures each job's latency from its push's commit to the start
of its handler, and the CPU per job of the worker and of the server.

    python3 steady.py --dsn DSN --queue Q --datadir DIR [--rate 500]
        [--producers 2] [--seconds 20] [--warmup 2] [--name NAME]
        -- WORKER COMMAND ...

The producers are processes of their own, one connection each in
autocommit: every pgqueue.push (the library's producer call) is its own
transaction, and returns once the commit is done (fsync included).  Push i
of producer k (of P) is due at T0 + (i * P + k) / rate, an open loop: a
push that is late goes at once, the next ones keep their times.  Right
after a push returns, the producer reads CLOCK_MONOTONIC (the commit's
time, as the producer sees it) and keeps it with the job's id.  The worker
reads the same clock (time.monotonic_ns(), process.hrtime.bigint()) first
thing in the handler and writes the job's id and that time to a file when
it stops.  The two are joined by job id: latency = handler start - commit
return, which includes the scheduler's pass (woken by the commit) and the
claim.  It starts when the producer learns of the commit, a little after
the commit is visible in the server: the scheduler and a claim may act on
it before the producer process reads its clock, so a job's latency may be
below 0 (counted as it is, and counted apart).  Jobs due in the first
--warmup seconds are left out of the figures.

CPU: the worker's (utime + stime, /proc/self/stat) from just before the
first push's due time to after the last handler started (and 0.1 s for the
acks); the server's (procstat.server_ticks) from the same start until the
worker and the producers have disconnected: it includes the producers'
backends (the pushes), the scheduler and the worker's backends.  Both per
job pushed.

Prints one JSON line: jobs (pushed), pushed_per_s, due_to_commit_p99_ms (a
push's due time to its return), handled, measured, missing (pushed after
the warmup, never started), below_zero, p50_ms, p90_ms, p99_ms, min_ms,
max_ms, client_ticks, server_ticks.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time

import psycopg

import pgqueue
from procstat import postmaster_pid, server_ticks


def percentile(values, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))]


def produce(k, args, barrier, start, results):
    """Producer k: connect, wait for the start, push on schedule; sends
    [(job id, due ns, commit-return ns), ...] to results."""
    conn = psycopg.connect(args.dsn, autocommit=True)
    barrier.wait()   # connected
    barrier.wait()   # start.value is set
    t0 = start.value
    end = t0 + int(args.seconds * 1e9)
    step = 1e9 / args.rate
    out = []
    i = 0
    while True:
        due = t0 + int((i * args.producers + k) * step)
        if due >= end:
            break
        wait = due - time.monotonic_ns()
        if wait > 0:
            time.sleep(wait / 1e9)
        job = pgqueue.push(conn, args.queue, {})
        out.append((str(job), due, time.monotonic_ns()))
        i += 1
    conn.close()
    results.put(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--datadir", required=True)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--name", default="worker")
    ap.add_argument("worker", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    pm = postmaster_pid(args.datadir)

    worker = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    if worker.stdout.readline().strip() != "ready":
        sys.exit(f"steady.py: the worker did not start ({' '.join(cmd)}): exit {worker.wait()}")

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.producers + 1)
    start = ctx.Value("q", 0)
    results = ctx.Queue()
    producers = [ctx.Process(target=produce, args=(k, args, barrier, start, results))
                 for k in range(args.producers)]
    for p in producers:
        p.start()
    barrier.wait(timeout=60)
    server0 = server_ticks(pm, roles=("postgres",))   # psql's backends gone
    worker.stdin.write("go\n")
    worker.stdin.flush()
    start.value = time.monotonic_ns() + 50_000_000
    barrier.wait(timeout=60)
    pushes = []
    for _ in producers:
        pushes += results.get(timeout=args.seconds + 120)
    for p in producers:
        p.join()

    worker.stdin.write(f"stop {len(pushes)}\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if worker.wait() != 0 or not line:
        sys.exit(f"steady.py: the worker failed (exit {worker.returncode})")
    done = json.loads(line)
    server1 = server_ticks(pm, roles=("app", "postgres"))
    recfile = cmd[-1]
    began = {}
    with open(recfile) as f:
        for rec in f:
            job, ns = rec.split()
            began.setdefault(job, int(ns))

    t0 = start.value
    kept = [(job, due, commit) for job, due, commit in pushes if due >= t0 + args.warmup * 1e9]
    lat = [(began[job] - commit) / 1e6 for job, _, commit in kept if job in began]
    push = [(commit - due) / 1e6 for _, due, commit in pushes]
    n = len(pushes)
    last = max(commit for _, _, commit in pushes)
    res = {
        "client": args.name, "mode": "steady", "rate": args.rate, "producers": args.producers,
        "seconds": args.seconds, "warmup": args.warmup, "jobs": n,
        "pushed_per_s": round(n / ((last - t0) / 1e9), 1),
        "due_to_commit_p99_ms": round(percentile(push, 99), 3),
        "handled": done["handled"], "measured": len(lat), "missing": len(kept) - len(lat),
        "below_zero": sum(1 for x in lat if x < 0),
        "client_ticks": done["client_ticks"], "server_ticks": server1 - server0,
    }
    if lat:
        res.update({f"p{p}_ms": round(percentile(lat, p), 3) for p in (50, 90, 99)})
        res.update({"min_ms": round(min(lat), 3), "max_ms": round(max(lat), 3)})
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
