"""Flows (pgqueue 1.2): push(after=...) and push_batch(after=...), a job that
waits for its parents; stats()' waiting, jobs()' waiting_for, the CLI's
push --after; and the error of after= on pgqueue 1.1."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest

import pgqueue
from conftest import (DSN, assert_cli_needs_1_2, assert_needs_1_2, database_at, push_takes,
                      wait_until)
from test_cli import cli


@pytest.fixture
def flows(admin):
    if not push_takes(admin, "after"):
        pytest.skip("needs pgqueue 1.2's pgq_push(..., after), which this server's "
                    "extension does not have yet (the 1.1 error is tested on a database "
                    "of its own)")


def states(admin: psycopg.Connection, ids: list) -> dict:
    """id -> (state, waiting_for) from pgqueue.jobs; finished jobs are absent."""
    return {r[0]: (r[1], r[2]) for r in admin.execute(
        "SELECT id, state, waiting_for FROM pgqueue.jobs WHERE id = ANY (%s)", [ids])}


def test_fan_out_fan_in_through_a_worker(app, admin, queue, running, flows):
    """A parent, 6 children after it (another queue), a merge after all of
    them: a running Worker starts each child only after its parent's
    handler finished (a first try that raised included), and the merge
    only after every child's handler finished."""
    shards = f"{queue}_shards"
    with app.transaction():
        parent = pgqueue.push(app, queue, {"step": "snapshot"})
        children = pgqueue.push_batch(app, shards, [{"shard": n} for n in range(6)],
                                      after=[parent])
        merge = pgqueue.push(app, queue, {"step": "merge"}, after=children)
    # nothing runs yet: the children wait for 1 parent, the merge for 6
    got = states(admin, [parent, merge, *children])
    assert got[parent][0] in ("pending", "scheduled") and got[parent][1] == 0
    assert all(got[c] == ("waiting", 1) for c in children), got
    assert got[merge] == ("waiting", 6)
    by_queue = {s["queue"]: s for s in pgqueue.stats(admin)}
    assert by_queue[shards]["waiting"] == 6 and by_queue[queue]["waiting"] == 1
    listed = pgqueue.jobs(admin, shards, "waiting")
    assert sorted(j["id"] for j in listed) == sorted(children)
    assert {j["waiting_for"] for j in listed} == {1}

    log: list[tuple[str, str, float]] = []  # (event, name, time)
    lock = threading.Lock()
    tries = {"parent": 0}

    def note(event: str, name: str) -> None:
        with lock:
            log.append((event, name, time.monotonic()))

    def step(job: pgqueue.Job) -> None:
        name = job.payload["step"]
        note("start", name)
        if name == "snapshot":
            tries["parent"] += 1
            time.sleep(0.3)
            if tries["parent"] == 1:
                note("raise", name)
                raise RuntimeError("the snapshot failed once")
        note("end", name)

    def shard(job: pgqueue.Job) -> None:
        name = f"shard{job.payload['shard']}"
        note("start", name)
        time.sleep(0.1 + 0.05 * job.payload["shard"])
        note("end", name)

    w = pgqueue.Worker(DSN, concurrency=4, lease=30, wait=5, retry_delay=0)
    w.register(queue, step)
    w.register(shards, shard)
    r = running(w)
    wait_until(lambda: not states(admin, [parent, merge, *children]), 60,
               "the whole flow done")
    r.stop()

    def when(event: str, name: str) -> list:
        return [t for e, n, t in log if e == event and n == name]

    # the parent's first try raised and held the flow; its second finished it
    assert len(when("raise", "snapshot")) == 1 and len(when("end", "snapshot")) == 1
    parent_end = when("end", "snapshot")[0]
    shard_names = [f"shard{n}" for n in range(6)]
    for name in shard_names:
        assert len(when("start", name)) == 1, log
        assert when("start", name)[0] > parent_end, f"{name} started before its parent ended"
    last_shard_end = max(when("end", name)[0] for name in shard_names)
    assert len(when("start", "merge")) == 1, log
    assert when("start", "merge")[0] > last_shard_end, "the merge started before a shard ended"
    # the shards ran side by side (concurrency 4): the flow orders, not serialises
    starts = sorted(when("start", name)[0] for name in shard_names)
    assert starts[1] < last_shard_end


