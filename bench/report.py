"""Turns the harness's raw results into bench/RESULTS.md: medians over rounds,
all runs, and the ratios pgqueue / sys1 and pgqueue / sys2.

    /usr/bin/python3 bench/report.py bench/results.jsonl [RESULTS.md]

re-renders a report from a finished run's raw results and meta file.
"""

import json
import statistics
import sys

NAMES = {"sys1": "sys1", "sys2": "sys2", "sys3": "sys3", "sys4": "pgqueue", "sys5": "sys5 (rotating)",
         "sys6": "sys6 (moving)"}
ORDER = ["sys1", "sys2", "sys3", "sys4", "sys5", "sys6"]

# metric -> (column label, True when higher is better, whether a ratio means anything)
METRICS = {
    "jobs_per_s": ("jobs/s", True, True),
    "pushed_per_s": ("pushed jobs/s", True, True),
    "backlog_end": ("jobs left at the end", False, False),
    "p50_ms": ("p50 ms", False, True),
    "p99_ms": ("p99 ms", False, True),
    "before_jobs_per_s": ("before the hold, jobs/s", True, True),
    "hold_first_jobs_per_s": ("hold, first {w} s, jobs/s", True, True),
    "hold_last_jobs_per_s": ("hold, last {w} s, jobs/s", True, True),
    "after_jobs_per_s": ("after the hold, {a} s, jobs/s", True, True),
    "dead_tuples": ("dead tuples at end of hold", False, True),
    "size_mb": ("table+index MB at end of hold", False, True),
    "dead_exact": ("dead tuples at end of hold, exact (pgstattuple)", False, True),
    "dead_items": ("dead line pointers at end of hold (pageinspect)", False, True),
    "dead_total": ("dead tuples + dead line pointers at end of hold (what VACUUM has left)", False, True),
    # the held-back VACUUM workload's control: the same load, no snapshot held, measured over the same windows
    "ctl_before_jobs_per_s": ("before (same window), jobs/s", True, True),
    "ctl_hold_first_jobs_per_s": ("the hold's first {w} s window, jobs/s", True, True),
    "ctl_hold_last_jobs_per_s": ("the hold's last {w} s window, jobs/s", True, True),
    "ctl_after_jobs_per_s": ("the {a} s after, jobs/s", True, True),
    "ctl_dead_tuples": ("dead tuples when the hold would end", False, True),
    "ctl_size_mb": ("table+index MB when the hold would end", False, True),
    "ctl_dead_exact": ("dead tuples when the hold would end, exact (pgstattuple)", False, True),
    "ctl_dead_items": ("dead line pointers when the hold would end (pageinspect)", False, True),
    "ctl_dead_total": ("dead tuples + dead line pointers when the hold would end", False, True),
    # hold / control, window by window (computed by the report)
    "kept_first": ("hold first {w} s ÷ no hold, same window", True, True),
    "kept_last": ("hold last {w} s ÷ no hold, same window", True, True),
    "kept_after": ("after the hold ({a} s) ÷ no hold, same window", True, True),
    # many tenants
    "sched_jobs_per_cpu_s": ("jobs scheduled per s of scheduler CPU", True, True),
    "sched_cpu_us_per_job": ("scheduler CPU us per job", False, True),
    "wall_s": ("wall s until all in work_queue", False, True),
    "claim_p50_ms": ("claim p50 ms while scheduling", False, True),
    "claim_p99_ms": ("claim p99 ms while scheduling", False, True),
    "small_first_after_big_1000th": ("small queues whose first job came after the big queue's 1,000th",
                                     False, False),
}


def info(m):
    return METRICS.get(m, (m, True, True))


TITLES = {
    "a": "Steady state (workload a)",
    "b": "Drain (workload b)",
    "c": "Push-commit to claimed latency at low load (workload c)",
    "d": "Single claim+ack latency on a backlog (workload d)",
    "e": "Batches (workload e)",
    "f": "Held-back VACUUM: the steady state while a REPEATABLE READ snapshot is held open (workload f)",
    "g": "Many tenants: scheduling 10,000 small queues and one big one (workload g)",
}

# Each workload by what it measures, where a line names it in passing.
SHORT = {
    "a": "steady state",
    "b": "drain",
    "c": "push-to-claim latency",
    "d": "claim+ack latency",
    "e": "batches",
    "f": "held-back VACUUM",
    "g": "many tenants",
}


