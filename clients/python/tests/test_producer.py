"""push and push_batch on the caller's own connection and transaction, and
max_tries, a job's own limit of tries (pgqueue 1.2)."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg
import pytest

import pgqueue
from conftest import (DSN, assert_cli_needs_1_2, assert_needs_1_2, database_at, job_rows,
                      push_takes, wait_until)


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


# --- max_tries, a job's own limit of tries (pgqueue 1.2) -----------------------

@pytest.fixture
def push_max_tries(admin):
    if not push_takes(admin, "max_tries"):
        pytest.skip("needs pgqueue 1.2's pgq_push(..., max_tries), which this server's "
                    "extension does not have yet")


def max_tries_shown(admin: psycopg.Connection, ids: list) -> list:
    """pgqueue.jobs.max_tries of each job, in the order of ``ids``."""
    got = dict(admin.execute("SELECT id, max_tries FROM pgqueue.jobs WHERE id = ANY (%s)",
                             [ids]).fetchall())
    return [got.get(i) for i in ids]


def test_push_max_tries_fails_the_job_after_its_own_tries(app, admin, queue, running,
                                                          push_max_tries):
    admin.execute("SELECT pgq_configure(%s, max_tries => 5)", [queue])
    own = pgqueue.push(app, queue, {"own": True}, max_tries=1)
    other = pgqueue.push(app, queue, {"own": False})
    assert max_tries_shown(admin, [own, other]) == [1, 5]
    ran: list = []

    def fail(job: pgqueue.Job) -> None:
        ran.append(job.id)
        raise RuntimeError("failed on purpose")

    w = pgqueue.Worker(DSN, concurrency=2, wait=1, retry_delay=3600)  # no second try here
    w.register(queue, fail)
    r = running(w)

    def states() -> dict:
        return {i: s for i, s, _, _, _ in job_rows(admin, queue)}

    wait_until(lambda: states() == {own: "failed", other: "retry"}, 20,
               "the job with max_tries 1 failed, the other one to be retried")
    r.stop()
    assert sorted(ran) == sorted([own, other])  # each tried once
    assert admin.execute("SELECT id, tries, max_tries, last_error LIKE '%%failed on purpose%%'"
                         " FROM pgqueue.jobs WHERE queue = %s ORDER BY tries, max_tries",
                         [queue]).fetchall() == [(own, 1, 1, True), (other, 1, 5, True)]
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])


def fail_all(admin: psycopg.Connection, queue: str, n: int) -> dict:
    """Claims the ``n`` jobs of ``queue`` as 'probe' and nacks each once: {id: state after}."""
    after: dict = {}

    def claim_and_nack() -> bool:
        admin.execute("SELECT pgq_schedule(1000)")
        for (job_id,) in admin.execute(
                "SELECT id FROM pgq_claim('probe', 100, '1 minute', ARRAY[%s])", [queue]).fetchall():
            after[job_id] = admin.execute("SELECT pgq_nack(%s, 'probe', 'failed on purpose',"
                                          " '1 hour')", [job_id]).fetchone()[0]
        return len(after) == n

    wait_until(claim_and_nack, 20, f"{n} jobs claimed and nacked")
    return after


def test_push_batch_max_tries(app, admin, queue, push_max_tries):
    admin.execute("SELECT pgq_configure(%s, max_tries => 4)", [queue])
    own = pgqueue.push_batch(app, queue, [{"n": 0}, {"n": 1}, None], max_tries=1)
    two = pgqueue.push_batch(app, queue, [{"n": 3}], max_tries=2)
    other = pgqueue.push_batch(app, queue, [{"n": 4}])
    assert max_tries_shown(admin, own + two + other) == [1, 1, 1, 2, 4]
    after = fail_all(admin, queue, 5)
    assert [after[i] for i in own + two + other] == ["failed"] * 3 + ["retry", "retry"]
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])


def test_max_tries_below_1_is_the_servers_error(app, admin, queue, push_max_tries):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push(app, queue, max_tries=0)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push_batch(app, queue, [{"n": 1}], max_tries=-1)
    assert payloads(admin, queue) == []


@pytest.mark.direct_only  # PgBouncer serves pgq_test only
def test_max_tries_on_pgqueue_1_1_says_what_to_run(admin):
    needs = assert_needs_1_2
    with database_at(admin, "1.1") as dsn:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as old:
            # without max_tries nothing changed: 1.1's pgq_push is called as before
            job_id = pgqueue.push(old, "q", {"n": 1}, priority=2, dedup_key="k")
            assert len(pgqueue.push_batch(old, "q", [{"n": 2}, {"n": 3}])) == 2
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.push(old, "q", {"n": 4}, max_tries=2)
            needs(err, "push with max_tries", "1.1")
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.push_batch(old, "q", [{"n": 5}], max_tries=2)
            needs(err, "push_batch with max_tries", "1.1")
            assert old.execute("SELECT count(*) FROM pgqueue.queue").fetchone() == (3,)
            assert old.execute("SELECT max_tries FROM pgqueue.jobs WHERE id = %s",
                               [job_id]).fetchone() == (5,)
        # in the caller's transaction: the error aborted it, the version is not
        # read and nothing is rolled back behind the caller's back
        with psycopg.connect(dsn, prepare_threshold=None) as old:
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                with old.transaction():
                    pgqueue.push(old, "q", {"n": 6})
                    with old.cursor() as cur:
                        pgqueue.push(cur, "q", {"n": 7}, max_tries=1)
            needs(err, "push with max_tries", "of an unknown version (the transaction is aborted)")
            assert old.execute("SELECT count(*) FROM pgqueue.queue").fetchone() == (3,)
        assert_cli_needs_1_2(dsn, "push", "q", "--max-tries", "3")
        out = subprocess.run([sys.executable, "-m", "pgqueue", "--dsn", dsn, "push", "q"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr


# --- group_key and group_max_in_flight (pgqueue 1.2) ---------------------------

@pytest.fixture
def push_groups(admin):
    if not admin.execute("SELECT count(*) = 2 FROM pg_catalog.pg_proc"
                         " WHERE proname IN ('pgq_push', 'pgq_push_batch')"
                         " AND 'group_key' = ANY (proargnames)").fetchone()[0]:
        pytest.skip("needs pgqueue 1.2's pgq_push(..., group_key)")


def test_groups_one_at_a_time_in_order(app, admin, queue, push_groups):
    pgqueue.configure(admin, queue, group_max_in_flight=1)
    assert admin.execute("SELECT group_max_in_flight FROM pgqueue.queues WHERE queue = %s",
                         [queue]).fetchone() == (1,)
    a = [pgqueue.push(app, queue, {"n": n}, group_key="a") for n in range(2)]
    b = pgqueue.push_batch(app, queue, [{"n": 10}, {"n": 11}], group_key="b")
    free = pgqueue.push(app, queue, {"n": 20})
    assert dict(admin.execute("SELECT id, group_key FROM pgqueue.jobs WHERE queue = %s",
                              [queue]).fetchall()) == {a[0]: "a", a[1]: "a", b[0]: "b",
                                                       b[1]: "b", free: None}
    taken: list = []
    for want in (3, 2):
        # a pass of the server's scheduler may hold the queue while this one
        # runs (this one then leaves it), or have read the groups before the
        # last acks: schedule and claim until the round's jobs came, acking
        # nothing meanwhile (a group's next job would show up too early)
        got: list = []
        deadline = time.monotonic() + 10
        while len(got) < want and time.monotonic() < deadline:
            admin.execute("SELECT pgq_schedule(1000)")
            got += [r[0] for r in admin.execute(
                "SELECT id FROM pgq_claim('probe', 100, '1 minute', ARRAY[%s])",
                [queue]).fetchall()]
            time.sleep(0.05)
        taken.append(sorted(got, key=str))
        for job_id in got:
            admin.execute("SELECT pgq_ack(%s, 'probe')", [job_id])
    # the first pass: the first of each group and the job without a group
    assert taken[0] == sorted([a[0], b[0], free], key=str)
    assert taken[1] == sorted([a[1], b[1]], key=str)
    pgqueue.configure(admin, queue, group_max_in_flight=0)


def test_group_key_errors(app, admin, queue, push_groups):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push(app, queue, group_key="")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push_batch(app, queue, [{}], group_key="x" * 257)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.configure(admin, queue, group_max_in_flight=-1)
