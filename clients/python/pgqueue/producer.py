"""The producer side: push jobs on the caller's own connection.

Both functions run one statement on the connection (or cursor) they are given
and never commit: inside the caller's transaction the jobs exist only if it
commits; on an autocommit connection the statement commits by itself.
Statements are never prepared on the server (``prepare=False``), so the
functions are safe on any connection, PgBouncer in transaction pooling
included.

``max_tries`` (a job's own limit of tries) needs pgqueue 1.2: it is passed
to the server only when given (``max_tries => ...``), so without it the
functions work with pgqueue 1.0 and 1.1 as before; given to an older
installation it raises :class:`NeedsNewerExtension`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, List, Optional, Union
from uuid import UUID

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from .errors import NeedsNewerExtension

Executor = Union[psycopg.Connection, psycopg.Cursor]
Delay = Union[float, int, timedelta]

#: pgq_push_batch takes at most this many payloads per call.
BATCH_LIMIT = 10_000

_PUSH = (
    "SELECT pgq_push(%s, %s, coalesce(%s::timestamptz, now() + %s::interval), %s, %s{})"
)
_PUSH_BATCH = (
    "SELECT pgq_push_batch(%s, %s::jsonb[], "
    "coalesce(%s::timestamptz, now() + %s::interval), %s{})"
)
# pgq_push's and pgq_push_batch's max_tries (pgqueue 1.2), by name: only
# when given, so that a call without it works on pgqueue 1.0 and 1.1.
_MAX_TRIES = ", max_tries => %s::int"


def as_interval(value: Optional[Delay]) -> Optional[timedelta]:
    """A number of seconds or a timedelta as a timedelta (None stays None)."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def _needs_1_2(conn: Executor, what: str, err: Exception) -> NeedsNewerExtension:
    """The error to raise when ``max_tries`` met a pgq_push without it (42883).

    The caller's transaction is left as it is (never rolled back here): on a
    connection outside a transaction the version found is read and named;
    in a transaction the error aborted it cannot be, and is said unknown.
    """
    connection = conn.connection if isinstance(conn, psycopg.Cursor) else conn
    have = "of an unknown version (the transaction is aborted)"
    if connection.info.transaction_status == TransactionStatus.IDLE:
        try:
            row = connection.execute(
                "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pgqueue'",
                prepare=False).fetchone()
            have = row[0] if row else "not installed"
        except psycopg.Error:
            pass
    return NeedsNewerExtension(
        f"{what} needs pgqueue 1.2; this database has pgqueue {have} "
        f"(run ALTER EXTENSION pgqueue UPDATE once 1.2 is installed) [{err}]")


def push(
    conn: Executor,
    queue: str,
    payload: Any = None,
    *,
    run_after: Optional[datetime] = None,
    delay: Optional[Delay] = None,
    priority: int = 0,
    dedup_key: Optional[str] = None,
    max_tries: Optional[int] = None,
) -> UUID:
    """Push one job and return its id.

    ``payload`` is anything psycopg can dump as JSON (default ``{}``).
    ``run_after`` (a timestamp) or ``delay`` (seconds or a timedelta from now)
    postpone it; higher ``priority`` runs first within the queue; with a
    ``dedup_key`` a push while an unfinished job has the same key returns
    that job's id and adds nothing.  ``max_tries`` (pgqueue 1.2) is the
    job's own limit of tries, instead of its queue's (``None``: the
    queue's): below 1 the server raises
    ``psycopg.errors.InvalidParameterValue`` (22023); on an older pgqueue
    :class:`NeedsNewerExtension`.
    """
    params = [queue, Jsonb({} if payload is None else payload), run_after,
              as_interval(delay), priority, dedup_key]
    if max_tries is not None:
        params.append(max_tries)
    try:
        row = conn.execute(
            _PUSH.format(_MAX_TRIES if max_tries is not None else ""),
            params,
            prepare=False,
        ).fetchone()
    except psycopg.errors.UndefinedFunction as err:
        if max_tries is None:
            raise
        raise _needs_1_2(conn, "push with max_tries", err) from err
    assert row is not None
    return row[0]


def push_batch(
    conn: Executor,
    queue: str,
    payloads: Iterable[Any],
    *,
    run_after: Optional[datetime] = None,
    delay: Optional[Delay] = None,
    priority: int = 0,
    max_tries: Optional[int] = None,
) -> List[UUID]:
    """Push one job per payload and return their ids, in payload order.

    Sent as ``pgq_push_batch`` calls of up to 10,000 payloads each; on a
    connection in a transaction they all commit (or not) together.
    ``max_tries`` (pgqueue 1.2) applies to every job of the batch, as in
    :func:`push`.
    """
    items = [Jsonb({} if p is None else p) for p in payloads]
    ids: List[UUID] = []
    query = _PUSH_BATCH.format(_MAX_TRIES if max_tries is not None else "")
    for start in range(0, len(items), BATCH_LIMIT):
        params = [queue, items[start:start + BATCH_LIMIT], run_after,
                  as_interval(delay), priority]
        if max_tries is not None:
            params.append(max_tries)
        try:
            rows = conn.execute(query, params, prepare=False).fetchall()
        except psycopg.errors.UndefinedFunction as err:
            if max_tries is None:
                raise
            raise _needs_1_2(conn, "push_batch with max_tries", err) from err
        ids.extend(r[0] for r in rows)
    return ids
