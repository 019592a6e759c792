"""Operating a queue: statistics, settings, listing jobs, retry, cancel, purge.

``stats`` and ``counters`` read ``pgq_stats()`` and ``pgq_counters()``;
``configure``, ``pause`` and ``resume`` call ``pgq_configure`` (pgqueue 1.0,
but ``retention`` is 1.1's, ``rate_limit`` and ``rate_period`` 1.2's).
``jobs``, ``retry``, ``retry_failed``, ``cancel`` and ``purge`` use the
``pgqueue.jobs`` view and functions of pgqueue 1.1.  On an older
installation what needs a newer one raises
:class:`NeedsNewerExtension`, which says what to run; the server's other
errors (a bad value: ``psycopg.errors.InvalidParameterValue``, 22023) are
raised as they are.  All need the ``pgqueue_admin`` role, and run on the
caller's connection without committing (in its transaction, if any).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List, Optional, Union
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from .errors import NeedsNewerExtension
from .producer import as_interval

Executor = psycopg.Connection

#: The states pgqueue.jobs shows (pgqueue 1.1; ``waiting``, for parents, 1.2).
JOB_STATES = ("pending", "retry", "scheduled", "running", "failed", "waiting")
#: The states pgq_purge accepts (``waiting``: pgqueue 1.2).
PURGE_STATES = ("pending", "retry", "failed", "waiting")


def _rows(conn: Executor, query: str, params: Any = None) -> List[Dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params, prepare=False)
        return cur.fetchall()


def _needs(conn: Executor, what: str, version: str, err: Exception) -> NeedsNewerExtension:
    """The error to raise when an object of pgqueue ``version`` is missing
    (``err`` is the server's)."""
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
        f"{what} needs pgqueue {version}; this database has pgqueue {have} "
        f"(run ALTER EXTENSION pgqueue UPDATE once {version} is installed) [{err}]")


def _needs_1_1(conn: Executor, what: str, err: Exception) -> NeedsNewerExtension:
    """The error to raise when a 1.1 object is missing (``err`` is the server's)."""
    return _needs(conn, what, "1.1", err)


def _one(conn: Executor, what: str, query: str, params: Any) -> Any:
    try:
        row = conn.execute(query, params, prepare=False).fetchone()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedTable) as err:
        raise _needs_1_1(conn, what, err) from err
    assert row is not None
    return row[0]


def stats(conn: Executor) -> List[Dict[str, Any]]:
    """One dict per queue: pending, retry, scheduled, in_flight, failed,
    oldest_ready, and with pgqueue 1.2 waiting (its jobs waiting for
    parents: flows); an older pgqueue's dicts have no ``waiting``."""
    return _rows(conn, "SELECT * FROM pgq_stats() ORDER BY queue")


def counters(conn: Executor) -> Dict[str, Any]:
    """The cumulative counters since server start (needs the library preloaded)."""
    return _rows(conn, "SELECT * FROM pgq_counters()")[0]


def jobs(conn: Executor, queue: Optional[str] = None, state: Optional[str] = None,
         limit: int = 100) -> List[Dict[str, Any]]:
    """Unfinished jobs from the ``pgqueue.jobs`` view, oldest first (pgqueue 1.1).

    With pgqueue 1.2 each dict has ``waiting_for`` too: the job's parents
    not yet acked (0 unless its state is ``waiting``).
    """
    # waiting_for through to_jsonb: the view of 1.1 has no such column
    query = ("SELECT id, queue, state, priority, run_after, created, tries, max_tries,"
             " lock_key, lock_timeout, last_error, payload,"
             " pg_catalog.to_jsonb(j) -> 'waiting_for' AS waiting_for FROM pgqueue.jobs j"
             " WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)"
             " AND (%(state)s::text IS NULL OR state::text = %(state)s)"
             " ORDER BY created, id LIMIT %(limit)s")
    try:
        rows = _rows(conn, query, {"queue": queue, "state": state, "limit": limit})
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as err:
        raise _needs_1_1(conn, "listing jobs (pgqueue.jobs)", err) from err
    for row in rows:
        if row["waiting_for"] is None:  # pgqueue 1.1
            del row["waiting_for"]
    return rows


def retry(conn: Executor, job_id: UUID) -> bool:
    """Put a failed job back to pending; False when it is not failed (pgqueue 1.1)."""
    return bool(_one(conn, "pgq_retry", "SELECT pgq_retry(%s)", [job_id]))


def retry_failed(conn: Executor, queue: str) -> int:
    """Retry every failed job of ``queue``; returns how many (pgqueue 1.1)."""
    return int(_one(conn, "pgq_retry_failed", "SELECT pgq_retry_failed(%s)", [queue]))


