"""One month at a time per state: two `abpo arms month` on one state ran together, the second marking the first's
live update run KILLED and training its own, and the first then finishing into the killed run and overwriting the
month's cycle record of the update. Now a month holds the state's lock (abpo.monthly.month_lock), naming its holder,
and a task attempt is superseded only when its process is gone (abpo.registry.completed_task_run); an attempt
superseded anyway (from another machine) records nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import pytest


def _holder(state, month: str = "2026-01") -> subprocess.Popen:
    """Another process holding the state's month lock as `abpo arms month --month <month>` does, until its stdin
    closes."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom abpo.config import load_config\nfrom abpo.monthly.month_lock import month_lock\n"
            f"with month_lock(load_config('tiny'), {month!r}):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ABPO_STATE": str(state)},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_month_on_the_same_state_is_refused_naming_the_holder_and_the_lock(abpo, state):
    holder = _holder(state)
    try:
        rc, out, err = abpo("arms", "month", "--month", "2026-02", "--simulate")
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        lock = state / "month.lock"
        assert f"{lock}: held by month 2026-01 (pid {holder.pid} on {os.uname().nodename} since " in err, err
        assert "abpo arms month --month 2026-01" in err and "rule: one month at a time per state" in err, err
        assert "month 2026-02 not started" in err
        assert sorted(p.name for p in state.iterdir()) == ["month.lock"]  # nothing read or written before it
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert lock.read_text() == ""  # released: no holder named


def test_a_killed_holder_s_lock_is_taken_over_and_says_whose_it_was(state, caplog):
    from abpo.config import load_config
    from abpo.monthly.month_lock import month_lock

    holder = _holder(state)
    os.kill(holder.pid, signal.SIGKILL)  # killed inside the month: its record stays, the kernel drops its flock
    holder.wait(timeout=60)
    lock = state / "month.lock"
    assert json.loads(lock.read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="abpo.monthly.month_lock"):
        with month_lock(load_config("tiny"), "2026-02"):
            mine = json.loads(lock.read_text())
            assert (mine["month"], mine["pid"], mine["command"]) == (
                "2026-02",
                os.getpid(),
                "abpo arms month --month 2026-02",
            )
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"{lock}: took over the month lock left by month 2026-01 (pid {holder.pid} on " in said, said
    assert "(process gone)" in said


def test_an_unwritable_state_is_one_line_naming_the_lock_file(abpo, state):
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("a file where the state directory should be")
    rc, out, err = abpo("arms", "month", "--month", "2026-02", "--simulate")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{state / 'month.lock'}: the month lock cannot be made" in err and "rule: the state directory" in err, err


# ------------------------------------------------------------------------------------------------ task attempts
KEY = "update:abpo:2026-01:rows:parent-v1:cfg"


def _attempt_process(state) -> tuple[subprocess.Popen, str]:
    """Another process on this host running an attempt of task KEY (its run RUNNING) until its stdin closes; returns
    it and its run id."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom abpo import registry\nfrom abpo.config import load_config\n"
            "with registry.start_run(load_config('tiny'), 'abpo-arms', 'update-abpo-2026-01', "
            f"tags={{registry.TASK_KEY_TAG: {KEY!r}}}) as run:\n"
            "    print(run.info.run_id, flush=True)\n    sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ABPO_STATE": str(state)},
    )
    return proc, proc.stdout.readline().strip()


def test_a_live_attempt_is_not_superseded_and_a_dead_one_is(state):
    from abpo import registry
    from abpo.config import load_config
    from abpo.monthly.common import retry_or_fail

    cfg = load_config("tiny")
    proc, run_id = _attempt_process(state)
    try:
        with pytest.raises(registry.TaskAttemptLive) as e:
            registry.completed_task_run(cfg, "abpo-arms", KEY)
        assert f"its attempt in MLflow run {run_id}" in str(e.value) and f"pid {proc.pid} on " in str(e.value)
        assert "rule: an attempt is superseded only when its process is gone" in str(e.value)
        assert retry_or_fail(e.value) == "retry"  # the DAG retries: once it ended its completed run is reused
        run = registry.get_run(run_id)
        assert run.info.status == "RUNNING" and "abpo.superseded" not in run.data.tags
    finally:
        proc.kill()  # a SIGKILL: its run stays RUNNING
        proc.wait(timeout=60)
    assert registry.completed_task_run(cfg, "abpo-arms", KEY) is None
    run = registry.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["abpo.superseded"].startswith("an attempt of this task")


def test_an_attempt_superseded_from_another_machine_records_nothing_and_keeps_the_cycle_record(state, monkeypatch):
    from abpo import registry
    from abpo.config import load_config
    from abpo.monthly import completed
    from abpo.monthly.common import retry_or_fail

    cfg = load_config("tiny")
    record = completed.record_path(cfg, "2026-01", "abpo", "update")

    def attempt_a():
        with registry.start_run(cfg, "abpo-arms", "update-abpo-2026-01", tags={registry.TASK_KEY_TAG: KEY}) as run:
            # meanwhile attempt B on another machine, which cannot see this process: it supersedes this run and
            # completes the task itself
            with monkeypatch.context() as m:
                m.setattr("abpo.registry.attempts.socket.gethostname", lambda: "another-host")
                assert registry.completed_task_run(cfg, "abpo-arms", KEY) is None
                with registry.start_run(
                    cfg, "abpo-arms", "update-abpo-2026-01", {registry.TASK_KEY_TAG: KEY}, nested=True
                ) as b:
                    pass
                registry.record_task_result(b.info.run_id, {"run_id": b.info.run_id})
        assert registry.get_run(run.info.run_id).data.tags["abpo.superseded"]
        with registry.resume_run(cfg, run.info.run_id):  # A logs its model into its run: refused
            raise AssertionError("a superseded attempt's run was reopened")

    with pytest.raises(registry.TaskSuperseded) as e:
        completed.run_arm_step("update", cfg, "2026-01", "abpo", attempt_a)
    assert "was superseded while it ran" in str(e.value) and "rule: a superseded attempt records nothing" in str(
        e.value
    )
    assert retry_or_fail(e.value) == "retry"
    assert not record.exists()  # the month's record of its update was not written by the superseded attempt
    done = registry.completed_task_run(cfg, "abpo-arms", KEY)
    assert done is not None and registry.task_result(done) == {"run_id": done.info.run_id}  # B's, as it recorded


def test_an_attempt_whose_task_another_completed_meanwhile_records_nothing(state, monkeypatch):
    from abpo import registry
    from abpo.config import load_config

    cfg = load_config("tiny")
    with registry.start_run(cfg, "abpo-arms", "a", tags={registry.TASK_KEY_TAG: KEY}) as a:
        with monkeypatch.context() as m:  # B on another machine completes the task without looking at A's run
            m.setattr("abpo.registry.attempts.socket.gethostname", lambda: "another-host")
            with registry.start_run(cfg, "abpo-arms", "b", {registry.TASK_KEY_TAG: KEY}, nested=True) as b:
                pass
            registry.record_task_result(b.info.run_id, {"by": "b"})
    with pytest.raises(registry.TaskSuperseded, match=f"MLflow run {b.info.run_id} completed it while this attempt"):
        registry.record_task_result(a.info.run_id, {"by": "a"})
    assert registry.task_result(registry.completed_task_run(cfg, "abpo-arms", KEY)) == {"by": "b"}
