"""The command line: ``python3 -m pgqueue [--dsn DSN] COMMAND ...``.

Commands: ``stats``, ``jobs``, ``push``, ``retry``, ``cancel``, ``purge``
(``jobs``, ``retry``, ``cancel`` and ``purge`` need pgqueue 1.1, ``push
--max-tries``, ``push --after`` and ``--group-key`` pgqueue 1.2; with 1.2
``stats`` shows each queue's waiting jobs and ``jobs`` each job's
``waiting_for``).  The
connection string comes from ``--dsn``, else ``$PGQUEUE_DSN``, else
libpq's environment (``PGHOST``, ``PGDATABASE``, ...).  Exit status: 0 on
success, 1 when the operation found nothing to do (``retry`` of a job that
is not failed, ``cancel`` of a job that does not exist), 2 on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence
from uuid import UUID

import psycopg

from . import admin
from .errors import PgQueueError
from .producer import push


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\n", " | ")


def _print_rows(rows: List[Dict[str, Any]], as_json: bool, width: int = 60) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row, default=str))
        return
    if not rows:
        print("(none)")
        return
    cols = list(rows[0])
    cells = [[_cell(r[c])[:width] for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id (a UUID): {text!r}") from None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"payload is not JSON: {err}") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the tests and for --help)."""
    p = argparse.ArgumentParser(prog="python3 -m pgqueue",
                                description="Inspect and operate pgqueue queues.")
    p.add_argument("--dsn", default=os.environ.get("PGQUEUE_DSN", ""),
                   help="libpq connection string (default: $PGQUEUE_DSN, else libpq's "
                        "PG* environment)")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("stats", help="per-queue counts (pgq_stats)")

    j = sub.add_parser("jobs", help="list unfinished jobs (pgqueue.jobs, pgqueue 1.1)")
    j.add_argument("--queue")
    j.add_argument("--state", choices=admin.JOB_STATES)
    j.add_argument("--limit", type=int, default=100)

    s = sub.add_parser("push", help="push one job; prints its id")
    s.add_argument("queue")
    s.add_argument("payload", nargs="?", type=_json, default={},
                   help="JSON payload (default {})")
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--delay", type=float, help="seconds before the job is due")
    s.add_argument("--dedup-key")
    s.add_argument("--max-tries", type=int,
                   help="the job's own limit of tries, instead of its queue's "
                        "(at least 1; pgqueue 1.2)")
    s.add_argument("--after", type=_uuid, action="append", metavar="ID",
                   help="a job this one waits for: it stays waiting until the last "
                        "of them is acked (repeatable; pgqueue 1.2)")
    s.add_argument("--group-key",
                   help="the job's group: in a queue with group_max_in_flight, at most "
                        "that many jobs of a group run at once, in order (pgqueue 1.2)")

    r = sub.add_parser("retry", help="put a failed job (or all of a queue's) back to "
                                     "pending (pgqueue 1.1)")
    rg = r.add_mutually_exclusive_group(required=True)
    rg.add_argument("id", nargs="?", type=_uuid)
    rg.add_argument("--failed", metavar="QUEUE", help="every failed job of QUEUE")

    c = sub.add_parser("cancel", help="remove a job in any state (pgqueue 1.1)")
    c.add_argument("id", type=_uuid)

    g = sub.add_parser("purge", help="remove every job of a queue in a state "
                                     "(pgqueue 1.1)")
    g.add_argument("queue")
    g.add_argument("--state", default="failed", choices=admin.PURGE_STATES)
    return p


def run(args: argparse.Namespace, conn: psycopg.Connection) -> int:
    """Carry out one parsed command on ``conn``; returns the exit status."""
    if args.command == "stats":
        _print_rows(admin.stats(conn), args.json)
    elif args.command == "jobs":
        _print_rows(admin.jobs(conn, args.queue, args.state, args.limit), args.json)
    elif args.command == "push":
        print(push(conn, args.queue, args.payload, delay=args.delay,
                   priority=args.priority, dedup_key=args.dedup_key,
                   max_tries=args.max_tries, after=args.after, group_key=args.group_key))
    elif args.command == "retry" and args.failed is not None:
        print(f"{admin.retry_failed(conn, args.failed)} job(s) of {args.failed} retried")
    elif args.command == "retry":
        if not admin.retry(conn, args.id):
            print(f"job {args.id} was not retried: it is not failed (or does not exist)")
            return 1
        print(f"job {args.id} retried")
    elif args.command == "cancel":
        if not admin.cancel(conn, args.id):
            print(f"job {args.id} was not cancelled: no such job")
            return 1
        print(f"job {args.id} cancelled")
    elif args.command == "purge":
        print(f"{admin.purge(conn, args.queue, args.state)} {args.state} job(s) of "
              f"{args.queue} purged")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python3 -m pgqueue``."""
    args = build_parser().parse_args(argv)
    try:
        with psycopg.connect(args.dsn, autocommit=True, prepare_threshold=None) as conn:
            return run(args, conn)
    except PgQueueError as err:
        print(f"pgqueue: {err}", file=sys.stderr)
        return 2
    except psycopg.errors.InsufficientPrivilege as err:
        print(f"pgqueue: {str(err).strip()}\nhint: this needs the pgqueue_admin role "
              "(pgqueue_producer for push)", file=sys.stderr)
        return 2
    except psycopg.errors.UndefinedFunction as err:
        print(f"pgqueue: {str(err).strip()}\nhint: is the extension created in this "
              "database? CREATE EXTENSION pgqueue", file=sys.stderr)
        return 2
    except psycopg.Error as err:
        print(f"pgqueue: {str(err).strip()}", file=sys.stderr)
        return 2
