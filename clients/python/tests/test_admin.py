"""pgqueue.admin's queue settings: configure, pause, resume."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import psycopg
import pytest

import pgqueue
from conftest import DSN, job_rows, wait_until

OPS_DSN = DSN.replace("user=app", "user=ops")


def test_admin_configure_pause_and_resume(app, admin, queue, running):
    def settings() -> tuple:
        return admin.execute("SELECT weight, max_tries, paused FROM pgqueue.queues "
                             "WHERE queue = %s", [queue]).fetchone()

    def in_flight_cap() -> int:
        return admin.execute("SELECT coalesce(max_in_flight, 0) FROM pgqueue.queues "
                             "WHERE queue = %s", [queue]).fetchone()[0]

    has_retention = admin.execute(
        "SELECT to_regprocedure('pgq_configure(text, int, int, int, boolean, interval)')"
        " IS NOT NULL").fetchone()[0]
    with psycopg.connect(OPS_DSN, autocommit=True, prepare_threshold=None) as ops:
        pgqueue.configure(ops, queue, weight=3, max_in_flight=2, max_tries=7)
        assert settings() == (3, 7, False) and in_flight_cap() == 2
        pgqueue.configure(ops, queue, max_in_flight=0)  # 0 removes the cap; the rest stays
        assert settings() == (3, 7, False) and in_flight_cap() == 0
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            pgqueue.configure(ops, queue, weight=0, max_tries=9)
        assert settings() == (3, 7, False)  # nothing changed
        if has_retention:
            pgqueue.configure(ops, queue, retention=3600)
            pgqueue.configure(ops, queue + "_r", retention="2 days")
            assert admin.execute("SELECT queue, retention FROM pgqueue.queues WHERE queue "
                                 "IN (%s, %s) ORDER BY queue", [queue, queue + "_r"]
                                 ).fetchall() == [(queue, timedelta(hours=1)),
                                                  (queue + "_r", timedelta(days=2))]
        pgqueue.pause(ops, queue)
        assert settings() == (3, 7, True)
        job_id = pgqueue.push(app, queue)
        done: list[str] = []
        w = pgqueue.Worker(DSN, concurrency=1, wait=1)
        w.register(queue, lambda job: done.append(str(job.id)))
        r = running(w)
        time.sleep(2)
        assert done == [] and [s for _, s, _, _, _ in job_rows(admin, queue)] == ["pending"]
        pgqueue.resume(ops, queue)
        assert settings() == (3, 7, False)
        wait_until(lambda: not job_rows(admin, queue), 20, "the job done after resume")
        r.stop()
        assert done == [str(job_id)]
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=None) as app_only:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            pgqueue.pause(app_only, queue)


def test_admin_functions_are_exported():
    for name in ("configure", "pause", "resume"):
        assert name in pgqueue.__all__ and getattr(pgqueue, name)
    assert os.path.basename(pgqueue.admin.__file__) == "admin.py"
