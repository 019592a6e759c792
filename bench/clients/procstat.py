"""CPU time from /proc for bench/clients.sh: a process's own, and a whole
PostgreSQL server's (the postmaster and every process under it).

    python3 procstat.py server DATADIR [--wait-for ROLE,...]
        waits until the server is quiet (below), then prints the server's
        CPU ticks so far (utime + stime, in clock ticks of SC_CLK_TCK).

The server's CPU is the postmaster's own utime + stime, plus cutime +
cstime (the children it has waited for: every backend that ended), plus
utime + stime of every live child.  Two samples' difference is then the CPU
that all its processes used in between, backends that came and went
included, provided no child ends between the reading of the postmaster and
the reading of its children.  So a sample is taken when the server is
quiet: no zombie child (ended, not yet waited for) and no client backend of
the given roles (a drain's, or psql's); 10 s at most, then it samples
anyway and says so on stderr.
"""

import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid):
    """The fields of /proc/PID/stat from field 3 (state) on, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()


def own_ticks(pid="self"):
    """utime + stime of a process (all its threads, the ended ones too)."""
    f = stat_fields(pid)
    return int(f[11]) + int(f[12])


def postmaster_pid(datadir):
    with open(os.path.join(datadir, "postmaster.pid")) as f:
        return int(f.readline())


def children(ppid):
    """{pid: stat fields} of the live processes whose parent is ppid."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = stat_fields(int(name))
            if f is not None and int(f[1]) == ppid:
                out[int(name)] = f
    return out


def title(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def busy(pm, roles):
    """What keeps the server from being quiet: zombies, backends of roles."""
    what = []
    for pid, f in children(pm).items():
        if f[0] == "Z":
            what.append(f"{pid} (ended)")
        else:
            t = title(pid)   # a client backend: "postgres: ROLE DB [local] idle"
            if any(t.startswith(f"postgres: {r} ") for r in roles):
                what.append(f"{pid} ({t})")
    return what


def server_ticks(pm, roles=(), timeout=10.0):
    """The server's CPU ticks so far, read once it is quiet (see above)."""
    deadline = time.monotonic() + timeout
    while True:
        left = busy(pm, roles)
        if not left:
            break
        if time.monotonic() > deadline:
            print(f"procstat: server not quiet after {timeout:.0f} s: {', '.join(left)}",
                  file=sys.stderr)
            break
        time.sleep(0.02)
    f = stat_fields(pm)
    total = sum(int(x) for x in f[11:15])   # utime, stime, cutime, cstime
    for c in children(pm).values():
        total += sum(int(x) for x in c[11:15])
    return total


def main(argv):
    if len(argv) >= 2 and argv[0] == "server":
        roles = ()
        if len(argv) == 4 and argv[2] == "--wait-for":
            roles = tuple(argv[3].split(","))
        print(server_ticks(postmaster_pid(argv[1]), roles))
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
