"""python3 -m pgqueue: stats, push, and the pgqueue 1.1 commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest

import pgqueue

OPS_DSN = os.environ["PGQ_DSN"].replace("user=app", "user=ops")


def cli(*args: str, dsn: str = OPS_DSN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pgqueue", "--dsn", dsn, *args],
                          capture_output=True, text=True, timeout=60)


OPS = ("pgq_retry(uuid)", "pgq_retry_failed(text)", "pgq_cancel(uuid)", "pgq_purge(text,text)")


def has_jobs_view(admin: psycopg.Connection) -> bool:
    return admin.execute("SELECT to_regclass('pgqueue.jobs') IS NOT NULL").fetchone()[0]


def has_ops(admin: psycopg.Connection) -> bool:
    return all(admin.execute("SELECT to_regprocedure(%s) IS NOT NULL", [f]).fetchone()[0]
               for f in OPS)


@pytest.fixture
def jobs_view(admin):
    if not has_jobs_view(admin):
        pytest.skip("needs pgqueue 1.1's pgqueue.jobs view, which this server's extension "
                    "does not have yet")


@pytest.fixture
def ops(admin):
    if not has_ops(admin):
        pytest.skip("needs pgqueue 1.1's pgq_retry, pgq_retry_failed, pgq_cancel and "
                    "pgq_purge, which this server's extension does not have yet")


def test_push_then_stats(admin, queue):
    out = cli("push", queue, '{"to": "a@example.com"}', "--priority", "3")
    assert out.returncode == 0, out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    assert admin.execute("SELECT payload, priority FROM pgqueue.queue WHERE id = %s",
                         [job_id]).fetchone() == ({"to": "a@example.com"}, 3)
    out = cli("--json", "stats")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    mine = [r for r in rows if r["queue"] == queue]
    assert len(mine) == 1 and mine[0]["pending"] + mine[0]["scheduled"] == 1
    table = cli("stats").stdout.splitlines()
    assert table[0].split()[:3] == ["queue", "pending", "retry"]
    assert any(line.split()[0] == queue for line in table[1:])


def test_errors_a_user_can_act_on(queue):
    out = cli("push", queue, "{not json")
    assert out.returncode == 2 and "payload is not JSON" in out.stderr
    out = cli("stats", dsn=os.environ["PGQ_DSN"])  # app: no pgqueue_admin
    assert out.returncode == 2 and "pgqueue_admin" in out.stderr
    out = cli("cancel", "nope")
    assert out.returncode == 2 and "not a job id" in out.stderr


def test_1_1_commands_say_what_is_missing(admin, queue):
    view, ops = has_jobs_view(admin), has_ops(admin)
    if view and ops:
        pytest.skip("pgqueue 1.1 is installed: the commands themselves are tested")
    if not ops:
        out = cli("retry", str(uuid.uuid4()))
        assert out.returncode == 2
        assert "needs pgqueue 1.1" in out.stderr and "ALTER EXTENSION pgqueue UPDATE" in out.stderr
    if not view:
        out = cli("jobs")
        assert out.returncode == 2 and "needs pgqueue 1.1" in out.stderr


def _failed_job(app: psycopg.Connection, admin: psycopg.Connection, queue: str) -> uuid.UUID:
    admin.execute("SELECT pgq_configure(%s, max_tries => 1)", [queue])
    job_id = pgqueue.push(app, queue, {"k": 1})
    admin.execute("SELECT pgq_schedule(1000)")
    claimed = admin.execute("SELECT id FROM pgq_claim('cli-test', 1, '1 minute', ARRAY[%s])",
                            [queue]).fetchone()
    assert claimed == (job_id,)
    assert admin.execute("SELECT pgq_nack(%s, 'cli-test', 'broke')", [job_id]).fetchone() == ("failed",)
    return job_id


def test_jobs_lists_the_view(app, admin, queue, jobs_view):
    job_id = _failed_job(app, admin, queue)
    out = cli("--json", "jobs", "--queue", queue, "--state", "failed")
    assert out.returncode == 0, out.stderr
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert (row["id"], row["state"], row["last_error"]) == (str(job_id), "failed", "broke")
    assert cli("--json", "jobs", "--queue", queue, "--state", "pending").stdout == ""


def pause(admin: psycopg.Connection, queue: str, paused: bool) -> None:
    """A paused queue is not scheduled: retried jobs stay pending."""
    admin.execute("SELECT pgq_configure(%s, paused => %s)", [queue, paused])


def test_retry_cancel_purge(app, admin, queue, ops):
    job_id = _failed_job(app, admin, queue)
    pause(admin, queue, True)
    out = cli("retry", str(job_id))
    assert out.returncode == 0 and "retried" in out.stdout, out.stderr
    assert admin.execute("SELECT state::text, tries FROM pgqueue.queue WHERE id = %s",
                         [job_id]).fetchone() == ("pending", 0)
    out = cli("retry", str(job_id))  # no longer failed
    assert out.returncode == 1 and "not failed" in out.stdout
    out = cli("cancel", str(job_id))
    assert out.returncode == 0, out.stderr
    assert cli("cancel", str(job_id)).returncode == 1
    assert admin.execute("SELECT count(*) FROM pgqueue.queue WHERE queue = %s",
                         [queue]).fetchone() == (0,)
    pause(admin, queue, False)
    for _ in range(2):
        _failed_job(app, admin, queue)
    pause(admin, queue, True)
    out = cli("retry", "--failed", queue)
    assert out.returncode == 0 and out.stdout.startswith("2 job(s)"), out.stderr
    out = cli("purge", queue, "--state", "pending")
    assert out.returncode == 0 and out.stdout.startswith("2 pending job(s)"), out.stderr
    pause(admin, queue, False)
    _failed_job(app, admin, queue)
    out = cli("purge", queue)
    assert out.returncode == 0 and out.stdout.startswith("1 failed job(s)"), out.stderr
    assert admin.execute("SELECT count(*) FROM pgqueue.queue WHERE queue = %s",
                         [queue]).fetchone() == (0,)


def test_push_max_tries(admin, queue):
    has = admin.execute("SELECT count(*) = 2 FROM pg_catalog.pg_proc WHERE proname IN"
                        " ('pgq_push', 'pgq_push_batch') AND 'max_tries' = ANY (proargnames)"
                        ).fetchone()[0]
    if not has:
        pytest.skip("needs pgqueue 1.2's pgq_push(..., max_tries), which this server's "
                    "extension does not have yet (the 1.1 error: test_producer.py)")
    admin.execute("SELECT pgq_configure(%s, max_tries => 5)", [queue])
    out = cli("push", queue, '{"n": 1}', "--max-tries", "1")
    assert out.returncode == 0, out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    out = cli("push", queue, '{"n": 2}')
    assert out.returncode == 0, out.stderr
    other = uuid.UUID(out.stdout.strip())
    assert dict(admin.execute("SELECT id, max_tries FROM pgqueue.jobs WHERE queue = %s",
                              [queue]).fetchall()) == {job_id: 1, other: 5}
    out = cli("push", queue, "--max-tries", "0")
    assert out.returncode == 2 and "max_tries" in out.stderr, out.stderr
    out = cli("push", queue, "--max-tries", "two")
    assert out.returncode == 2 and "invalid int value" in out.stderr, out.stderr
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])


def test_push_group_key(admin, queue):
    if not admin.execute("SELECT count(*) = 1 FROM pg_catalog.pg_proc WHERE proname = 'pgq_push'"
                         " AND 'group_key' = ANY (proargnames)").fetchone()[0]:
        pytest.skip("needs pgqueue 1.2's pgq_push(..., group_key)")
    out = cli("push", queue, '{"n": 1}', "--group-key", "customer-42")
    assert out.returncode == 0, out.stderr
    job_id = uuid.UUID(out.stdout.strip())
    assert admin.execute("SELECT group_key FROM pgqueue.jobs WHERE id = %s",
                         [job_id]).fetchone() == ("customer-42",)
    out = cli("push", queue, "--group-key", "")
    assert out.returncode == 2 and "group_key" in out.stderr, out.stderr
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])
