"""The producer side: push jobs on the caller's own connection.

Both functions run one statement on the connection (or cursor) they are given
and never commit: inside the caller's transaction the jobs exist only if it
commits; on an autocommit connection the statement commits by itself.
Statements are never prepared on the server (``prepare=False``), so the
functions are safe on any connection, PgBouncer in transaction pooling
included.

``max_tries`` (a job's own limit of tries), ``after`` (the jobs it waits
for: flows) and ``group_key`` (its group) need pgqueue 1.2: each is passed
to the server only when given (``max_tries => ...``, ``after => ...``,
``group_key => ...``), so without them the functions work with pgqueue 1.0
and 1.1 as before; given to an older installation they raise
:class:`NeedsNewerExtension`.
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
# pgq_push's and pgq_push_batch's max_tries, after and group_key (pgqueue
# 1.2), by name: only when given, so that a call without them works on
# pgqueue 1.0 and 1.1.
_NAMED_1_2 = (("max_tries", "int"), ("after", "uuid[]"), ("group_key", "text"))

#: A job's parents (``after``): job ids, as UUIDs or their text.
Parents = Iterable[Union[UUID, str]]


def _named_1_2(**values: Any) -> tuple:
    """The named arguments of 1.2 given (not None): their SQL and values."""
    given = [(name, cast, values[name]) for name, cast in _NAMED_1_2
             if values.get(name) is not None]
    return ("".join(f", {name} => %s::{cast}" for name, cast, _ in given),
            [value for _, _, value in given],
            " and ".join(name for name, _, _ in given))


def _parents(after: Optional[Parents]) -> Optional[List[UUID]]:
    """``after`` as a list of UUIDs (None stays None); a text that is not a
    UUID raises ValueError before anything is sent."""
    if after is None:
        return None
    if isinstance(after, (str, bytes, UUID)):
        raise TypeError("after takes a list of job ids, not one id")
    return [a if isinstance(a, UUID) else UUID(a) for a in after]


def as_interval(value: Optional[Delay]) -> Optional[timedelta]:
    """A number of seconds or a timedelta as a timedelta (None stays None)."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def _needs_1_2(conn: Executor, what: str, err: Exception) -> NeedsNewerExtension:
    """The error to raise when a 1.2 argument met a pgq_push without it (42883).

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
    after: Optional[Parents] = None,
    group_key: Optional[str] = None,
) -> UUID:
    """Push one job and return its id.

    ``payload`` is anything psycopg can dump as JSON (default ``{}``).
    ``run_after`` (a timestamp) or ``delay`` (seconds or a timedelta from now)
    postpone it; higher ``priority`` runs first within the queue; with a
    ``dedup_key`` a push while an unfinished job has the same key returns
    that job's id and adds nothing.  ``max_tries`` (pgqueue 1.2) is the
    job's own limit of tries, instead of its queue's (``None``: the
    queue's): below 1 the server raises
    ``psycopg.errors.InvalidParameterValue`` (22023).  ``group_key``
    (pgqueue 1.2) puts the job in that group of its queue: in a queue with
    ``group_max_in_flight`` at most that many jobs of a group run at once,
    in order; empty or over 256 bytes raises ``InvalidParameterValue``.  On
    an older pgqueue any of them raises :class:`NeedsNewerExtension`.

    ``after`` (pgqueue 1.2: flows) lists the job's parents, ids that
    :func:`push` or :func:`push_batch` returned: while one of them is an
    unfinished job the new one is ``waiting``, and it becomes ``pending``
    when the last of them is acked.  An id that is no unfinished job
    (acked, cancelled, never pushed) counts as done; an empty list is no
    parent at all.  Over 1,000 ids the server raises
    ``InvalidParameterValue``.
    """
    sql, values, names = _named_1_2(max_tries=max_tries, after=_parents(after),
                                    group_key=group_key)
    params = [queue, Jsonb({} if payload is None else payload), run_after,
              as_interval(delay), priority, dedup_key] + values
    try:
        row = conn.execute(_PUSH.format(sql), params, prepare=False).fetchone()
    except psycopg.errors.UndefinedFunction as err:
        if not names:
            raise
        raise _needs_1_2(conn, f"push with {names}", err) from err
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
    after: Optional[Parents] = None,
    group_key: Optional[str] = None,
) -> List[UUID]:
    """Push one job per payload and return their ids, in payload order.

    Sent as ``pgq_push_batch`` calls of up to 10,000 payloads each; on a
    connection in a transaction they all commit (or not) together.
    ``max_tries``, ``after`` and ``group_key`` (pgqueue 1.2) apply to every
    job of the batch, as in :func:`push`: with ``after`` each job waits for
    all of those parents (a fan-out; a fan-in is one :func:`push` whose
    ``after`` is the batch's ids); a group's jobs run in payload order.
    """
    items = [Jsonb({} if p is None else p) for p in payloads]
    ids: List[UUID] = []
    sql, values, names = _named_1_2(max_tries=max_tries, after=_parents(after),
                                    group_key=group_key)
    query = _PUSH_BATCH.format(sql)
    for start in range(0, len(items), BATCH_LIMIT):
        params = [queue, items[start:start + BATCH_LIMIT], run_after,
                  as_interval(delay), priority] + values
        try:
            rows = conn.execute(query, params, prepare=False).fetchall()
        except psycopg.errors.UndefinedFunction as err:
            if not names:
                raise
            raise _needs_1_2(conn, f"push_batch with {names}", err) from err
        ids.extend(r[0] for r in rows)
    return ids