def test_after_takes_ids_as_text_and_counts_done_ones_as_done(app, admin, queue, flows):
    parent = pgqueue.push(app, queue, {"n": 1})
    never = uuid.uuid4()  # never pushed: counts as done
    child = pgqueue.push(app, queue, {"n": 2}, after=[str(parent), never, parent])
    assert states(admin, [child]) == {child: ("waiting", 1)}
    assert admin.execute("SELECT parent FROM pgqueue.job_parents WHERE child = %s",
                         [child]).fetchall() == [(parent,)]
    # no parent at all: pending at once, as without after
    alone = pgqueue.push(app, queue, after=[])
    assert states(admin, [alone])[alone][1] == 0
    assert states(admin, [alone])[alone][0] != "waiting"
    batch = pgqueue.push_batch(app, queue, [{"n": 3}, {"n": 4}], after=[never])
    assert all(states(admin, batch)[b][0] != "waiting" for b in batch)
    with pytest.raises(TypeError):
        pgqueue.push(app, queue, after=str(parent))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pgqueue.push(app, queue, after=["not a uuid"])
    # cancelling the parent cancels the child waiting for it
    assert pgqueue.cancel(admin, parent)
    assert states(admin, [child]) == {}
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])


def test_after_over_1000_ids_is_the_servers_error(app, admin, queue, flows):
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push(app, queue, after=[uuid.uuid4() for _ in range(1001)])
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        pgqueue.push_batch(app, queue, [{"n": 1}], after=[uuid.uuid4() for _ in range(1001)])
    assert admin.execute("SELECT count(*) FROM pgqueue.queue WHERE queue = %s",
                         [queue]).fetchone() == (0,)


def test_cli_push_after_stats_jobs_and_purge_waiting(admin, queue, flows):
    ids = []
    for n in range(2):
        out = cli("push", queue, json.dumps({"n": n}))
        assert out.returncode == 0, out.stderr
        ids.append(uuid.UUID(out.stdout.strip()))
    out = cli("push", queue, '{"n": "child"}', "--after", str(ids[0]), "--after", str(ids[1]))
    assert out.returncode == 0, out.stderr
    child = uuid.UUID(out.stdout.strip())
    assert states(admin, [child]) == {child: ("waiting", 2)}
    assert sorted(r[0] for r in admin.execute(
        "SELECT parent FROM pgqueue.job_parents WHERE child = %s", [child])) == sorted(ids)
    out = cli("--json", "stats")
    assert out.returncode == 0, out.stderr
    mine = [json.loads(line) for line in out.stdout.splitlines()
            if json.loads(line)["queue"] == queue]
    assert len(mine) == 1 and mine[0]["waiting"] == 1, mine
    out = cli("stats")
    assert out.returncode == 0 and "waiting" in out.stdout.splitlines()[0], out.stdout
    out = cli("--json", "jobs", "--queue", queue, "--state", "waiting")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["id"], r["waiting_for"]) for r in rows] == [(str(child), 2)]
    out = cli("push", queue, "--after", "nonsense")
    assert out.returncode == 2 and "not a job id" in out.stderr, out.stderr
    out = cli("purge", queue, "--state", "waiting")
    assert out.returncode == 0 and out.stdout.startswith("1 waiting job(s)"), out.stdout
    assert states(admin, [child]) == {}
    admin.execute("DELETE FROM pgqueue.queue WHERE queue = %s", [queue])


@pytest.mark.direct_only  # PgBouncer serves pgq_test only
def test_after_on_pgqueue_1_1_says_what_to_run(admin):
    needs = assert_needs_1_2
    with database_at(admin, "1.1") as dsn:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as old:
            parent = pgqueue.push(old, "q", {"n": 1})
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.push(old, "q", {"n": 2}, after=[parent])
            needs(err, "push with after", "1.1")
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.push_batch(old, "q", [{"n": 3}], after=[parent])
            needs(err, "push_batch with after", "1.1")
            with pytest.raises(pgqueue.NeedsNewerExtension) as err:
                pgqueue.push(old, "q", {"n": 4}, max_tries=2, after=[])
            needs(err, "push with max_tries and after", "1.1")
            assert old.execute("SELECT count(*) FROM pgqueue.queue").fetchone() == (1,)
            # stats and jobs of 1.1: no waiting, no waiting_for
            assert "waiting" not in pgqueue.stats(old)[0]
            assert "waiting_for" not in pgqueue.jobs(old, "q")[0]
        assert_cli_needs_1_2(dsn, "push", "q", "--after", str(parent))