def describe(w, conf, meta):
    c = conf.get(w, {})
    p, k = meta.get("producers", 2), meta.get("consumers", 4)
    if w == "a":
        return ("%d producer clients (one job per transaction) and %d consumer clients (claim, then ack in "
                "a second transaction) for %d s from an empty queue, all as fast as they can. jobs/s are "
                "finished (acked) jobs per second, counted from the tables; pushed jobs/s and the jobs left "
                "at the end show which side was the bottleneck (a growing backlog: the consumers)."
                % (p, k, c["duration"]))
    if w == "b":
        return ("%d jobs preloaded (and, for sys3 and pgqueue, scheduled by their scheduler) then "
                "VACUUM ANALYZEd; %d consumers claim and ack one job at a time until the job table is "
                "empty; jobs per second." % (c["jobs"], k))
    if w == "c":
        return ("A producer pushes one job per transaction at ~%d/s and records the time right after its "
                "COMMIT returns; a consumer on another connection records when its claim returned the "
                "job. %d jobs per run after 20 warm-up jobs. sys1-sys3 consumers poll without pause (sys3's "
                "jobs also wait for its 1 s polling scheduler); pgqueue's consumer uses a blocking "
                "pgq_claim(..., wait => '5 seconds')." % (c["rate"], c["jobs"]))
    if w == "d":
        return ("One connection claims one job and acks it, {calls:,} times (after 20 warm-up calls), each "
                "claim+ack timed as one call in the client (psycopg, so it includes the client's own "
                "overhead), on a backlog pushed (and scheduled) beforehand and then VACUUM ANALYZEd; "
                "{calls:,} + 20 jobs more are pushed, so the backlog never falls below its size. The "
                "in-flight case then claims {inf:,} jobs under a 1 hour lease that are never acked, on top "
                "of the {infb:,} backlog.".format(calls=c["calls"], inf=c["in_flight"], infb=c["in_flight_backlog"]))
    if w == "e":
        return ("Claim N: %d jobs preloaded (and scheduled); %d consumers claim up to N jobs in one "
                "transaction and ack them in a second one, until the table is empty. Push 100: %d "
                "producers push 100 jobs per transaction for %d s (the schedulers of sys3 and pgqueue "
                "run meanwhile); jobs counted from the table." % (c["jobs"], k, p, c["push_duration"]))
    if w == "f":
        return ("As the steady state, for %d s of warm-up, then another session opens a REPEATABLE READ transaction, "
                "takes its snapshot with a SELECT and holds it for %d s, then commits; the load goes on "
                "for %d s more. Throughput over windows from samples, every 0.5 s, of the deletes from the job "
                "table; dead tuples (pg_stat_user_tables.n_dead_tup, an estimate, and an exact count of "
                "dead row versions by pgstattuple over every heap, partitions included, and the dead line pointers "
                "pruning left for VACUUM, by pageinspect: n_dead_tup counts those too, and counts that backends "
                "flush after a TRUNCATE or VACUUM reset them) and "
                "pg_total_relation_size of the system's tables just before the holding transaction ends. Right before each hold the "
                "same system runs the same load for the same time without holding a snapshot (the "
                "control, also from an emptied system), measured over the same windows: \"normal\" at "
                "the same point of a run, since the first seconds from an empty queue are faster than "
                "the later steady state for every system."
                % (c["warm"], c["hold"], c["after"]))
    if w == "g":
        return ("pgqueue only. {small:,} queues of {per} ready jobs each plus one queue ('big') of {big:,} "
                "(pushed first, so its jobs are the oldest), {total:,} jobs, against the baseline of the same "
                "{total:,} jobs over {bq} queues; rounds interleave the two. The jobs are pushed with "
                "pgq_push_batch while the scheduler is disabled (`ALTER SYSTEM SET pgqueue.enabled = off`, "
                "reload); the scheduler backend is then terminated so that it restarts (1 s) knowing no "
                "queue, the same for both cases; CHECKPOINT; then `pgqueue.enabled = on` and reload, and "
                "the clock runs until no job is pending (polled every 50 ms). Scheduling throughput = jobs "
                "moved / the scheduler backend's utime+stime over that time (/proc/<pid>/stat, clock ticks "
                "of 1/{tck} s). Meanwhile one client (psycopg) claims one job at a time with "
                "pgq_claim(lock_key, 1, '1 hour') and never acks, so that work_queue keeps every job with "
                "its (created, batch_order), the order it was scheduled in: claim p50/p99 are over the "
                "claims that returned a job while the scheduler ran. Fairness: each small queue's first "
                "job, in (created, batch_order) order, must come before the big queue's 1,000th."
                .format(small=c.get("small_queues", 0), per=c.get("per_small", 0), big=c.get("big", 0),
                        total=c.get("small_queues", 0) * c.get("per_small", 0) + c.get("big", 0),
                        bq=c.get("base_queues", 10), tck=meta.get("clk_tck", 100)))
    return ""


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, int):
        return "{:,}".format(v)
    if v != v:  # NaN
        return "-"
    a = abs(v)
    if a >= 1000:
        return "{:,.0f}".format(v)
    if a >= 100:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 1:
        return "%.2f" % v
    return "%.3f" % v


