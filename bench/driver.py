"""Runs the benchmark workloads against the systems; called by run.sh once the
harness's own server is up.  Writes raw results (JSON lines + meta) and then
the markdown report (report.py).

Workloads (see README.md):
  a  steady state, 2 producers + 4 consumers
  b  drain a preloaded backlog with 4 consumers
  c  push-commit -> claimed latency at ~100 jobs/s       (latency.py)
  d  claim+ack latency on a backlog / with jobs in flight (latency.py)
  e  batches: claim 10, claim 100, push 100 per transaction
  f  steady state while a REPEATABLE READ snapshot is held open
  g  many tenants: scheduling 10,000 small queues + one big one (pgqueue only)

Every run of a workload on a system starts from a reset system (TRUNCATE,
VACUUM ANALYZE, CHECKPOINT); rounds are interleaved sys1 sys2 ... sys1 sys2.
Finished jobs are counted from the tables (rows deleted from the job table,
cross-checked against rows pushed minus rows left), never from pgbench's
transaction count, which includes empty polls.
"""

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import threading
import time
import traceback

import psycopg

import cpu
import latency
import report
import systems

HERE = os.path.dirname(os.path.abspath(__file__))
PGBENCH = os.environ.get("PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")

# Sizes and rounds.  Long workloads get fewer rounds.
FULL = {
    "a": {"duration": 20, "rounds": 3},
    "b": {"jobs": 100000, "rounds": 3},
    "c": {"jobs": 1000, "rate": 100, "rounds": 3},
    "d": {"backlogs": [1000, 100000, 1000000], "calls": 1000, "in_flight": 10000,
          "in_flight_backlog": 100000, "rounds": 3, "rounds_1m": 3},
    "e": {"jobs": 200000, "push_duration": 20, "rounds": 3},
    "f": {"warm": 10, "hold": 120, "after": 25, "window": 20, "rounds": 3},
    "g": {"small_queues": 10000, "per_small": 10, "big": 100000, "base_queues": 10, "rounds": 3},
}
QUICK = {
    "a": {"duration": 5, "rounds": 1},
    "b": {"jobs": 10000, "rounds": 1},
    "c": {"jobs": 200, "rate": 100, "rounds": 1},
    "d": {"backlogs": [1000, 100000], "calls": 200, "in_flight": 10000,
          "in_flight_backlog": 100000, "rounds": 1, "rounds_1m": 1},
    "e": {"jobs": 20000, "push_duration": 5, "rounds": 1},
    "f": {"warm": 3, "hold": 20, "after": 8, "window": 10, "rounds": 1},
    "g": {"small_queues": 1000, "per_small": 10, "big": 10000, "base_queues": 10, "rounds": 1},
}
PRODUCERS, CONSUMERS = 2, 4
DRAIN_MAX_S = 900
# Workloads run in this order: (g) before (f), the longest.
WORKLOAD_ORDER = "abcdegf"
PRODUCER_ROLES = ("produce", "push_batch")
CLIENT_CLASSES = ("client: producers", "client: consumers")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def human(n):
    for div, suffix in ((1000000, "M"), (1000, "k")):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, suffix)
    return str(n)