def cancel(conn: Executor, job_id: UUID) -> bool:
    """Remove a job in any state; False when there is no such job (pgqueue 1.1).

    The jobs waiting for it (pgqueue 1.2), and theirs, are cancelled with it.
    """
    return bool(_one(conn, "pgq_cancel", "SELECT pgq_cancel(%s)", [job_id]))


def purge(conn: Executor, queue: str, state: str = "failed") -> int:
    """Remove every job of ``queue`` in ``state``; returns how many (pgqueue 1.1).

    ``state`` is one of :data:`PURGE_STATES` (``waiting``: pgqueue 1.2).
    The jobs waiting for a purged job (pgqueue 1.2), and theirs, are
    cancelled with it.
    """
    return int(_one(conn, "pgq_purge", "SELECT pgq_purge(%s, %s)", [queue, state]))


#: pgq_configure's settings and their SQL types.
SETTINGS = {"weight": "int", "max_in_flight": "int", "max_tries": "int", "paused": "boolean",
            "retention": "interval", "rate_limit": "int", "rate_period": "interval",
            "group_max_in_flight": "int"}
#: The settings given as an interval: seconds, a timedelta or an interval's text.
_INTERVALS = ("retention", "rate_period")

Interval = Union[None, float, timedelta, str]


def configure(conn: Executor, queue: str, *, weight: Optional[int] = None,
              max_in_flight: Optional[int] = None, max_tries: Optional[int] = None,
              paused: Optional[bool] = None, retention: Interval = None,
              rate_limit: Optional[int] = None, rate_period: Interval = None,
              group_max_in_flight: Optional[int] = None) -> None:
    """Set a queue's settings (``pgq_configure``); those not given stay as they are.

    ``weight`` 1 to 10,000 (its share of each scheduling pass),
    ``max_in_flight`` (its jobs in work_queue at once, claimed or not; 0
    removes the cap), ``max_tries`` (at least 1), ``paused`` (a paused
    queue's jobs are not scheduled), ``retention`` (seconds, a timedelta or
    an interval's text: how long its finished jobs stay in the archive;
    pgqueue 1.1), ``rate_limit`` and ``rate_period`` (at most
    ``rate_limit`` of its jobs scheduled in any window of ``rate_period``;
    ``rate_limit=0`` removes the limit; ``rate_period`` as ``retention``,
    10 ms to 1 day, no months; pgqueue 1.2), ``group_max_in_flight`` (at
    most that many jobs of one group in flight at once, the groups served
    in turn; 0 removes the limit; pgqueue 1.2).  A value out of range raises
    ``psycopg.errors.InvalidParameterValue`` and changes nothing.

    Only the settings given are sent (by name), so a call without
    ``rate_limit``, ``rate_period`` and ``group_max_in_flight`` works with pgqueue 1.1 (and, without
    ``retention``, 1.0) as before; given to an older installation they raise
    :class:`NeedsNewerExtension`.
    """
    given = {name: value for name, value in (
        ("weight", weight), ("max_in_flight", max_in_flight), ("max_tries", max_tries),
        ("paused", paused), ("retention", retention), ("rate_limit", rate_limit),
        ("rate_period", rate_period), ("group_max_in_flight", group_max_in_flight))
        if value is not None}
    for name in _INTERVALS:
        if name in given and not isinstance(given[name], str):
            given[name] = as_interval(given[name])
    args = "".join(f", {name} => %({name})s::{SETTINGS[name]}" for name in given)
    query = f"SELECT pgq_configure(%(queue)s::text{args})"
    try:
        conn.execute(query, {"queue": queue, **given}, prepare=False)
    except psycopg.errors.UndefinedFunction as err:
        if rate_limit is not None or rate_period is not None:
            raise _needs(conn, "pgq_configure(rate_limit => ..., rate_period => ...)", "1.2",
                         err) from err
        if group_max_in_flight is not None:
            raise _needs(conn, "pgq_configure(group_max_in_flight => ...)", "1.2", err) from err
        if retention is None:
            raise
        raise _needs_1_1(conn, "pgq_configure(retention => ...)", err) from err


def pause(conn: Executor, queue: str) -> None:
    """Pause ``queue``: its jobs are no longer scheduled (those already in
    work_queue may still be claimed) until :func:`resume`."""
    configure(conn, queue, paused=True)


def resume(conn: Executor, queue: str) -> None:
    """Schedule the jobs of a paused ``queue`` again."""
    configure(conn, queue, paused=False)