def ratio(a, b):
    if a is None or b in (None, 0):
        return None
    return a / b


def fmt_ratio(r):
    return "-" if r is None else "%.2f" % r


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def group(results):
    """{workload: {case: {system: [records]}}} keeping first-seen order."""
    out = {}
    for r in results:
        out.setdefault(r["workload"], {}).setdefault(r["case"], {}).setdefault(r["system"], []).append(r)
    return out


def metric_label(m, conf):
    f = conf.get("f", {})
    window = f.get("window", 20)
    after = min(window, max(1, f.get("after", 20) - 3))
    return info(m)[0].format(w=window, a=after)


def case_table(case, by_sys, conf, lines, summary, workload):
    """One table per case: medians, every run, ratios to sys1 and sys2."""
    systems = [s for s in ORDER if s in by_sys]
    metrics = []
    for s in systems:
        for r in by_sys[s]:
            for m in r.get("metrics", {}):
                if m not in metrics:
                    metrics.append(m)
    if not metrics:
        return
    med = {s: {m: median([r["metrics"].get(m) for r in by_sys[s] if "metrics" in r]) for m in metrics}
           for s in systems}

    def runs(s, m):
        return ", ".join(fmt(r["metrics"].get(m)) if "metrics" in r else "error" for r in by_sys[s])

    def name(s):
        return ("**%s**" % NAMES[s]) if s == "sys4" else NAMES[s]

    if len(metrics) == 1:
        m = metrics[0]
        lines.append("| system | %s (median) | all runs | ÷ sys1 | ÷ sys2 |" % metric_label(m, conf))
        lines.append("|---|---|---|---|---|")
        for s in systems:
            row = [name(s), fmt(med[s][m]), runs(s, m)]
            for base in ("sys1", "sys2"):
                row.append(fmt_ratio(ratio(med[s][m], med[base][m])) if base in med and s != base else "-")
            lines.append("| " + " | ".join(row) + " |")
    else:
        # With one run per system the runs columns would repeat the medians.
        several = any(len(by_sys[s]) > 1 for s in systems)
        head = ["system"]
        for m in metrics:
            head += ["%s (median)" % metric_label(m, conf)] + (["runs"] if several else [])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for s in systems:
            row = [name(s)]
            for m in metrics:
                row += [fmt(med[s][m])] + ([runs(s, m)] if several else [])
            lines.append("| " + " | ".join(row) + " |")
        if "sys4" in med:
            for base in ("sys1", "sys2"):
                if base in med:
                    row = ["pgqueue ÷ %s" % base]
                    for m in metrics:
                        row += [fmt_ratio(ratio(med["sys4"][m], med[base][m])) if info(m)[2] else "-"]
                        row += [""] if several else []
                    lines.append("| " + " | ".join(row) + " |")
        if not several:
            lines += ["", "(one run per system)"]
    lines.append("")
    if "sys4" in med:
        parts = []
        for m in metrics:
            if not info(m)[2]:
                continue
            rs = ["%s vs %s" % (fmt_ratio(ratio(med["sys4"][m], med[b][m])), b) for b in ("sys1", "sys2") if b in med]
            if rs:
                parts.append("%s: %s (%s is better)" % (metric_label(m, conf), ", ".join(rs),
                                                        "higher" if info(m)[1] else "lower"))
        if parts:
            lines.append("pgqueue / baseline, " + "; ".join(parts) + ".")
            lines.append("")
    for m in metrics:
        summary.append((workload, case, m, metric_label(m, conf), {s: med[s][m] for s in systems}))


