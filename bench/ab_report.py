"""Records and reports a run of bench/ab.sh: two builds of pgqueue side by side.

    /usr/bin/python3 bench/ab_report.py render bench/results/ab-X-Y.jsonl [OUT.md]

re-renders the report from the raw results (one JSON line per run, with
ab-X-Y.jsonl.meta.json beside it).  ab.sh calls `init`, `add` (after every
run) and `finish` to record a run as it goes, and `render` after every run,
so that a comparison cut short still leaves a report of what it measured.

Every run is one bench/run.sh of one workload on one system on a fresh
server: build A's or B's pgqueue (sys4), or system 1 on build A's server
(the control).  The report pairs A and B within each round (they ran next
to each other, A B in odd rounds, B A in even ones) and gives, per figure,
the medians, the ratio B / A of the medians and the range of the per-round
ratios.  A difference is only claimed when every round agrees on its sign,
it is wider than half that range, and there were at least 3 rounds.
"""

import argparse
import datetime
import json
import os
import platform
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (fmt, median, metric labels, workload descriptions)

BUDGET = 0.05          # a change must not cost more than 5 %
MIN_ROUNDS = 3         # fewer rounds: ratios are shown, nothing is claimed

# Figures shown per workload, in this order (metric keys of driver.py, plus
# the ones derived here); any workload not listed shows all its metrics.
SHOW = {
    "a": ["jobs_per_s", "pushed_per_s", "cpu_server_us"],
    "b": ["jobs_per_s", "cpu_server_us"],
    "f": ["lowest_window", "kept_first", "kept_last", "kept_after",
          "hold_first_jobs_per_s", "hold_last_jobs_per_s", "after_jobs_per_s",
          "dead_tuples", "dead_exact", "dead_total", "size_mb",
          "ctl_hold_last_jobs_per_s", "ctl_dead_tuples", "ctl_dead_exact", "ctl_dead_total", "ctl_size_mb"],
}
LOCAL = {   # label, True when higher is better
    "cpu_server_us": ("server CPU µs per job (all server processes)", False),
    "lowest_window": ("lowest {w} s window of the hold ÷ same window of the control", True),
}
HOLD_DERIVED = "hold ÷ control (same run)"


def now():
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine():
    info = {"nproc": os.cpu_count(), "kernel": platform.release()}
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        info["cpu"] = m.group(1).strip() if m else platform.processor()
    with open("/proc/meminfo") as f:
        m = re.search(r"MemTotal:\s*(\d+) kB", f.read())
        info["memory"] = "%.1f GiB" % (int(m.group(1)) / 1048576.0) if m else "?"
    return info


# ---------------------------------------------------------------- recording
def cmd_init(a):
    meta = {"command": a.command, "mode": "quick" if a.mode == "quick" else "full",
            "rounds": a.rounds, "only": a.only.split(),
            "base": dict(zip(("commit", "subject", "so_md5"), a.base)),
            "head": dict(zip(("commit", "subject", "so_md5"), a.head)),
            "harness": {"commit": a.harness[0], "modified_files": int(a.harness[1])},
            "started": now(), "finished": None, "machine": machine(), "budget": BUDGET}
    with open(a.raw + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)
    open(a.raw, "w").close()


def cmd_add(a):
    results, run_meta = [], None
    if os.path.exists(a.results):
        with open(a.results) as f:
            results = [json.loads(line) for line in f if line.strip()]
    if os.path.exists(a.results + ".meta.json"):
        with open(a.results + ".meta.json") as f:
            run_meta = json.load(f)
    tail = None
    system = "sys1" if a.build == "control" else "sys4"
    if a.rc != 0 or not any(r.get("system") == system and "metrics" in r for r in results):
        try:
            with open(a.log, errors="replace") as f:
                tail = "".join(f.readlines()[-40:])
        except OSError:
            tail = None
    rec = {"run": a.run, "round": a.round, "workload": a.workload, "build": a.build, "system": system,
           "port": a.port, "rc": a.rc, "start": a.start, "end": a.end,
           "loadavg_start": a.loadavg[0], "loadavg_end": a.loadavg[1], "seconds": a.seconds,
           "meta": run_meta, "results": results, "log_tail": tail}
    with open(a.raw, "a") as f:
        f.write(json.dumps(rec) + "\n")