class Bench:
    def __init__(self, args):
        self.args = args
        self.conf = json.loads(json.dumps(QUICK if args.quick else FULL))
        if args.rounds:
            # --rounds N: every workload's rounds (bench/ab.sh runs one at a time)
            for c in self.conf.values():
                for k in ("rounds", "rounds_1m"):
                    if k in c:
                        c[k] = args.rounds
        self.cfg = {"host": args.host, "port": args.port, "user": args.user, "dbname": args.dbname}
        self.workdir = args.workdir
        self.logdir = os.path.join(self.workdir, "pgbench-logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.admin = systems.connect(self.cfg, app="bench-admin")
        self.results = []
        self.notes = []
        self.systems = []
        self.raw = open(args.raw, "w")
        self.run_no = 0
        self.procs = []         # pgbench processes of the current run
        self.wl_systems = {}    # workload -> system keys (--wl-systems)
        self.load = []          # loadavg at the start and end of each workload

    # -- pgbench ---------------------------------------------------------------
    def pgbench(self, sysobj, role, clients, duration, defines=None, tag=""):
        script = sysobj.script(role)
        cmd = [PGBENCH, "-n", "-h", self.cfg["host"], "-p", str(self.cfg["port"]),
               "-U", self.cfg["user"], "-M", "prepared", "-c", str(clients),
               "-j", str(min(clients, 2)), "-T", str(duration), "-f", script]
        for k, v in (defines or {}).items():
            cmd += ["-D", "%s=%s" % (k, v)]
        cmd.append(self.cfg["dbname"])
        env = dict(os.environ, PGOPTIONS="-c search_path=%s" % sysobj.search_path,
                   PGAPPNAME="bench-producer" if role in PRODUCER_ROLES else "bench-consumer")
        self.run_no += 1
        path = os.path.join(self.logdir, "%03d-%s-%s-%s.log" % (self.run_no, sysobj.key, tag, role))
        out = open(path, "w")
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        self.procs.append(proc)
        return proc, path

    @staticmethod
    def pgbench_result(proc, path, killed=False):
        rc = proc.wait()
        with open(path) as f:
            text = f.read()
        m = re.search(r"number of transactions actually processed: (\d+)", text)
        aborted = [line for line in text.splitlines() if "aborted" in line or "ERROR" in line]
        if (rc != 0 and not killed) or aborted:
            raise RuntimeError("pgbench failed (rc=%s, log %s):\n%s" % (rc, path, "\n".join(aborted[:5]) or text[-2000:]))
        return int(m.group(1)) if m else None

    @staticmethod
    def stop_pgbench(proc):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- bookkeeping -----------------------------------------------------------
    def record(self, workload, case, sysobj, rnd, metrics, extra=None):
        rec = {"workload": workload, "case": case, "system": sysobj.key, "round": rnd,
               "metrics": metrics, "extra": extra or {}}
        self.results.append(rec)
        self.raw.write(json.dumps(rec) + "\n")
        self.raw.flush()
        shown = ", ".join("%s=%s" % (k, report.fmt(v)) for k, v in metrics.items())
        log("  %-5s %-28s round %d: %s" % (sysobj.key, case, rnd, shown))

    def record_error(self, workload, case, sysobj, rnd, err):
        rec = {"workload": workload, "case": case, "system": sysobj.key, "round": rnd,
               "error": str(err)}
        self.results.append(rec)
        self.raw.write(json.dumps(rec) + "\n")
        self.raw.flush()
        log("  %-5s %-28s round %d: ERROR %s" % (sysobj.key, case, rnd, err))

    def run_one(self, workload, case, sysobj, rnd, fn):
        """Reset the system, run fn, record its result (or its error), clean up."""
        try:
            sysobj.reset(self.admin)
            sysobj.start_background()
            metrics, extra = fn()
            self.record(workload, case, sysobj, rnd, metrics, extra)
        except Exception as e:  # noqa: BLE001 - one failed run must not stop the rest
            traceback.print_exc()
            self.record_error(workload, case, sysobj, rnd, e)
            self.admin = self.reconnect(self.admin)
        finally:
            for proc in self.procs:
                self.stop_pgbench(proc)
            self.procs = []
            try:
                sysobj.stop_background()
                sysobj.truncate(self.admin)
            except Exception as e:  # noqa: BLE001
                log("  cleanup of %s failed: %s" % (sysobj.key, e))

    def reconnect(self, conn):
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass
        return systems.connect(self.cfg, app="bench-admin")

    def systems_for(self, workload):
        keys = self.wl_systems.get(workload)
        return [s for s in self.systems if (keys is None or s.key in keys)
                and (s.workloads is None or workload in s.workloads)]

    def rounds(self, workload, case, n_rounds, fn_for_system):
        for rnd in range(1, n_rounds + 1):
            for s in self.systems_for(workload):
                self.run_one(workload, case, s, rnd, lambda s=s: fn_for_system(s))

    # -- building blocks -------------------------------------------------------
    def load_backlog(self, sysobj, n):
        t0 = time.monotonic()
        sysobj.preload(self.admin, n)
        t1 = time.monotonic()
        sysobj.wait_scheduled(self.admin)
        t2 = time.monotonic()
        sysobj.vacuum(self.admin)
        return {"load_s": round(t1 - t0, 2), "schedule_wait_s": round(t2 - t1, 2)}

    # -- CPU per finished job --------------------------------------------------
    def wait_backends(self, n, timeout=10.0):
        """Wait until n producer/consumer backends are connected."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            k = systems.scalar(self.admin, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                                           "IN ('bench-producer', 'bench-consumer')")
            if k >= n:
                return True
            time.sleep(0.02)
        return False

    @staticmethod
    def client_pids(prod=None, cons=None):
        out = {}
        if prod is not None:
            out["client: producers"] = [prod.pid]
        if cons is not None:
            out["client: consumers"] = [cons.pid]
        return out

    def cpu_result(self, c0, c1, jobs, seconds):
        res = cpu.per_job_us(c0, c1, jobs, CLIENT_CLASSES)
        return {"cpu_us_per_job": res, "cpu_window_s": round(seconds, 2), "cpu_jobs": jobs}

    def steady(self, sysobj, duration):
        d0 = sysobj.deletes(self.admin)
        t0 = time.monotonic()
        prod, prod_log = self.pgbench(sysobj, "produce", PRODUCERS, duration, tag="steady")
        cons, cons_log = self.pgbench(sysobj, "consume", CONSUMERS, duration, tag="steady")
        # CPU window: from 1 s in (every backend connected) to 1 s before the
        # end (the backends are gone once pgbench ends).  Jobs finished in the
        # window from the deletes counter, which each backend flushes at most
        # once a second: the same lag at both ends.
        cpu_extra = {}
        try:
            if not self.wait_backends(PRODUCERS + CONSUMERS):
                raise RuntimeError("the pgbench backends did not all connect")
            time.sleep(max(0.0, t0 + 1 - time.monotonic()))
            clients = self.client_pids(prod, cons)
            c0, w0, j0 = cpu.sample(self.admin, clients), time.monotonic(), sysobj.deletes(self.admin)
            time.sleep(max(0.0, t0 + duration - 1 - time.monotonic()))
            c1, w1, j1 = cpu.sample(self.admin, clients), time.monotonic(), sysobj.deletes(self.admin)
            cpu_extra = self.cpu_result(c0, c1, j1 - j0, w1 - w0)
        except Exception as e:  # noqa: BLE001 - the throughput figures stand without it
            log("  CPU sampling failed: %s" % e)
        pushes = self.pgbench_result(prod, prod_log)
        self.pgbench_result(cons, cons_log)
        finished = sysobj.settled_deletes(self.admin) - d0
        left = sysobj.remaining(self.admin)
        check = pushes - left
        extra = {"finished": finished, "pushes": pushes, "left": left, "pushes_minus_left": check}
        extra.update(cpu_extra)
        if abs(check - finished) > max(10, 0.01 * finished):
            note = ("%s steady state: deleted rows (%d) and pushes minus rows left (%d) differ"
                    % (sysobj.key, finished, check))
            self.notes.append(note)
            log("  WARNING: " + note)
        return {"jobs_per_s": finished / duration, "pushed_per_s": pushes / duration,
                "backlog_end": left}, extra

    def drain(self, sysobj, n, role, defines=None, tag="drain"):
        extra = self.load_backlog(sysobj, n)
        before = sysobj.remaining(self.admin)
        t0 = time.monotonic()
        cons, cons_log = self.pgbench(sysobj, role, CONSUMERS, DRAIN_MAX_S, defines, tag=tag)
        # CPU from when every consumer backend is connected (a few jobs may
        # be gone by then: counted from the deletes) to the empty table, while
        # the backends are still there.
        c0 = None
        if self.wait_backends(CONSUMERS):
            clients = self.client_pids(cons=cons)
            c0, w0 = cpu.sample(self.admin, clients), time.monotonic()
        while True:
            time.sleep(0.02)
            if sysobj.is_empty(self.admin):
                t1 = time.monotonic()
                break
            if cons.poll() is not None:
                t1 = time.monotonic()
                break
        cpu_extra = {}
        if c0 is not None and cons.poll() is None:
            c1, w1 = cpu.sample(self.admin, clients), time.monotonic()
            # jobs: the whole backlog (the few claimed in the milliseconds
            # before the first sample count as if inside the window)
            cpu_extra = self.cpu_result(c0, c1, before, w1 - w0)
        self.stop_pgbench(cons)
        self.pgbench_result(cons, cons_log, killed=True)
        left = sysobj.remaining(self.admin)
        if left:
            raise RuntimeError("drain stopped with %d jobs left (log %s)" % (left, cons_log))
        extra.update({"jobs": before - left, "seconds": round(t1 - t0, 2)})
        extra.update(cpu_extra)
        return {"jobs_per_s": (before - left) / (t1 - t0)}, extra

    def push_batches(self, sysobj, duration, batch):
        c0 = sysobj.remaining(self.admin)
        prod, prod_log = self.pgbench(sysobj, "push_batch", PRODUCERS, duration,
                                      {"batch": batch}, tag="push%d" % batch)
        txs = self.pgbench_result(prod, prod_log)
        pushed = sysobj.remaining(self.admin) - c0
        return {"jobs_per_s": pushed / duration}, {"jobs": pushed, "transactions": txs}

    def hold(self, sysobj, c, control=False):
        """(f): steady state with a REPEATABLE READ snapshot held open.

        With control=True the same load runs for the same time and is measured
        over the same windows, but no snapshot is held: what "normal" is at the
        same point of a run (the first seconds from an empty queue are faster
        than a run's later steady state, for every system)."""
        warm, hold, after, window = c["warm"], c["hold"], c["after"], c["window"]
        total = warm + hold + after
        samples = []
        stop = threading.Event()

        def sampler():
            with systems.connect(self.cfg, app="bench-sampler") as sc:
                while not stop.is_set():
                    samples.append((time.monotonic(), sysobj.deletes(sc)))
                    stop.wait(0.5)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        holder = None
        try:
            t0 = time.monotonic()
            prod, prod_log = self.pgbench(sysobj, "produce", PRODUCERS, total, tag="hold")
            cons, cons_log = self.pgbench(sysobj, "consume", CONSUMERS, total, tag="hold")
            time.sleep(max(0.0, t0 + warm - time.monotonic()))
            if not control:
                holder = systems.connect(self.cfg, sysobj.search_path, autocommit=False, app="bench-holder")
                holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                holder.execute("SELECT count(*) FROM %s" % sysobj.job_table).fetchone()
            h0 = time.monotonic()
            time.sleep(max(0.0, h0 + hold - time.monotonic()))
            dead = sysobj.dead_tuples(self.admin)
            size = sysobj.total_size(self.admin)
            dead_x = sysobj.dead_exact(self.admin) if self.has_pgstattuple else None
            dead_i = sysobj.dead_items(self.admin) if self.has_pageinspect else None
            ring = sysobj.slots(self.admin) if hasattr(sysobj, "slots") else None
            if holder is not None:
                holder.commit()
            h1 = time.monotonic()
            pushes = self.pgbench_result(prod, prod_log)
            self.pgbench_result(cons, cons_log)
            time.sleep(1.5)
        finally:
            if holder is not None:
                holder.close()
            stop.set()
            th.join()

        def rate(ta, tb):
            return (interp(samples, tb) - interp(samples, ta)) / (tb - ta)

        after_w = min(window, max(1.0, after - 3))
        p = "ctl_" if control else ""
        metrics = {
            p + "before_jobs_per_s": rate(t0 + 2, h0),
            p + "hold_first_jobs_per_s": rate(h0, h0 + window),
            p + "hold_last_jobs_per_s": rate(h1 - window, h1),
            p + "after_jobs_per_s": rate(h1, h1 + after_w),
            p + "dead_tuples": dead,
            p + "size_mb": size / 1048576.0,
            p + "dead_exact": dead_x,
            p + "dead_items": dead_i,
            p + "dead_total": None if dead_x is None or dead_i is None else dead_x + dead_i,
        }
        # every whole window of the hold, for the per-window ratios to the control
        n_w = int(hold // window)
        windows = [rate(h0 + i * window, h0 + (i + 1) * window) for i in range(n_w)]
        extra = {"pushes": pushes, "left": sysobj.remaining(self.admin),
                 "hold_s": round(h1 - h0, 1), "window_s": window, "after_window_s": after_w,
                 "windows_jobs_per_s": windows,
                 "ring_at_end": ring,
                 "loadavg_end": loadavg()}
        return metrics, extra

    # -- workloads -------------------------------------------------------------
    def wl_a(self):
        c = self.conf["a"]
        self.rounds("a", "steady", c["rounds"], lambda s: self.steady(s, c["duration"]))

    def wl_b(self):
        c = self.conf["b"]
        self.rounds("b", "drain %s" % human(c["jobs"]), c["rounds"],
                    lambda s: self.drain(s, c["jobs"], "consume"))

    def wl_c(self):
        c = self.conf["c"]

        def one(s):
            r = latency.push_to_claim(self.cfg, s, c["jobs"], c["rate"])
            metrics = {"p50_ms": r.pop("p50_ms"), "p99_ms": r.pop("p99_ms")}
            return metrics, r

        self.rounds("c", "push to claim", c["rounds"], one)

    def wl_d(self):
        c = self.conf["d"]

        # The backlog stays at least n while the calls consume jobs.
        extra_jobs = c["calls"] + latency.WARMUP_JOBS

        def backlog(s, n):
            extra = self.load_backlog(s, n + extra_jobs)
            r = latency.claim_ack(self.cfg, s, c["calls"])
            metrics = {"p50_ms": r.pop("p50_ms"), "p99_ms": r.pop("p99_ms")}
            r.update(extra)
            return metrics, r

        def in_flight(s):
            extra = self.load_backlog(s, c["in_flight_backlog"] + c["in_flight"] + extra_jobs)
            with systems.connect(self.cfg, s.search_path, app="bench-holder") as hc:
                held = s.hold_in_flight(hc, c["in_flight"])
            if held != c["in_flight"]:
                raise RuntimeError("could only claim %d of %d jobs to hold" % (held, c["in_flight"]))
            r = latency.claim_ack(self.cfg, s, c["calls"])
            metrics = {"p50_ms": r.pop("p50_ms"), "p99_ms": r.pop("p99_ms")}
            r.update(extra)
            r["held"] = held
            return metrics, r

        for n in c["backlogs"]:
            rounds = c["rounds_1m"] if n >= 1000000 else c["rounds"]
            self.rounds("d", "backlog %s" % human(n), rounds, lambda s, n=n: backlog(s, n))
        self.rounds("d", "backlog %s + %s in flight" % (human(c["in_flight_backlog"]), human(c["in_flight"])),
                    c["rounds"], in_flight)

    def wl_e(self):
        c = self.conf["e"]
        for batch in (10, 100):
            self.rounds("e", "claim %d, drain %s" % (batch, human(c["jobs"])), c["rounds"],
                        lambda s, b=batch: self.drain(s, c["jobs"], "consume_batch", {"batch": b},
                                                      tag="claim%d" % b))
        self.rounds("e", "push 100 per transaction", c["rounds"],
                    lambda s: self.push_batches(s, c["push_duration"], 100))

    def wl_f(self):
        c = self.conf["f"]
        # Each system runs the hold and, right before it, the same load without
        # the hold (the control), so that the two are close in time.
        for rnd in range(1, c["rounds"] + 1):
            for s in self.systems_for("f"):
                self.run_one("f", "no snapshot held (control)", s, rnd,
                             lambda s=s: self.hold(s, c, control=True))
                self.run_one("f", "snapshot held %d s" % c["hold"], s, rnd, lambda s=s: self.hold(s, c))

    def wl_g(self):
        """(g) many tenants, pgqueue only: 10,000 queues of 10 ready jobs and one
        of 100,000, pushed with the scheduler disabled, then scheduled; against
        the same number of jobs over 10 queues.  Rounds interleave the two."""
        c = self.conf["g"]
        sys4 = [s for s in self.systems_for("g") if s.key == "sys4" and not s.mock]
        if not sys4:
            self.notes.append("(g) needs pgqueue (not the mock): not run")
            log(self.notes[-1])
            return
        s = sys4[0]
        total = c["small_queues"] * c["per_small"] + c["big"]
        many = "%s queues x %d + 1 x %s" % (human(c["small_queues"]), c["per_small"], human(c["big"]))
        base = "%d queues x %s (baseline)" % (c["base_queues"], human(total // c["base_queues"]))
        for rnd in range(1, c["rounds"] + 1):
            self.run_one("g", base, s, rnd, lambda: self.tenants(
                s, [("b%02d" % i, total // c["base_queues"]) for i in range(c["base_queues"])], None))
            self.run_one("g", many, s, rnd, lambda: self.tenants(
                s, [("big", c["big"])] + [("t%05d" % i, c["per_small"]) for i in range(c["small_queues"])],
                "big"))

    def set_scheduler(self, on):
        self.admin.execute("ALTER SYSTEM SET pgqueue.enabled = %s" % ("on" if on else "off"))
        self.admin.execute("SELECT pg_reload_conf()")

    def scheduler_pid(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = systems.scalar(self.admin, "SELECT pid FROM pg_stat_activity WHERE backend_type = "
                                             "'pgqueue scheduler' AND datname = current_database()")
            if pid:
                return pid
            time.sleep(0.1)
        raise RuntimeError("no pgqueue scheduler backend")

    def tenants(self, s, queues, big):
        """One (g) run: push every queue's jobs (the big queue first, so its
        jobs are the oldest) with the scheduler disabled, restart the
        scheduler (so that it starts without knowing any queue, the same for
        both cases), enable it, and time it until nothing is pending.  One
        claimer claims one job at a time meanwhile (1 hour lease, never
        acked, so that work_queue keeps every job's scheduling order for the
        fairness check)."""
        self.set_scheduler(False)
        try:
            time.sleep(1.5)                   # the worker has read the setting
            old = self.scheduler_pid()
            self.admin.execute("SELECT pg_terminate_backend(%s)", (old,))
            deadline = time.monotonic() + 20
            while True:
                pid = self.scheduler_pid()
                if pid != old:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the pgqueue scheduler did not restart")
                time.sleep(0.1)
            time.sleep(1.0)                   # past its start-up
            t = time.monotonic()
            with systems.connect(self.cfg, s.search_path, app="bench-loader") as lc:
                chunk = []
                for name, n in queues:
                    left = n
                    while left > 0:
                        k = min(10000, left)
                        chunk.append((name, k))
                        left -= k
                    if sum(k for _, k in chunk) >= 10000:
                        self._push_queues(lc, chunk)
                        chunk = []
                if chunk:
                    self._push_queues(lc, chunk)
            load_s = time.monotonic() - t
            total = sum(n for _, n in queues)
            early = systems.scalar(self.admin, "SELECT count(*) FROM pgqueue.work_queue")
            if early:
                raise RuntimeError("%d jobs were scheduled while the scheduler was disabled" % early)
            self.admin.execute("CHECKPOINT")
            pid = self.scheduler_pid()

            # the claimer
            stop = threading.Event()
            claims = []               # (t_start, t_end, got_job)
            errors = []

            def claimer():
                try:
                    with systems.connect(self.cfg, s.search_path, app="bench-claimer") as cc:
                        while not stop.is_set():
                            a = time.monotonic()
                            row = cc.execute("SELECT id FROM pgq_claim('bench-g', 1, '1 hour')").fetchone()
                            claims.append((a, time.monotonic(), row is not None))
                            if row is None:
                                time.sleep(0.001)
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            th = threading.Thread(target=claimer, daemon=True)
            th.start()
            time.sleep(0.5)
            ticks0 = cpu.proc_ticks(pid)
            load0 = loadavg()
            t0 = time.monotonic()
            self.set_scheduler(True)
            with systems.connect(self.cfg, app="bench-wait") as wc:
                wc.execute("SET enable_seqscan = off")
                deadline = t0 + 900
                while s.has_pending(wc):
                    if time.monotonic() > deadline:
                        raise RuntimeError("(g): not scheduled in 900 s")
                    time.sleep(0.05)
            t1 = time.monotonic()
            ticks1 = cpu.proc_ticks(pid)
            stop.set()
            th.join(10)
            if errors:
                raise RuntimeError("claimer failed: %s" % errors[0])
            if ticks1 is None or self.scheduler_pid() != pid:
                raise RuntimeError("the scheduler backend changed during the run")
            moved = systems.scalar(self.admin, "SELECT count(*) FROM pgqueue.work_queue")
            sched_s = (ticks1 - ticks0) / float(cpu.TICK)
            got = [(b - a) * 1000.0 for a, b, ok in claims if ok and t0 <= a <= t1]
            metrics = {
                "sched_jobs_per_cpu_s": moved / sched_s if sched_s else None,
                "sched_cpu_us_per_job": sched_s * 1e6 / moved if moved else None,
                "wall_s": t1 - t0,
                "claim_p50_ms": latency.percentile(got, 50) if got else None,
                "claim_p99_ms": latency.percentile(got, 99) if got else None,
            }
            extra = {"jobs": total, "moved": moved, "scheduler_cpu_s": sched_s, "load_s": round(load_s, 2),
                     "claims_with_job": len(got),
                     "empty_claims": sum(1 for a, b, ok in claims if not ok and t0 <= a <= t1),
                     "loadavg_before": load0, "loadavg_after": loadavg()}
            if moved != total:
                raise RuntimeError("%d of %d jobs reached work_queue" % (moved, total))
            if big:
                row = self.admin.execute("""
                    WITH o AS (SELECT queue, row_number() OVER (ORDER BY created, batch_order) AS pos
                                 FROM pgqueue.work_queue),
                         b AS (SELECT pos FROM (SELECT pos, row_number() OVER (ORDER BY pos) AS k
                                                  FROM o WHERE queue = %s) x WHERE k = 1000),
                         f AS (SELECT queue, min(pos) AS p FROM o WHERE queue <> %s GROUP BY queue)
                    SELECT (SELECT pos FROM b), max(p), count(*) FILTER (WHERE p > (SELECT pos FROM b)),
                           count(*) FROM f""", (big, big)).fetchone()
                big1000, last_first, late, nsmall = row
                metrics["small_first_after_big_1000th"] = late
                extra.update({"big_1000th_position": big1000, "last_small_first_position": last_first,
                              "small_queues": nsmall})
            return metrics, extra
        finally:
            self.set_scheduler(True)

    @staticmethod
    def _push_queues(conn, chunk):
        """Push (queue, n) pairs in one transaction with pgq_push_batch."""
        with conn.transaction():
            for name, k in chunk:
                conn.execute("SELECT count(*) FROM pgq_push_batch(%s, array(SELECT %s::jsonb "
                             "FROM generate_series(1, %s)))", (name, systems.PAYLOAD, k))

    # -- setup -----------------------------------------------------------------
    def optional_extension(self, name, without):
        """CREATE EXTENSION name; False (logging what is left out) when it
        is not available."""
        try:
            self.admin.execute("CREATE EXTENSION IF NOT EXISTS %s" % name)
            return True
        except Exception as e:  # noqa: BLE001 - the figure it gives is then left out
            log("%s not available (%s): no %s in (f)" % (name, e, without))
            self.admin = self.reconnect(self.admin)
            return False

    def setup_systems(self, keys):
        self.has_pgstattuple = self.optional_extension("pgstattuple", "exact dead-tuple counts")
        self.has_pageinspect = self.optional_extension("pageinspect", "dead line pointer counts")
        for k in keys:
            cls = systems.ALL[k]
            if k == "4" and not self.prepare_pgqueue():
                continue
            s = cls(self.cfg)
            log("setting up %s" % s.key)
            s.setup(self.admin)
            self.systems.append(s)
        if self.systems and self.systems[-1].key == "sys4":
            self.check_pgqueue(self.systems[-1])

    def prepare_pgqueue(self):
        a = self.args
        if a.mock_pgqueue:
            self.cfg.update(mock_pgqueue=True, pgq_push_batch=True, pgq_ack_batch=True)
            self.notes.append("sys4 is the MOCK pgqueue (bench/test/mock_pgqueue.sql, plpgsql, "
                              "1 s polling scheduler): a harness self-test, NOT pgqueue's figures.")
            return True
        if a.pgqueue_status != "preloaded":
            self.notes.append("sys4 (pgqueue) SKIPPED: %s" % a.pgqueue_reason)
            log(self.notes[-1])
            return False
        try:
            self.admin.execute("CREATE EXTENSION IF NOT EXISTS pgqueue")
        except Exception as e:  # noqa: BLE001
            self.notes.append("sys4 (pgqueue) SKIPPED: CREATE EXTENSION pgqueue failed: %s" % e)
            log(self.notes[-1])
            self.admin = self.reconnect(self.admin)
            return False
        schema = systems.scalar(self.admin, "SELECT extnamespace::regnamespace::text FROM pg_extension "
                                            "WHERE extname = 'pgqueue'")
        version = systems.scalar(self.admin, "SELECT extversion FROM pg_extension WHERE extname = 'pgqueue'")

        def has(fn, types):
            return bool(systems.scalar(self.admin, """
                SELECT EXISTS (SELECT 1 FROM pg_proc
                                WHERE proname = %s AND pronamespace = %s::regnamespace
                                  AND pronargs >= 2 AND proargtypes[0] = %s::regtype
                                  AND proargtypes[1] = %s::regtype)""",
                                       (fn, schema, types[0], types[1])))

        self.cfg.update(pgqueue_schema=schema,
                        pgq_push_batch=has("pgq_push_batch", ["text", "jsonb[]"]),
                        pgq_ack_batch=has("pgq_ack_batch", ["uuid[]", "text"]))
        self.notes.append("pgqueue %s in schema %s; pushing 100 per transaction uses %s; "
                          "batch acks use %s." % (
                              version, schema,
                              "pgq_push_batch(queue, jsonb[])" if self.cfg["pgq_push_batch"]
                              else "SELECT pgq_push(...) FROM generate_series(...)",
                              "pgq_ack_batch(ids, lock_key)" if self.cfg["pgq_ack_batch"]
                              else "one pgq_ack per job in one transaction"))
        return True

    def check_pgqueue(self, s):
        """Functional check: a pushed job gets scheduled by the worker."""
        try:
            s.reset(self.admin)
            s.start_background()
            if not s.mock:
                deadline = time.monotonic() + 10
                while True:
                    workers = systems.scalar(self.admin, "SELECT count(*) FROM pg_stat_activity "
                                                         "WHERE backend_type = 'pgqueue scheduler' "
                                                         "AND datname = %s", (self.cfg["dbname"],))
                    if workers or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                log("pgqueue scheduler backends in database %s: %s" % (self.cfg["dbname"], workers))
                if not workers:
                    self.notes.append("no backend with backend_type 'pgqueue scheduler' was seen in "
                                      "database %s" % self.cfg["dbname"])
            with systems.connect(self.cfg, s.search_path) as c:
                s.push_one(c)
                deadline = time.monotonic() + 15
                while s.has_pending(c) and time.monotonic() < deadline:
                    time.sleep(0.1)
                ok = not s.has_pending(c)
            if not ok:
                raise RuntimeError("a pushed job was not scheduled within 15 s: is the pgqueue "
                                   "scheduler running for database %s?" % self.cfg["dbname"])
            s.stop_background()
            s.reset(self.admin)
        except Exception as e:  # noqa: BLE001
            self.notes.append("sys4 (pgqueue) SKIPPED: %s" % e)
            log(self.notes[-1])
            self.admin = self.reconnect(self.admin)
            s.stop_background()
            self.systems.remove(s)

    def meta(self, started, finished):
        info = {}
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            info["cpu"] = m.group(1).strip() if m else platform.processor()
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s*(\d+) kB", f.read())
            info["memory"] = "%.1f GiB" % (int(m.group(1)) / 1048576.0) if m else "?"
        info["nproc"] = os.cpu_count()
        info["kernel"] = platform.release()
        info["postgres"] = systems.scalar(self.admin, "SELECT version()")
        rows = self.admin.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name IN ('shared_buffers', "
            "'synchronous_commit', 'fsync', 'max_connections', 'shared_preload_libraries', "
            "'wal_level', 'max_wal_size', 'autovacuum', 'full_page_writes') OR name LIKE 'pgqueue.%%' "
            "ORDER BY name").fetchall()
        settings = dict(rows)
        with open(self.args.settings) as f:
            conf_text = f.read()
        return {
            "mode": "quick" if self.args.quick else "full",
            "command": self.args.command,
            "started": started, "finished": finished,
            "machine": info, "settings": settings, "conf_file": conf_text,
            "systems": {s.key: s.title for s in self.systems},
            "notes": self.notes + [s.in_flight_note for s in self.systems if s.in_flight_note],
            "conf": self.conf,
            "producers": PRODUCERS, "consumers": CONSUMERS,
            "load": self.load,
            "wl_systems": self.wl_systems,
            "clk_tck": cpu.TICK,
        }


def interp(samples, t):
    """Linear interpolation of (time, value) samples at time t."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (ta, va), (tb, vb) in zip(samples, samples[1:]):
        if ta <= t <= tb:
            return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb
    return samples[-1][1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--user", default="postgres")
    p.add_argument("--dbname", default="bench")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=0,
                   help="rounds of every workload (default: 3, quick: 1)")
    p.add_argument("--only", default="a,b,c,d,e,f,g")
    p.add_argument("--wl-systems", default="",
                   help="per-workload systems, e.g. 'c=4 d=4 f=1,4' (others: --systems)")
    p.add_argument("--systems", default="1,2,3,4")
    p.add_argument("--workdir", required=True)
    p.add_argument("--settings", required=True, help="the server settings file")
    p.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    p.add_argument("--raw", default=os.path.join(HERE, "results.jsonl"))
    p.add_argument("--command", default="bash bench/run.sh")
    p.add_argument("--pgqueue-status", default="absent")
    p.add_argument("--pgqueue-reason", default="pgqueue is not installed")
    p.add_argument("--mock-pgqueue", action="store_true")
    args = p.parse_args()

    workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    keys = [k.strip().replace("sys", "") for k in args.systems.split(",") if k.strip()]
    wl_systems = {}
    for item in args.wl_systems.split():
        w, _, ks = item.partition("=")
        wl_systems[w] = ["sys" + k.strip().replace("sys", "") for k in ks.split(",") if k.strip()]
    bad = [w for w in workloads if w not in WORKLOAD_ORDER or len(w) != 1] + [k for k in keys if k not in systems.ALL]
    bad += [w for w in wl_systems if w not in WORKLOAD_ORDER]
    if bad:
        p.error("unknown workload or system: %s" % ", ".join(bad))

    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    b = Bench(args)
    b.wl_systems = wl_systems
    b.setup_systems(keys)
    if not b.systems:
        raise SystemExit("no system to benchmark")
    log("systems: %s; workloads: %s; mode: %s" % (", ".join(s.key for s in b.systems),
                                                   ",".join(workloads), "quick" if args.quick else "full"))
    def write_meta(finished):
        meta = b.meta(started, finished)
        with open(args.raw + ".meta.json", "w") as f:
            json.dump(meta, f, indent=1)
        return meta

    for w in WORKLOAD_ORDER:
        if w in workloads:
            # Written before each workload too, so that a run cut short can
            # be rendered from what it has (report.py RESULTS.jsonl).
            write_meta("(unfinished: before workload %s)" % w)
            t = time.monotonic()
            la0, up0 = loadavg(), time.strftime("%H:%M:%S")
            log("workload (%s), loadavg %s" % (w, la0))
            getattr(b, "wl_" + w)()
            b.load.append({"workload": w, "start": up0, "loadavg_start": la0,
                           "end": time.strftime("%H:%M:%S"), "loadavg_end": loadavg(),
                           "seconds": round(time.monotonic() - t)})
            log("workload (%s) took %.0f s, loadavg %s" % (w, time.monotonic() - t, loadavg()))
    finished = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    meta = write_meta(finished)
    b.raw.close()
    text = report.render(meta, b.results)
    with open(args.out, "w") as f:
        f.write(text)
    log("wrote %s and %s" % (args.out, args.raw))


if __name__ == "__main__":
    main()