def hold_extra(cases, a_medians, conf, lines, summary):
    """The held-back VACUUM workload: the hold against the control run (same
    load, same windows, no snapshot held) and against the normal steady state."""
    w = conf.get("f", {}).get("window", 20)
    hold_case = next((k for k in cases if k.startswith("snapshot held")), None)
    ctl_case = next((k for k in cases if k.startswith("no snapshot held")), None)
    if hold_case is None:
        return
    held, ctl = cases[hold_case], cases.get(ctl_case, {}) if ctl_case else {}

    def med(by_sys, s, m):
        return median([r["metrics"].get(m) for r in by_sys.get(s, []) if "metrics" in r])

    pairs = (("first", "hold_first_jobs_per_s"), ("last", "hold_last_jobs_per_s"),
             ("after", "after_jobs_per_s"))
    if ctl:
        lines.append("The hold against the control run (the same load for the same time, no snapshot "
                     "held, measured over the same windows; medians). 1.00 means the hold cost nothing:")
        lines.append("")
        lines.append("| system | hold first %d s ÷ no hold | hold last %d s ÷ no hold | after ÷ no hold "
                     "| dead tuples, no hold | MB, no hold |" % (w, w))
        lines.append("|---|---|---|---|---|---|")
        kept = {}
        for s in ORDER:
            if s not in held or s not in ctl:
                continue
            r = {}
            for name, m in pairs:
                r[name] = ratio(med(held, s, m), med(ctl, s, "ctl_" + m))
            kept[s] = r
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                NAMES[s], fmt_ratio(r["first"]), fmt_ratio(r["last"]), fmt_ratio(r["after"]),
                fmt(med(ctl, s, "ctl_dead_tuples")), fmt(med(ctl, s, "ctl_size_mb"))))
        lines.append("")
        for name, _ in pairs:
            m = "kept_" + name
            summary.append(("f", "hold ÷ no hold", m, metric_label(m, conf),
                            {s: kept[s][name] for s in kept}))
    if not any(a_medians.get(s) for s in held):
        return
    lines.append("Throughput during the hold compared with the normal steady state (medians):")
    lines.append("")
    lines.append("| system | steady state jobs/s | hold first %d s ÷ steady | hold last %d s ÷ steady | after ÷ steady |" % (w, w))
    lines.append("|---|---|---|---|---|")
    for s in ORDER:
        if s not in held:
            continue
        base = a_medians.get(s)
        lines.append("| %s | %s | %s | %s | %s |" % (
            NAMES[s], fmt(base), fmt_ratio(ratio(med(held, s, pairs[0][1]), base)),
            fmt_ratio(ratio(med(held, s, pairs[1][1]), base)),
            fmt_ratio(ratio(med(held, s, pairs[2][1]), base))))
    lines.append("")


CPU_CLASSES = ["producers", "consumers", "scheduler", "server other", "server total",
               "client: producers", "client: consumers", "total with clients"]


def cpu_tables(grouped, lines):
    """CPU us per finished job by process class, medians over rounds."""
    any_cpu = False
    for w in ("a", "b", "e"):
        for case, by_sys in grouped.get(w, {}).items():
            rows = []
            for s in ORDER:
                recs = [r for r in by_sys.get(s, []) if (r.get("extra") or {}).get("cpu_us_per_job")]
                if not recs:
                    continue
                vals = [median([r["extra"]["cpu_us_per_job"].get(c) for r in recs]) for c in CPU_CLASSES]
                jobs = median([r["extra"].get("cpu_jobs") for r in recs])
                win = median([r["extra"].get("cpu_window_s") for r in recs])
                rows.append((s, vals, len(recs), jobs, win))
            if not rows:
                continue
            if not any_cpu:
                lines += ["## CPU per finished job by process", "",
                          "CPU time (utime + stime from /proc/<pid>/stat) of each class of processes over the "
                          "measured window, divided by the jobs finished in it; µs per job, medians over "
                          "rounds. producers / consumers: their server backends (found by application_name); "
                          "scheduler: pgqueue's background worker (sys3: the harness's plpgsql scheduler "
                          "loop); server other: the server's background processes (walwriter, checkpointer, "
                          "autovacuum, ...; short-lived autovacuum workers that end inside the window are not "
                          "counted); client: the pgbench processes. Steady state: the window runs from 1 s "
                          "after the start to 1 s before the end, and the jobs finished in it are read from "
                          "the deletes counter (flushed by each backend at most once a second, the same lag "
                          "at both ends); drains: from every consumer connected to the empty table. "
                          "pgqueue's background worker runs in the same server during every system's runs "
                          "(sleeping its naptime when it has nothing to do): for sys1, sys2 and sys3 its idle "
                          "CPU is what their \"scheduler\" column holds besides sys3's own loop (under 1 µs "
                          "per job), and it is in their totals.", ""]
                any_cpu = True
            lines += ["### %s (workload %s)" % (case, w), ""]
            lines.append("| system | " + " | ".join(CPU_CLASSES) + " | rounds | jobs in window | window s |")
            lines.append("|---|" + "---|" * (len(CPU_CLASSES) + 3))
            for s, vals, n, jobs, win in rows:
                lines.append("| %s | %s | %d | %s | %s |" % (
                    NAMES[s], " | ".join(fmt(v) for v in vals), n, fmt(jobs), fmt(win)))
            lines.append("")


