"""Operating a queue: statistics, listing jobs, retry, cancel, purge.

``stats`` and ``counters`` read ``pgq_stats()`` and ``pgq_counters()``
(pgqueue 1.0).  ``jobs``, ``retry``, ``retry_failed``, ``cancel`` and
``purge`` use the ``pgqueue.jobs`` view and functions of pgqueue 1.1; on an
older installation they raise :class:`NeedsNewerExtension`, which says
what to run.  All need the ``pgqueue_admin`` role.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from .errors import NeedsNewerExtension

Executor = psycopg.Connection

#: The states pgqueue.jobs shows (pgqueue 1.1).
JOB_STATES = ("pending", "retry", "scheduled", "running", "failed")
#: The states pgq_purge accepts.
PURGE_STATES = ("pending", "retry", "failed")


def _rows(conn: Executor, query: str, params: Any = None) -> List[Dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params, prepare=False)
        return cur.fetchall()


def _needs_1_1(conn: Executor, what: str, err: Exception) -> NeedsNewerExtension:
    """The error to raise when a 1.1 object is missing (``err`` is the server's)."""
    if not conn.autocommit:
        conn.rollback()
    try:
        row = conn.execute(
            "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pgqueue'",
            prepare=False).fetchone()
    except psycopg.Error:
        row = None
    have = row[0] if row else "not installed"
    return NeedsNewerExtension(
        f"{what} needs pgqueue 1.1; this database has pgqueue {have} "
        f"(run ALTER EXTENSION pgqueue UPDATE once 1.1 is installed) [{err}]")


def _one(conn: Executor, what: str, query: str, params: Any) -> Any:
    try:
        row = conn.execute(query, params, prepare=False).fetchone()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedTable) as err:
        raise _needs_1_1(conn, what, err) from err
    assert row is not None
    return row[0]


def stats(conn: Executor) -> List[Dict[str, Any]]:
    """One dict per queue: pending, retry, scheduled, in_flight, failed, oldest_ready."""
    return _rows(conn, "SELECT * FROM pgq_stats() ORDER BY queue")


def counters(conn: Executor) -> Dict[str, Any]:
    """The cumulative counters since server start (needs the library preloaded)."""
    return _rows(conn, "SELECT * FROM pgq_counters()")[0]


def jobs(conn: Executor, queue: Optional[str] = None, state: Optional[str] = None,
         limit: int = 100) -> List[Dict[str, Any]]:
    """Unfinished jobs from the ``pgqueue.jobs`` view, oldest first (pgqueue 1.1)."""
    query = ("SELECT id, queue, state, priority, run_after, created, tries, max_tries,"
             " lock_key, lock_timeout, last_error, payload FROM pgqueue.jobs"
             " WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)"
             " AND (%(state)s::text IS NULL OR state::text = %(state)s)"
             " ORDER BY created, id LIMIT %(limit)s")
    try:
        return _rows(conn, query, {"queue": queue, "state": state, "limit": limit})
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as err:
        raise _needs_1_1(conn, "listing jobs (pgqueue.jobs)", err) from err


def retry(conn: Executor, job_id: UUID) -> bool:
    """Put a failed job back to pending; False when it is not failed (pgqueue 1.1)."""
    return bool(_one(conn, "pgq_retry", "SELECT pgq_retry(%s)", [job_id]))


def retry_failed(conn: Executor, queue: str) -> int:
    """Retry every failed job of ``queue``; returns how many (pgqueue 1.1)."""
    return int(_one(conn, "pgq_retry_failed", "SELECT pgq_retry_failed(%s)", [queue]))


def cancel(conn: Executor, job_id: UUID) -> bool:
    """Remove a job in any state; False when there is no such job (pgqueue 1.1)."""
    return bool(_one(conn, "pgq_cancel", "SELECT pgq_cancel(%s)", [job_id]))


def purge(conn: Executor, queue: str, state: str = "failed") -> int:
    """Remove every job of ``queue`` in ``state``; returns how many (pgqueue 1.1)."""
    return int(_one(conn, "pgq_purge", "SELECT pgq_purge(%s, %s)", [queue, state]))