def cmd_finish(a):
    with open(a.raw + ".meta.json") as f:
        meta = json.load(f)
    meta["finished"] = now()
    with open(a.raw + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)


# ---------------------------------------------------------------- figures
def ratio(x, y):
    if x is None or y in (None, 0):
        return None
    return x / y


def run_figures(run):
    """{(case, metric): value} of one run's system, or None if it failed."""
    recs = [r for r in run.get("results", []) if r.get("system") == run["system"]]
    if run.get("rc") or not any("metrics" in r for r in recs):
        return None
    fig = {}
    by_case = {}
    for r in recs:
        by_case[r["case"]] = r
        if "metrics" not in r:
            continue
        for m, v in r["metrics"].items():
            fig[(r["case"], m)] = v
        cpu = (r.get("extra") or {}).get("cpu_us_per_job")
        if cpu and cpu.get("server total") is not None:
            fig[(r["case"], "cpu_server_us")] = cpu["server total"]
    if run["workload"] == "f":
        held = next((r for c, r in by_case.items() if c.startswith("snapshot held") and "metrics" in r), None)
        ctl = next((r for c, r in by_case.items() if c.startswith("no snapshot held") and "metrics" in r), None)
        if held and ctl:
            hm, cm = held["metrics"], ctl["metrics"]
            for k, m in (("kept_first", "hold_first_jobs_per_s"), ("kept_last", "hold_last_jobs_per_s"),
                         ("kept_after", "after_jobs_per_s")):
                fig[(HOLD_DERIVED, k)] = ratio(hm.get(m), cm.get("ctl_" + m))
            hw = held.get("extra", {}).get("windows_jobs_per_s") or []
            cw = ctl.get("extra", {}).get("windows_jobs_per_s") or []
            ws = [ratio(x, y) for x, y in zip(hw, cw)] if len(hw) == len(cw) else []
            ws = [x for x in ws if x is not None]
            fig[(HOLD_DERIVED, "lowest_window")] = min(ws) if ws else None
    return fig


def label(m, conf):
    w = conf.get("f", {}).get("window", 20)
    if m in LOCAL:
        return LOCAL[m][0].format(w=w)
    return report.metric_label(m, conf)


def higher_better(m):
    return LOCAL[m][1] if m in LOCAL else report.info(m)[1]


def figure_keys(w, figs):
    keys = []
    for fig in figs:
        for k in fig:
            if k not in keys:
                keys.append(k)
    if w in SHOW:
        order = SHOW[w]
        keys = sorted((k for k in keys if k[1] in order), key=lambda k: order.index(k[1]))
    return keys


def pct(x):
    return "%+.1f %%" % (100.0 * x)


def judge(qs, r, hb):
    """(difference, budget) verdicts from the per-round ratios qs and the ratio r of medians."""
    n = len(qs)
    if n == 0 or r is None:
        return "-", "-"
    lo, hi = min(qs), max(qs)
    half = (hi - lo) / 2.0
    d = r - 1.0
    claim = n >= MIN_ROUNDS and (lo > 1.0 or hi < 1.0) and abs(d) > half
    better = (d > 0) == hb
    if claim:
        diff = "B %s by %.1f %% (%s)" % ("higher" if d > 0 else "lower", 100.0 * abs(d),
                                          "better" if better else "**worse**")
    elif n < MIN_ROUNDS:
        diff = "none claimed: %d round%s" % (n, "" if n == 1 else "s")
    else:
        diff = "none shown (inside the spread)"
    cost = [(1.0 - q) if hb else (q - 1.0) for q in qs]
    cost_med = -d if hb else d
    if n < MIN_ROUNDS:
        budget = "not judged: %d round%s" % (n, "" if n == 1 else "s")
    elif claim and not better and cost_med > BUDGET:
        budget = "**costs more than 5 %%** (%.1f %%)" % (100.0 * cost_med)
    elif max(cost) <= BUDGET:
        budget = "within 5 % in every round"
    elif cost_med <= BUDGET:
        budget = "not resolved: median %s, a round %.1f %% worse" % (
            "better" if cost_med <= 0 else "%.1f %% worse" % (100.0 * cost_med), 100.0 * max(cost))
    else:
        budget = "not resolved: median %.1f %% worse, inside the spread" % (100.0 * cost_med)
    return diff, budget


