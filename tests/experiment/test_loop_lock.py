"""One `abpo loop-experiment` per state, and nothing of a run outlives it (issue 59 point 3): two runs on one state
ran the same replicate at once (duplicate months, an extra challenger, WarehouseBusy), a SIGTERM to the run left its
pool worker promoting with parent 1, and a later run reused the result.json that worker wrote. Now the run holds a lock
naming it (abpo.experiment.loop_lock), its workers die with it (abpo.experiment.loop_workers.worker_pool), and a
replicate's result counts only when the run that held the lock recorded it finished cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.experiment.test_loop_refusals import MONTHS, RUN, finished_replicate


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for a pid 1 that may not reap it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


def test_a_second_run_on_the_same_state_is_refused_naming_the_holder(abpo, state):
    finished_replicate(state)  # so that a run the lock does not stop only reports
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\nfrom abpo.experiment.loop_lock import run_lock\n"
            f"with run_lock(Path({str(state / 'loop-experiment')!r}), 'the test holder'):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, out, err = abpo(*RUN, "--target-mde", "0")
        assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        lock = state / "loop-experiment" / "run.lock"
        assert f"abpo loop-experiment: {lock}: held by run " in err, err
        assert f"pid {holder.pid} on {os.uname().nodename}" in err and "the test holder" in err, err
        assert "rule: one loop experiment per state at a time" in err
        assert not (state / "loop-experiment" / "reports").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    rc, out, err = abpo(*RUN, "--target-mde", "0")  # the holder gone: the lock is free again
    assert rc == 0, err


def test_a_lock_names_its_holder_and_is_free_once_the_holder_is_killed(tmp_path):
    from abpo.experiment.loop_lock import LoopExperimentBusy, run_lock

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom pathlib import Path\nfrom abpo.experiment.loop_lock import run_lock\n"
            f"with run_lock(Path({str(tmp_path)!r}), 'killed holder'):\n    print('held', flush=True)\n"
            "    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LoopExperimentBusy, match=f"pid {holder.pid} .*killed holder"):
        with run_lock(tmp_path, "second"):
            pass
    holder.kill()
    holder.wait(timeout=60)
    with run_lock(tmp_path, "third") as run:  # SIGKILL released it: nothing stale to clear by hand
        assert json.loads((tmp_path / "run.lock").read_text())["run"] == run


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_pool_workers_die_with_their_parent(sig):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\nfrom abpo.experiment.loop_workers import worker_pool\n"
            "with worker_pool(1, 1) as pool:\n    print(pool.submit(os.getpid).result(), flush=True)\n"
            "    pool.submit(time.sleep, 600).result()\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(parent.stdout.readline())
    try:
        time.sleep(1.0)  # the worker has taken the long job
        assert _alive(worker)
        parent.send_signal(sig)
        parent.wait(timeout=60)
        deadline = time.time() + 20
        while _alive(worker) and time.time() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), f"worker {worker} outlived its parent ({sig.name})"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_result_not_recorded_as_finished_cleanly_by_a_run_is_not_reused(state):
    """A result.json without the run's record (what a worker that outlived its killed run wrote) is not trusted: the
    replicate starts over, and the run says why."""
    from abpo.config import load_config
    from abpo.experiment import loop_experiment as le

    path = finished_replicate(state)
    got = json.loads(path.read_text())
    for k in ("run", "clean"):
        got.pop(k)
    path.write_text(json.dumps(got))
    (path.parent / "state").mkdir()
    cfg = load_config("tiny", [])
    root = state / le.DIR
    lines: list[str] = []
    results, jobs = le._plan_replicates(
        cfg, "tiny", (), 1, MONTHS, root, root / "bootstrap" / "b", "code", True, echo=lines.append
    )
    assert results == {} and [j.replicate for j in jobs] == [0]
    assert not path.exists() and not (path.parent / "state").exists()  # started over
    assert any(f"replicate 0: {path} is not recorded as finished cleanly by a run" in x for x in lines), lines


def test_a_worker_waits_for_its_folder_then_names_the_worker_holding_it(tmp_path):
    """A worker of a run that just died may still be stopping in a replicate's folder: the next run's worker waits
    for it, then gives up naming it."""
    from abpo.experiment.loop_lock import LoopExperimentBusy, worker_lock

    with worker_lock(tmp_path, "run-a", "replicate 3"):  # flock: another open of the file conflicts, even here
        t = time.monotonic()
        with pytest.raises(LoopExperimentBusy, match=r"held by run run-a \(pid .*replicate 3\); rule: one worker"):
            with worker_lock(tmp_path, "run-b", "replicate 3", wait_s=1.0):
                pass
        assert time.monotonic() - t >= 1.0
    with worker_lock(tmp_path, "run-b", "replicate 3", wait_s=0):  # released with its block
        assert json.loads((tmp_path / "worker.lock").read_text())["run"] == "run-b"