def f_windows(grouped):
    """The held-back VACUUM workload: per round, each hold window / the same window of that round's
    control; {system: {"per_window": [median over rounds], "rounds": n}}."""
    cases = grouped.get("f", {})
    hold_case = next((k for k in cases if k.startswith("snapshot held")), None)
    ctl_case = next((k for k in cases if k.startswith("no snapshot held")), None)
    out = {}
    if not hold_case or not ctl_case:
        return out
    for s in ORDER:
        held = {r["round"]: r for r in cases[hold_case].get(s, []) if "metrics" in r}
        ctl = {r["round"]: r for r in cases[ctl_case].get(s, []) if "metrics" in r}
        per_round = []
        for rnd in sorted(held):
            if rnd not in ctl:
                continue
            hw = held[rnd].get("extra", {}).get("windows_jobs_per_s") or []
            cw = ctl[rnd].get("extra", {}).get("windows_jobs_per_s") or []
            if hw and len(hw) == len(cw):
                per_round.append([ratio(a, b) for a, b in zip(hw, cw)])
        if per_round:
            n = len(per_round[0])
            out[s] = {"per_window": [median([r[i] for r in per_round]) for i in range(n)],
                      "all": per_round, "rounds": len(per_round)}
    return out


def f_window_table(fw, conf, lines):
    if not fw:
        return
    w = conf.get("f", {}).get("window", 20)
    n = max(len(v["per_window"]) for v in fw.values())
    lines.append("Each %d s window of the hold ÷ the same window of the same round's control run, median "
                 "over rounds (the runs of each round in brackets):" % w)
    lines.append("")
    lines.append("| system | " + " | ".join("%d-%d s" % (i * w, (i + 1) * w) for i in range(n))
                 + " | lowest | rounds |")
    lines.append("|---|" + "---|" * (n + 2))
    for s in ORDER:
        if s not in fw:
            continue
        v = fw[s]
        cells = []
        for i, m in enumerate(v["per_window"]):
            runs = ", ".join(fmt_ratio(r[i]) for r in v["all"])
            cells.append("%s (%s)" % (fmt_ratio(m), runs) if v["rounds"] > 1 else fmt_ratio(m))
        low = min(x for x in v["per_window"] if x is not None) if any(
            x is not None for x in v["per_window"]) else None
        lines.append("| %s | %s | %s | %d |" % (NAMES[s], " | ".join(cells), fmt_ratio(low), v["rounds"]))
    lines.append("")


def g_summary(grouped):
    """Many tenants: the many-tenant case against the baseline, medians over rounds."""
    cases = grouped.get("g", {})
    base = next((k for k in cases if "baseline" in k), None)
    many = next((k for k in cases if "baseline" not in k), None)
    if not base or not many:
        return None

    def med(case, m):
        return median([r["metrics"].get(m) for r in cases[case].get("sys4", []) if "metrics" in r])

    late = [r["metrics"].get("small_first_after_big_1000th") for r in cases[many].get("sys4", [])
            if "metrics" in r]
    return {"base": base, "many": many,
            "cost_ratio": ratio(med(many, "sched_cpu_us_per_job"), med(base, "sched_cpu_us_per_job")),
            "claim_ratio": ratio(med(many, "claim_p50_ms"), med(base, "claim_p50_ms")),
            "wall_ratio": ratio(med(many, "wall_s"), med(base, "wall_s")),
            "late": late, "fair": bool(late) and all(x == 0 for x in late),
            "rounds": len(late)}


