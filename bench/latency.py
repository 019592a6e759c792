"""Latency workloads (c) and (d), driven from Python with psycopg.

(c) push-commit -> claimed: a producer process pushes one job per transaction
    at a steady ~100/s and records the time right after its COMMIT returned;
    a consumer process on another connection records the time its claim
    returned the job.  Busy-polling consumers for sys1-sys3 (sys3's jobs also
    wait for its 1-second polling scheduler); pgqueue uses a blocking claim
    (wait => '5 seconds').  Both processes read the same system-wide monotonic
    clock.  Separate processes, so neither waits for the other's GIL.
(d) claim+ack of one job, timed per call from one connection, on a backlog.

Every statement runs in autocommit mode, so each is its own transaction.
"""

import math
import multiprocessing as mp
import os
import time

import systems

WARMUP_JOBS = 20


def percentile(values, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def summary_ms(lat_ns):
    ms = [x / 1e6 for x in lat_ns]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms), "max_ms": max(ms), "n": len(ms)}


def _make_system(cfg, key):
    return systems.ALL[key[-1]](cfg)


def _producer(cfg, key, n, rate, out):
    sysobj = _make_system(cfg, key)
    conn = systems.connect(cfg, sysobj.search_path, app="bench-latency-producer")
    pushed = []
    interval = 1.0 / rate
    start = time.monotonic()
    for i in range(n):
        target = start + i * interval
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        job_id = sysobj.push_one(conn)          # INSERT/pgq_push + COMMIT
        pushed.append((str(job_id), time.monotonic_ns()))
    conn.close()
    out.put(("producer", pushed))


def _consumer(cfg, key, n, deadline_s, blocking, out):
    sysobj = _make_system(cfg, key)
    conn = systems.connect(cfg, sysobj.search_path, app="bench-latency-consumer")
    lock_key = "bench-latency-%d" % os.getpid()
    claimed = []
    empty_polls = 0
    deadline = time.monotonic() + deadline_s
    while len(claimed) < n and time.monotonic() < deadline:
        job_id = sysobj.claim_one(conn, lock_key, blocking=blocking)
        if job_id is None:
            empty_polls += 1
            continue                            # busy polling (or the wait ran out)
        claimed.append((str(job_id), time.monotonic_ns()))
        sysobj.ack(conn, job_id, lock_key)
    conn.close()
    out.put(("consumer", (claimed, empty_polls)))


def push_to_claim(cfg, sysobj, n_jobs, rate=100.0):
    """Workload (c) for one system; the system must be reset and running."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    total = n_jobs + WARMUP_JOBS
    blocking = sysobj.key == "sys4"
    cons = ctx.Process(target=_consumer,
                       args=(cfg, sysobj.key, total, total / rate + 60, blocking, out))
    prod = ctx.Process(target=_producer, args=(cfg, sysobj.key, total, rate, out))
    cons.start()
    time.sleep(1.0)                             # consumer connected and polling
    prod.start()
    got = dict(out.get(timeout=total / rate + 120) for _ in range(2))
    prod.join()
    cons.join()
    pushed = got["producer"]
    claimed, empty_polls = got["consumer"]
    t_claim = dict(claimed)
    lat = [t_claim[j] - t for j, t in pushed[WARMUP_JOBS:] if j in t_claim]
    if not lat:
        raise RuntimeError("%s: no job pushed in (c) was claimed" % sysobj.key)
    res = summary_ms(lat)
    res["missing"] = len(pushed) - WARMUP_JOBS - len(lat)
    res["empty_polls"] = empty_polls
    return res


def claim_ack(cfg, sysobj, n_calls):
    """Workload (d) for one system: per-call latency of claim + ack."""
    conn = systems.connect(cfg, sysobj.search_path, app="bench-latency-claim")
    lock_key = "bench-latency-%d" % os.getpid()
    lat = []
    empty = 0
    for i in range(n_calls + WARMUP_JOBS):
        t0 = time.perf_counter_ns()
        job_id = sysobj.claim_one(conn, lock_key)
        if job_id is not None:
            sysobj.ack(conn, job_id, lock_key)
        t1 = time.perf_counter_ns()
        if job_id is None:
            empty += 1
        if i >= WARMUP_JOBS:
            lat.append(t1 - t0)
    conn.close()
    if empty:
        raise RuntimeError("%s: %d claims in (d) found no job" % (sysobj.key, empty))
    return summary_ms(lat)