def spread(xs):
    xs = [x for x in xs if x is not None]
    med = report.median(xs)
    if len(xs) < 2 or not med:
        return "-"
    return "%.1f %%" % (100.0 * (max(xs) - min(xs)) / abs(med))


# ---------------------------------------------------------------- render
def render(meta, runs):
    rounds = sorted({r["round"] for r in runs})
    workloads = [w for w in meta["only"] if any(r["workload"] == w for r in runs)]
    ok_meta = [r["meta"] for r in runs if r.get("meta") and run_figures(r) is not None]
    any_meta = ok_meta[0] if ok_meta else {}
    conf = any_meta.get("conf", {})
    A, B = meta["base"], meta["head"]
    same = A["commit"] == B["commit"]

    figs = {}            # (round, workload, build) -> figures or None
    for r in runs:
        figs[(r["round"], r["workload"], r["build"])] = run_figures(r)

    L = ["# pgqueue, two builds side by side: %s (A) and %s (B)" % (A["commit"][:7], B["commit"][:7]), ""]
    if meta.get("mode") == "quick":
        L += ["> **Quick run** (`--quick`: the benchmark's short sizes). A smoke test of the comparison, "
              "not figures to draw conclusions from.", ""]
    if not meta.get("finished"):
        L += ["> **Unfinished**: the run stopped (or is still running) after %d runs; what follows is "
              "what was measured." % len(runs), ""]
    def subject(x):
        return x if len(x) <= 120 else x[:120].rsplit(" ", 1)[0] + " …"

    L += ["- A (base): `%s` %s; pgqueue.so md5 `%s`" % (A["commit"], subject(A["subject"]), A["so_md5"]),
          "- B (head): `%s` %s; pgqueue.so md5 `%s`" % (B["commit"], subject(B["subject"]), B["so_md5"])]
    if same:
        L.append("- A and B are the same commit, built twice (%s): every difference below is the "
                 "method's own noise." % ("byte-identical pgqueue.so" if A["so_md5"] == B["so_md5"]
                                          else "**the two pgqueue.so differ**"))
    elif A["so_md5"] == B["so_md5"]:
        L.append("- The two commits built to the **same pgqueue.so**: every difference below is noise.")
    h = meta.get("harness", {})
    L += ["- Harness (bench/run.sh, driver.py, the systems' SQL): the checkout ab.sh ran from, at `%s`%s, "
          "the same for both builds" % (h.get("commit", "?")[:12], " with %d modified file(s) under bench/"
                                        % h["modified_files"] if h.get("modified_files") else ""),
          "- Command: `%s`" % meta.get("command", "").strip(),
          "- Date: %s to %s" % (meta.get("started"), meta.get("finished") or "(unfinished)"),
          "- Mode: %s; **%d round%s** (asked: %s); workloads %s; each round runs every workload on A "
          "and on B (A B in odd rounds, B A in even ones) and system 1 on A's build as a control"
          % (meta.get("mode"), len(rounds), "" if len(rounds) == 1 else "s", meta.get("rounds"),
             ", ".join("(%s)" % w for w in workloads)), ""]

    L += ["Every run is `bench/run.sh --no-install --only W --systems 4 --rounds 1` (system 1 for the "
          "control) on a fresh server: initdb, start with pgqueue preloaded, from the build's own copy of "
          "the PostgreSQL 15 installation, into which that commit was built and installed. Within a round "
          "A and B ran one after the other, so a ratio B ÷ A of the same round compares runs close in time; "
          "the control (system 1, no pgqueue code on its path) shows how much the machine itself drifted "
          "between rounds.", "",
          "How to read it: B ÷ A is the ratio of the medians over rounds; the range next to it is the lowest "
          "and highest B ÷ A of single rounds. A difference is claimed only with at least %d rounds, when "
          "every round's ratio is on the same side of 1 and the difference is larger than half the range; "
          "else the table says none shown, whatever the medians' ratio. \"Within 5 %% in every round\": no "
          "round had B more than 5 %% worse than A in the same round (the 5 %% budget); \"not resolved\": "
          "the spread is too wide to say, more rounds are needed." % MIN_ROUNDS, ""]

    # ---- summary
    L += ["## Summary", "",
          "| workload | figure | better | A median | B median | B ÷ A | B ÷ A by round (lowest–highest) "
          "| B better in | difference | 5 % budget | control's spread |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    details = []
    for w in workloads:
        wfigs = [f for (rr, ww, bb), f in figs.items() if ww == w and f]
        keys = figure_keys(w, wfigs)
        det = ["## %s" % report.TITLES.get(w, w), ""]
        if any_meta:
            det += [report.describe(w, conf, any_meta), ""]
        head = ["figure", "build"] + ["round %d (%s)" % (rr, "A B" if rr % 2 else "B A") for rr in rounds]
        head += ["median", "spread (max−min) ÷ median"]
        det += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for case, m in keys:
            hb = higher_better(m)

            def val(rr, b):
                f = figs.get((rr, w, b))
                return None if f is None else f.get((case, m))

            av = [val(rr, "A") for rr in rounds]
            bv = [val(rr, "B") for rr in rounds]
            cv = [val(rr, "control") for rr in rounds]
            qs = [ratio(b, a) for a, b in zip(av, bv)]
            qs_ok = [q for q in qs if q is not None]
            ma, mb = report.median(av), report.median(bv)
            r = ratio(mb, ma)
            diff, budget = judge(qs_ok, r, hb)
            n_better = sum(1 for q in qs_ok if (q > 1) == hb and q != 1)
            name = "%s: %s" % (case, label(m, conf))
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                w, name, "higher" if hb else "lower", report.fmt(ma), report.fmt(mb),
                "-" if r is None else "%.3f" % r,
                "%.3f–%.3f" % (min(qs_ok), max(qs_ok)) if qs_ok else "-",
                "%d of %d" % (n_better, len(qs_ok)) if qs_ok else "-", diff, budget, spread(cv)))

            def cells(xs, missing):
                return [missing(rr) if x is None else report.fmt(x) for rr, x in zip(rounds, xs)]

            def miss(b):
                return lambda rr: "failed" if (rr, w, b) in figs and figs[(rr, w, b)] is None else "-"

            det.append("| %s | A | %s | %s | %s |" % (name, " | ".join(cells(av, miss("A"))),
                                                     report.fmt(ma), spread(av)))
            det.append("|  | B | %s | %s | %s |" % (" | ".join(cells(bv, miss("B"))), report.fmt(mb), spread(bv)))
            det.append("|  | B ÷ A | %s | %s (of medians) | %s |" % (
                " | ".join("-" if q is None else "%.3f" % q for q in qs), "-" if r is None else "%.3f" % r,
                "%.3f–%.3f" % (min(qs_ok), max(qs_ok)) if qs_ok else "-"))
            if any(x is not None for x in cv):
                det.append("|  | sys1 (control) | %s | %s | %s |" % (
                    " | ".join(cells(cv, miss("control"))), report.fmt(report.median(cv)), spread(cv)))
        det.append("")
        details += det
    L += ["", "control's spread: (max − min) ÷ median of system 1's figure over the rounds, on build A's "
          "server: what the machine alone moved between rounds.", ""]

    # ---- machine, settings
    mc = meta.get("machine", {})
    L += ["## Machine", "",
          "- CPU: %s, %s cores (nproc)" % (mc.get("cpu"), mc.get("nproc")),
          "- Memory: %s" % mc.get("memory"),
          "- Kernel: %s" % mc.get("kernel"),
          "- PostgreSQL: %s" % (any_meta.get("machine", {}).get("postgres") or "?"),
          "- Load average (1, 5, 15 min) at the start and end of each run: see Runs below. The machine may "
          "be shared: other work shows up as load above the benchmark's own (about the number of cores) "
          "and as spread between rounds, in the control as much as in A and B."]
    la = [float(x.split()[0]) for r in runs for x in (r.get("loadavg_start"), r.get("loadavg_end")) if x]
    if la:
        busy = max(la) > 1.5 * (mc.get("nproc") or 1)
        L.append("- 1-minute load average over the runs: %.2f to %.2f on %s cores%s" % (
            min(la), max(la), mc.get("nproc"),
            ": **other work shared the machine**, expect wide spreads" if busy else ""))
    L.append("")
    if any_meta:
        L += ["## Server settings", "",
              "Each run's throwaway server (bench/run.sh: initdb defaults plus this file, included from "
              "postgresql.conf; the port and socket directory differ per run):", "", "```",
              any_meta.get("conf_file", "").rstrip(), "```", "",
              "Effective values: " + ", ".join("`%s = %s`" % kv for kv in any_meta.get("settings", {}).items())]
        differ = sorted({k for m2 in ok_meta for k, v in m2.get("settings", {}).items()
                         if any_meta.get("settings", {}).get(k) != v})
        if differ:
            L.append("")
            L.append("**Settings that differed between runs**: %s" % ", ".join(differ))
        L.append("")
        notes = []
        for b in ("A", "B"):
            for r in runs:
                if r["build"] == b and r.get("meta"):
                    for n in r["meta"].get("notes", []):
                        if "pgqueue" in n and "%s: %s" % (b, n) not in notes:
                            notes.append("%s: %s" % (b, n))
        if notes:
            L += ["Notes of the harness:", ""] + ["- %s" % n for n in notes] + [""]

    L += details

    # ---- runs
    L += ["## Runs", "",
          "In the order they ran; load average (1, 5, 15 min, /proc/loadavg) read by ab.sh before and after "
          "each run (server start and stop included), on a machine of %s cores." % mc.get("nproc", "?"), "",
          "| run | round | workload | build | start | loadavg at start | end | loadavg at end | s | result |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        f = figs.get((r["round"], r["workload"], r["build"]))
        errs = [x for x in r.get("results", []) if "error" in x and x.get("system") == r["system"]]
        res = "ok" if f is not None and not errs else ("failed (exit %s)" % r["rc"] if f is None else "error")
        L.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["run"], r["round"], r["workload"], r["build"] if r["build"] == "control" else "%s (%s)" % (
                r["build"], (A if r["build"] == "A" else B)["commit"][:7]),
            r["start"], r["loadavg_start"], r["end"], r["loadavg_end"], r["seconds"], res))
    L.append("")
    failed = [r for r in runs if r.get("log_tail") or any(
        "error" in x and x.get("system") == r["system"] for x in r.get("results", []))]
    if failed:
        L += ["## Failed runs", ""]
        for r in failed:
            L.append("Run %d (round %d, (%s), %s), exit %s:" % (r["run"], r["round"], r["workload"],
                                                                 r["build"], r["rc"]))
            for x in r.get("results", []):
                if "error" in x:
                    L.append("- %s %s: %s" % (x["system"], x["case"], x["error"].splitlines()[0]))
            if r.get("log_tail"):
                L += ["", "```", r["log_tail"].rstrip(), "```"]
            L.append("")
    return "\n".join(L) + "\n"


