"""push and push_batch on the caller's own connection and transaction."""

from __future__ import annotations

import psycopg

import pgqueue
from conftest import DSN


def payloads(admin: psycopg.Connection, queue: str) -> list:
    return [r[0] for r in admin.execute(
        "SELECT payload FROM pgqueue.queue WHERE queue = %s ORDER BY id", [queue])]


def test_push_is_part_of_the_callers_transaction(admin, queue):
    with psycopg.connect(DSN, prepare_threshold=None) as conn:
        pgqueue.push(conn, queue, {"n": 1})
        conn.rollback()
        assert payloads(admin, queue) == []
        with conn.cursor() as cur:  # a cursor works as well as a connection
            pgqueue.push(cur, queue, {"n": 2})
            assert payloads(admin, queue) == []  # not committed yet
        conn.commit()
    assert payloads(admin, queue) == [{"n": 2}]


def test_push_options(app, admin, queue):
    a = pgqueue.push(app, queue, priority=5, dedup_key="k", delay=3600)
    assert pgqueue.push(app, queue, {"other": True}, dedup_key="k") == a
    row = admin.execute("SELECT payload, priority, dedup_key, run_after > now() + interval '59 minutes'"
                        " FROM pgqueue.queue WHERE id = %s", [a]).fetchone()
    assert row == ({}, 5, "k", True)


def test_push_batch_returns_ids_in_payload_order(app, admin, queue):
    ids = pgqueue.push_batch(app, queue, [{"n": i} for i in range(25)] + [None, ["a", 1]])
    assert len(ids) == 27 and len(set(ids)) == 27
    got = dict(admin.execute("SELECT id, payload FROM pgqueue.queue WHERE queue = %s", [queue]))
    assert [got[i] for i in ids] == [{"n": i} for i in range(25)] + [{}, ["a", 1]]
    assert pgqueue.push_batch(app, queue, []) == []


def test_push_batch_over_the_server_limit_is_split(app, admin, queue):
    admin.execute("SELECT pgq_configure(%s, paused => true)", [queue])  # none scheduled
    ids = pgqueue.push_batch(app, queue, range(10_001))
    assert len(ids) == 10_001
    assert admin.execute("SELECT count(*), sum(payload::text::int) FROM pgqueue.queue"
                         " WHERE queue = %s", [queue]).fetchone() == (10_001, 50_005_000)
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])
