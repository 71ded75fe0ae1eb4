"""Issue 59 point 6: `arms.approval_timeout: 3000000d` was accepted at load, and the approval task then overflowed
(`now + timeout` past the year 9999) after the gate had passed, so the month could not complete. The duration is
bounded when the config loads: at most 31 days (the DAG runs one month at a time)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("value", ["3000000d", "32d", "744h1", "2678401s", "9" * 400 + "d"])
def test_an_approval_timeout_past_a_month_is_refused_at_load(abpo, state, value):
    rc, out, err = abpo("config", "--set", f"arms.approval_timeout={value}")
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    if len(value) <= 80:
        assert f"arms.approval_timeout {value!r}: rule: " in err, err
    else:  # a long value is shown as a short excerpt with its length, never whole
        assert f"arms.approval_timeout '{value[:20]}" in err and f"({len(value)} characters): rule: " in err, err
        assert len(err) < 1000, err
    if value != "744h1":  # a malformed one is refused by the format, as before
        assert "at most 31d" in err and "one month at a time" in err, err


def test_a_config_file_with_a_huge_approval_timeout_is_refused(abpo, state, tmp_path):
    f = tmp_path / "deploy.yaml"
    f.write_text("arms:\n  approval: required\n  approval_timeout: 3000000d\n")
    rc, out, err = abpo("config", "--config", str(f))
    assert rc == 2 and "Traceback" not in err and "arms.approval_timeout '3000000d'" in err and "at most 31d" in err, (
        err
    )


@pytest.mark.parametrize("value", ["31d", "744h", "2678400s", "72h", "90m", "1.5d"])
def test_a_timeout_up_to_a_month_loads(make_cfg, value):
    from datetime import UTC, datetime, timedelta

    from abpo.config.values import duration_seconds

    cfg = make_cfg(f"arms.approval_timeout={value}")
    seconds = duration_seconds(cfg.arms.approval_timeout)
    assert 0 < seconds <= 31 * 86400
    datetime.now(UTC) + timedelta(seconds=seconds)  # the approval task's deadline: its start plus the timeout
    with pytest.raises(OverflowError):  # what 3000000d, accepted before, gave the approval task
        datetime.now(UTC) + timedelta(seconds=duration_seconds("3000000d"))