def goals(grouped, meta):
    """The performance goals, each with its measured figure."""
    def med(w, case_prefix, s, m):
        for case, by_sys in grouped.get(w, {}).items():
            if case.startswith(case_prefix):
                return median([r["metrics"].get(m) for r in by_sys.get(s, []) if "metrics" in r])
        return None

    def nrounds(w, case_prefix, s):
        for case, by_sys in grouped.get(w, {}).items():
            if case.startswith(case_prefix):
                return len([r for r in by_sys.get(s, []) if "metrics" in r])
        return 0

    rows = []

    def row(goal, target, measured, ok, note=""):
        status = "not measured" if ok is None else ("MET" if ok else "**NOT MET**")
        rows.append("| %s | %s | %s | %s | %s |" % (goal, target, measured, status, note))

    def cmp_ratio(goal, a, b, target, minimum=True, note=""):
        r = ratio(a, b)
        ok = None if r is None else (r >= target if minimum else r <= target)
        txt = None if r is None else "%.3f" % r
        if txt is not None and float(txt) == target:
            txt = "%.4f" % r          # 1.2003 must not read as 1.200 next to NOT MET
        row(goal, ("≥ %.2fx" if minimum else "≤ %.2fx") % target,
            "-" if r is None else "%sx (%s / %s)" % (txt, fmt(a), fmt(b)), ok, note)

    a4, a1, a2 = (med("a", "steady", s, "jobs_per_s") for s in ("sys4", "sys1", "sys2"))
    n = nrounds("a", "steady", "sys4")
    cmp_ratio("steady state, single calls: pgqueue ÷ sys1 jobs/s", a4, a1, 1.0, note="%d rounds" % n)
    cmp_ratio("steady state, single calls: pgqueue ÷ sys2 jobs/s", a4, a2, 0.8, note="%d rounds" % n)
    b4, b1 = med("b", "drain", "sys4", "jobs_per_s"), med("b", "drain", "sys1", "jobs_per_s")
    cmp_ratio("drain, single calls: pgqueue ÷ sys1 jobs/s", b4, b1, 1.1,
              note="%d rounds" % nrounds("b", "drain", "sys4"))
    e100 = med("e", "claim 100", "sys4", "jobs_per_s")
    row("batches: claim 100 + ack_batch, pgqueue jobs/s", "≥ 50,000", fmt(e100),
        None if e100 is None else e100 >= 50000, "batches, %d rounds" % nrounds("e", "claim 100", "sys4"))
    e10 = med("e", "claim 10", "sys4", "jobs_per_s")
    cmp_ratio("batches: claim 10 + ack_batch ÷ sys1 single calls (the drain)", e10, b1, 6.0,
              note="batches ÷ drain, %d rounds" % nrounds("e", "claim 10", "sys4"))
    c50, c99 = med("c", "push to claim", "sys4", "p50_ms"), med("c", "push to claim", "sys4", "p99_ms")
    nc = nrounds("c", "push to claim", "sys4")
    row("push-commit to claimed, blocking claim: p50", "≤ 1 ms", "-" if c50 is None else "%s ms" % fmt(c50),
        None if c50 is None else c50 <= 1.0, "%d rounds" % nc)
    row("push-commit to claimed, blocking claim: p99", "≤ 5 ms", "-" if c99 is None else "%s ms" % fmt(c99),
        None if c99 is None else c99 <= 5.0, "%d rounds" % nc)
    d1k = med("d", "backlog 1k", "sys4", "p50_ms")
    d1m = med("d", "backlog 1M", "sys4", "p50_ms")
    dinf = next((med("d", k, "sys4", "p50_ms") for k in grouped.get("d", {}) if "in flight" in k), None)
    ninf = next((nrounds("d", k, "sys4") for k in grouped.get("d", {}) if "in flight" in k), 0)
    cmp_ratio("claim+ack p50, 1M backlog ÷ 1k backlog", d1m, d1k, 1.2, minimum=False,
              note="%d / %d rounds" % (nrounds("d", "backlog 1M", "sys4"), nrounds("d", "backlog 1k", "sys4")))
    cmp_ratio("claim+ack p50, 10k in flight (on 100k) ÷ 1k backlog", dinf, d1k, 1.2, minimum=False,
              note="%d / %d rounds" % (ninf, nrounds("d", "backlog 1k", "sys4")))
    fw = f_windows(grouped).get("sys4")
    if fw:
        low = min(x for x in fw["per_window"] if x is not None)
        row("held-back VACUUM: every %d s window of the hold ÷ same window of control (pgqueue, lowest window's median)"
            % meta.get("conf", {}).get("f", {}).get("window", 20),
            "≥ 0.90", "%.3f (windows: %s)" % (low, ", ".join(fmt_ratio(x) for x in fw["per_window"])),
            low >= 0.9, "%d rounds" % fw["rounds"])
    else:
        row("held-back VACUUM: every 20 s window of the hold ÷ same window of control", "≥ 0.90", "-", None)
    for m, label in (("dead_tuples", "dead tuples"), ("dead_exact", "dead tuples, exact (pgstattuple)"),
                     ("dead_total", "dead tuples and dead line pointers"),
                     ("size_mb", "table+index size")):
        h4 = med("f", "snapshot held", "sys4", m)
        h1 = med("f", "snapshot held", "sys1", m)
        cmp_ratio("held-back VACUUM: %s at the end of the hold: pgqueue ÷ sys1" % label, h4, h1, 2.0, minimum=False,
                  note="%d rounds" % nrounds("f", "snapshot held", "sys4"))
    g = g_summary(grouped)
    if g:
        for key, label in (("cost_ratio", "scheduler CPU per job"), ("claim_ratio", "claim p50")):
            r = g[key]
            row("many tenants ÷ 10 queues: %s" % label, "≤ 1.50x", "-" if r is None else "%.3fx" % r,
                None if r is None else r <= 1.5, "%d rounds" % g["rounds"])
        row("many tenants, fairness: every small queue's first job before the big queue's 1,000th", "0 late queues",
            "late queues per round: %s" % ", ".join(str(x) for x in g["late"]), g["fair"],
            "%d rounds" % g["rounds"])
    else:
        row("many tenants", "≤ 1.50x, fairness", "-", None)
    return ["## Performance goals", "",
            "Medians of the rounds of this run (the number of rounds is given), ratios to the systems of "
            "the same run; computed by report.py from RESULTS.jsonl, never edited by hand.", "",
            "| goal | target | measured | status | |", "|---|---|---|---|---|"] + rows + [""]


