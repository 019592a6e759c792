"""Turns the harness's raw results into bench/RESULTS.md: medians over rounds,
all runs, and the ratios pgqueue / sys1 and pgqueue / sys2.

    /usr/bin/python3 bench/report.py bench/results.jsonl [RESULTS.md]

re-renders a report from a finished run's raw results and meta file.
"""

import json
import statistics
import sys

NAMES = {"sys1": "sys1", "sys2": "sys2", "sys3": "sys3", "sys4": "pgqueue"}
ORDER = ["sys1", "sys2", "sys3", "sys4"]

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
    # (f)'s control: the same load, no snapshot held, measured over the same windows
    "ctl_before_jobs_per_s": ("before (same window), jobs/s", True, True),
    "ctl_hold_first_jobs_per_s": ("the hold's first {w} s window, jobs/s", True, True),
    "ctl_hold_last_jobs_per_s": ("the hold's last {w} s window, jobs/s", True, True),
    "ctl_after_jobs_per_s": ("the {a} s after, jobs/s", True, True),
    "ctl_dead_tuples": ("dead tuples when the hold would end", False, True),
    "ctl_size_mb": ("table+index MB when the hold would end", False, True),
    # hold / control, window by window (computed by the report)
    "kept_first": ("hold first {w} s ÷ no hold, same window", True, True),
    "kept_last": ("hold last {w} s ÷ no hold, same window", True, True),
    "kept_after": ("after the hold ({a} s) ÷ no hold, same window", True, True),
}


def info(m):
    return METRICS.get(m, (m, True, True))


TITLES = {
    "a": "(a) Steady state",
    "b": "(b) Drain",
    "c": "(c) Push-commit to claimed latency at low load",
    "d": "(d) Single claim+ack latency on a backlog",
    "e": "(e) Batches",
    "f": "(f) Steady state while a REPEATABLE READ snapshot is held open",
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
        return ("As (a), for %d s of warm-up, then another session opens a REPEATABLE READ transaction, "
                "takes its snapshot with a SELECT and holds it for %d s, then commits; the load goes on "
                "for %d s more. Throughput over windows from samples, every 0.5 s, of the deletes from the job "
                "table; dead tuples (pg_stat_user_tables.n_dead_tup) and pg_total_relation_size of the "
                "system's tables just before the holding transaction ends. Right before each hold the "
                "same system runs the same load for the same time without holding a snapshot (the "
                "control, also from an emptied system), measured over the same windows: \"normal\" at "
                "the same point of a run, since the first seconds from an empty queue are faster than "
                "the later steady state for every system."
                % (c["warm"], c["hold"], c["after"]))
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
    """(f): the hold against the control run (same load, same windows, no
    snapshot held) and against the normal steady state of (a)."""
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
    lines.append("Throughput during the hold compared with the normal steady state of (a) (medians):")
    lines.append("")
    lines.append("| system | (a) normal jobs/s | hold first %d s ÷ (a) | hold last %d s ÷ (a) | after ÷ (a) |" % (w, w))
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


def render(meta, results):
    conf = meta.get("conf", {})
    quick = meta.get("mode") == "quick"
    L = ["# pgqueue benchmark results", ""]
    if quick:
        L += ["> **Quick run** (`--quick`): short runs, one round each. A smoke test of the harness, "
              "not figures to draw conclusions from.", ""]
    L += ["- Mode: %s" % meta.get("mode"),
          "- Date: %s to %s" % (meta.get("started"), meta.get("finished")),
          "- Command: `%s`" % meta.get("command", "").strip(), ""]
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
    for w in "abcdef":
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
            L.append("- %s (%s) %s, round %s: %s" % (NAMES.get(r["system"], r["system"]), r["workload"],
                                                     r["case"], r["round"], r["error"].splitlines()[0]))
        L.append("")
    return "\n".join(L) + "\n"


def main():
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
