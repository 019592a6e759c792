"""CPU time by process class, read from /proc/<pid>/stat (utime + stime, in
clock ticks of sysconf(CLK_TCK)), for the "CPU per finished job" figures.

Classes of the benchmark server's processes, found in pg_stat_activity:
  producers    server backends of the producer clients (application_name
               bench-producer, set by the driver through PGAPPNAME)
  consumers    server backends of the consumer clients (bench-consumer)
  scheduler    pgqueue's background worker (backend_type 'pgqueue
               scheduler'), or the harness's plpgsql scheduler loop for
               sys3 (application_name bench-sys3-scheduler)
  server other the server's own background processes (walwriter,
               checkpointer, background writer, autovacuum launcher and
               workers, pgqueue's launcher, ...)
and of the client processes, by pid (pgbench, one process per role).

A sample is taken at the start and at the end of the measured window; a
process that appears during the window counts from 0 (its start-up is
included), one that ends during the window is lost (short autovacuum
workers: "server other" is a lower bound).
"""

import os

TICK = os.sysconf("SC_CLK_TCK")

CLASSES_SQL = """
SELECT pid,
       CASE WHEN application_name = 'bench-producer' THEN 'producers'
            WHEN application_name = 'bench-consumer' THEN 'consumers'
            WHEN backend_type = 'pgqueue scheduler'
              OR application_name LIKE 'bench-%%-scheduler' THEN 'scheduler'
            ELSE 'server other' END
  FROM pg_stat_activity
 WHERE application_name IN ('bench-producer', 'bench-consumer')
    OR application_name LIKE 'bench-%%-scheduler'
    OR backend_type NOT IN ('client backend')
"""

SERVER_CLASSES = ("producers", "consumers", "scheduler", "server other")


def proc_ticks(pid):
    """utime + stime of a process (all its threads), or None if it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()   # fields[0] is field 3 (state)
    return int(fields[11]) + int(fields[12])  # fields 14 and 15


def sample(conn, clients=None):
    """{class: {pid: ticks}} for the server's processes and the given client
    processes ({class: [pid, ...]})."""
    out = {}
    for pid, cls in conn.execute(CLASSES_SQL).fetchall():
        t = proc_ticks(pid)
        if t is not None:
            out.setdefault(cls, {})[pid] = t
    for cls, pids in (clients or {}).items():
        for pid in pids:
            t = proc_ticks(pid)
            if t is not None:
                out.setdefault(cls, {})[pid] = t
    return out


def diff_seconds(a, b):
    """CPU seconds by class between samples a and b."""
    res = {}
    for cls, pids in b.items():
        ticks = 0
        for pid, t in pids.items():
            ticks += t - a.get(cls, {}).get(pid, 0)
        res[cls] = ticks / float(TICK)
    return res


def per_job_us(a, b, jobs, client_classes=()):
    """{class: us per job} plus 'server total' and 'total with clients'."""
    if not jobs:
        return None
    secs = diff_seconds(a, b)
    res = {cls: secs.get(cls, 0.0) * 1e6 / jobs for cls in SERVER_CLASSES}
    for cls in client_classes:
        res[cls] = secs.get(cls, 0.0) * 1e6 / jobs
    res["server total"] = sum(res[c] for c in SERVER_CLASSES)
    res["total with clients"] = res["server total"] + sum(res[c] for c in client_classes)
    return res