def load_section(meta, lines):
    load = meta.get("load") or []
    if not load:
        return
    lines += ["## Other load on the machine", "",
              "Load average (1, 5, 15 min, /proc/loadavg) at the start and end of each workload, on a "
              "machine of %s cores. The benchmark's own clients and server keep it near the number of "
              "cores; well above that, other work shared the machine. The figures are side-by-side ratios "
              "of interleaved rounds within one run, so any other load falls on every system alike and "
              "shows as noise between rounds (see the runs columns)."
              % meta.get("machine", {}).get("nproc", "?"), "",
              "| workload | start | loadavg at start | end | loadavg at end | seconds |",
              "|---|---|---|---|---|---|"]
    for x in load:
        lines.append("| %s | %s | %s | %s | %s | %s |" % (x["workload"], x["start"], x["loadavg_start"],
                                                         x["end"], x["loadavg_end"], x["seconds"]))
    lines.append("")


def render(meta, results):
    conf = meta.get("conf", {})
    quick = meta.get("mode") == "quick"
    L = ["# pgqueue benchmark results", ""]
    if quick:
        L += ["> **Quick run** (`--quick`): short runs, one round each. A smoke test of the harness, "
              "not figures to draw conclusions from.", ""]
    L += ["- Mode: %s" % meta.get("mode"),
          "- Date: %s to %s" % (meta.get("started"), meta.get("finished")),
          "- Command: `%s`" % meta.get("command", "").strip()]
    if meta.get("wl_systems"):
        L.append("- Systems per workload: %s; any workload not listed: every system of the run. "
                 "The others were left out to fit the run in its time (the goals compare only these)"
                 % "; ".join(
                     "%s (workload %s): %s" % (SHORT.get(w, w), w, ", ".join(NAMES.get(k, k) for k in ks))
                     for w, ks in sorted(meta["wl_systems"].items())))
    L.append("")
    L += goals(group(results), meta)
    m = meta.get("machine", {})
    L += ["## Machine", "",
          "- CPU: %s, %s cores (nproc)" % (m.get("cpu"), m.get("nproc")),
          "- Memory: %s" % m.get("memory"),
          "- Kernel: %s" % m.get("kernel"),
          "- PostgreSQL: %s" % m.get("postgres"), "",
          "## Server settings", "",
          "A throwaway server started by the harness (initdb defaults plus this file, included from "
          "postgresql.conf):", "", "```", meta.get("conf_file", "").rstrip(), "```", "",
          "Effective values: " + ", ".join("`%s = %s`" % kv for kv in meta.get("settings", {}).items()), ""]
    L += ["## Systems", ""]
    for s in ORDER:
        if s in meta.get("systems", {}):
            L.append("- **%s**%s: %s" % (NAMES[s], " (sys4)" if s == "sys4" else "", meta["systems"][s]))
    L.append("")
    if meta.get("notes"):
        L += ["Notes:", ""] + ["- %s" % n for n in meta["notes"]] + [""]
    L += ["Each run starts from an emptied system (TRUNCATE, CHECKPOINT; a preloaded backlog is "
          "VACUUM ANALYZEd once scheduled); rounds are interleaved (sys1, sys2, ..., sys1, sys2, ...) "
          "and the tables show medians over rounds. Ratios are of medians: for jobs/s above 1 means "
          "pgqueue is faster, for latencies below 1 means pgqueue is faster. pgbench runs with "
          "`-M prepared`. See bench/README.md for the method.", ""]

    grouped = group(results)
    summary = []
    body = []
    a_medians = {}
    for w in "abcdefg":
        if w not in grouped:
            continue
        body += ["## %s" % TITLES[w], "", describe(w, conf, meta), ""]
        for case, by_sys in grouped[w].items():
            body += ["### %s" % case, ""]
            case_table(case, by_sys, conf, body, summary, w)
            if w == "a":
                for s, rs in by_sys.items():
                    a_medians[s] = median([r["metrics"]["jobs_per_s"] for r in rs if "metrics" in r])
        if w == "f":
            hold_extra(grouped[w], a_medians, conf, body, summary)
            f_window_table(f_windows(grouped), conf, body)
        if w == "g":
            g = g_summary(grouped)
            if g:
                body += ["Many tenants ÷ baseline (medians): scheduler CPU per job %s, claim p50 %s, wall "
                         "time %s; small queues served after the big queue's 1,000th job, per round: %s."
                         % (fmt_ratio(g["cost_ratio"]), fmt_ratio(g["claim_ratio"]), fmt_ratio(g["wall_ratio"]),
                            ", ".join(str(x) for x in g["late"])), ""]

    cpu_lines = []
    cpu_tables(grouped, cpu_lines)
    load_section(meta, L)
    L += cpu_lines
    present = [s for s in ORDER if any(s in vals for _, _, _, _, vals in summary)]
    if summary:
        L += ["## Summary (medians)", ""]
        head = ["workload", "case", "metric"] + [NAMES[s] for s in present]
        if "sys4" in present:
            head += ["pgqueue / sys1", "pgqueue / sys2"]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        for w, case, m, label, vals in summary:
            row = [w, case, label] + [fmt(vals.get(s)) for s in present]
            if "sys4" in present:
                row += [fmt_ratio(ratio(vals.get("sys4"), vals.get(b))) if info(m)[2] else "-"
                        for b in ("sys1", "sys2")]
            L.append("| " + " | ".join(row) + " |")
        L.append("")
    L += body
    errors = [r for r in results if "error" in r]
    if errors:
        L += ["## Failed runs", ""]
        for r in errors:
            L.append("- %s, workload %s, %s, round %s: %s" % (NAMES.get(r["system"], r["system"]), r["workload"],
                                                     r["case"], r["round"], r["error"].splitlines()[0]))
        L.append("")
    return "\n".join(L) + "\n"


def main():
    if len(sys.argv) > 3 or any(a in ("-h", "--help") for a in sys.argv[1:]):
        sys.stderr.write("usage: report.py [RESULTS.jsonl [OUT.md]]\n"
                         "Renders RESULTS.jsonl (and RESULTS.jsonl.meta.json beside it) as the\n"
                         "report bench/run.sh writes; to OUT.md, or to standard output.\n")
        sys.exit(0 if len(sys.argv) == 2 else 2)
    raw = sys.argv[1] if len(sys.argv) > 1 else "bench/results.jsonl"
    out = sys.argv[2] if len(sys.argv) > 2 else None
    with open(raw + ".meta.json") as f:
        meta = json.load(f)
    with open(raw) as f:
        results = [json.loads(line) for line in f if line.strip()]
    text = render(meta, results)
    if out:
        with open(out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
