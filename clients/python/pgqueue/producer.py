"""The producer side: push jobs on the caller's own connection.

Both functions run one statement on the connection (or cursor) they are given
and never commit: inside the caller's transaction the jobs exist only if it
commits; on an autocommit connection the statement commits by itself.
Statements are never prepared on the server (``prepare=False``), so the
functions are safe on any connection, PgBouncer in transaction pooling
included.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, List, Optional, Union
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

Executor = Union[psycopg.Connection, psycopg.Cursor]
Delay = Union[float, int, timedelta]

#: pgq_push_batch takes at most this many payloads per call.
BATCH_LIMIT = 10_000

_PUSH = (
    "SELECT pgq_push(%s, %s, coalesce(%s::timestamptz, now() + %s::interval), %s, %s)"
)
_PUSH_BATCH = (
    "SELECT pgq_push_batch(%s, %s::jsonb[], "
    "coalesce(%s::timestamptz, now() + %s::interval), %s)"
)


def as_interval(value: Optional[Delay]) -> Optional[timedelta]:
    """A number of seconds or a timedelta as a timedelta (None stays None)."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def push(
    conn: Executor,
    queue: str,
    payload: Any = None,
    *,
    run_after: Optional[datetime] = None,
    delay: Optional[Delay] = None,
    priority: int = 0,
    dedup_key: Optional[str] = None,
) -> UUID:
    """Push one job and return its id.

    ``payload`` is anything psycopg can dump as JSON (default ``{}``).
    ``run_after`` (a timestamp) or ``delay`` (seconds or a timedelta from now)
    postpone it; higher ``priority`` runs first within the queue; with a
    ``dedup_key`` a push while an unfinished job has the same key returns
    that job's id and adds nothing.
    """
    row = conn.execute(
        _PUSH,
        [queue, Jsonb({} if payload is None else payload), run_after,
         as_interval(delay), priority, dedup_key],
        prepare=False,
    ).fetchone()
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
) -> List[UUID]:
    """Push one job per payload and return their ids, in payload order.

    Sent as ``pgq_push_batch`` calls of up to 10,000 payloads each; on a
    connection in a transaction they all commit (or not) together.
    """
    items = [Jsonb({} if p is None else p) for p in payloads]
    ids: List[UUID] = []
    for start in range(0, len(items), BATCH_LIMIT):
        rows = conn.execute(
            _PUSH_BATCH,
            [queue, items[start:start + BATCH_LIMIT], run_after,
             as_interval(delay), priority],
            prepare=False,
        ).fetchall()
        ids.extend(r[0] for r in rows)
    return ids