def cmd_render(a):
    with open(a.raw + ".meta.json") as f:
        meta = json.load(f)
    with open(a.raw) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    text = render(meta, runs)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("init")
    s.add_argument("raw")
    s.add_argument("--command", default="")
    s.add_argument("--mode", default="")
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--only", required=True, help="workloads, space separated")
    s.add_argument("--base", nargs=3, required=True, metavar=("COMMIT", "SUBJECT", "SO_MD5"))
    s.add_argument("--head", nargs=3, required=True, metavar=("COMMIT", "SUBJECT", "SO_MD5"))
    s.add_argument("--harness", nargs=2, required=True, metavar=("COMMIT", "MODIFIED"))
    s.set_defaults(fn=cmd_init)
    s = sub.add_parser("add")
    s.add_argument("raw")
    for k in ("--run", "--round", "--port", "--rc", "--seconds"):
        s.add_argument(k, type=int, required=True)
    for k in ("--workload", "--build", "--start", "--end", "--results", "--log"):
        s.add_argument(k, required=True)
    s.add_argument("--loadavg", nargs=2, required=True)
    s.set_defaults(fn=cmd_add)
    s = sub.add_parser("finish")
    s.add_argument("raw")
    s.set_defaults(fn=cmd_finish)
    s = sub.add_parser("render")
    s.add_argument("raw")
    s.add_argument("out", nargs="?")
    s.set_defaults(fn=cmd_render)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
