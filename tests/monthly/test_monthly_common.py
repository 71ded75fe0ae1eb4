"""abpo.monthly.common's operations helpers: retry_or_fail (a refusal fails at once, a transient error is retried),
landing_status (is a month's landing partition complete) and resolve_hook (ABPO_ON_FAILURE's target)."""

from __future__ import annotations

import importlib

import pytest

from abpo.monthly.common import REFUSED, TRANSIENT, landing_status, resolve_hook, retry_or_fail


def test_every_named_exception_class_exists():
    for name in (*TRANSIENT, *REFUSED):
        module, _, attr = name.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        assert isinstance(cls, type) and issubclass(cls, BaseException), name
    assert not set(TRANSIENT) & set(REFUSED)


def test_refusals_fail_now_and_transient_errors_are_retried():
    from abpo.arms.promotion_lock import HoldbackNeverPromoted, PromotionRace
    from abpo.arms.versions import NotInRegistry
    from abpo.config.errors import ConfigError
    from abpo.monthly.hold import HoldbackMoved
    from abpo.monthly.report import PreviousMonthIncomplete
    from abpo.monthly.serve import NothingLanded
    from abpo.months import MonthError
    from abpo.registry import RegistryUnavailable
    from abpo.warehouse import IngestError, IngestRefused, IngestStepFailed, WarehouseBusy

    refusals = [
        NothingLanded("landing: nothing landed for month=2026-10"),
        IngestRefused("audit failed"),
        IngestError("not Parquet"),
        ConfigError("unknown key"),
        MonthError("2026-13"),
        PreviousMonthIncomplete("2026-01 never finished"),
        NotInRegistry("no champion"),
        ValueError("simulated month index 4 ... sim.window"),
        KeyError("user 7"),
        HoldbackMoved("holdback champion is v2, not pi_init's v1"),
        HoldbackNeverPromoted("the holdback is never promoted"),
    ]  # a PromotionRace, but never transient
    for e in refusals:
        assert retry_or_fail(e) == "fail", type(e).__name__
    transient = [
        WarehouseBusy("lock held"),
        RegistryUnavailable("server down"),
        PromotionRace("lock held"),
        IngestStepFailed("disk full"),  # an IngestError, but a step that may pass next time
        TimeoutError("slow"),
        ConnectionResetError("reset"),
        RuntimeError("unknown"),
        OSError("EIO"),
    ]
    for e in transient:
        assert retry_or_fail(e) == "retry", type(e).__name__


def test_an_unknown_wrapper_is_judged_by_its_cause():
    from abpo.warehouse import WarehouseBusy

    def wrapped(cause):
        try:
            raise cause
        except Exception as e:
            try:
                raise RuntimeError("step failed") from e
            except RuntimeError as outer:
                return outer

    assert retry_or_fail(wrapped(ValueError("bad input"))) == "fail"
    assert retry_or_fail(wrapped(WarehouseBusy("lock"))) == "retry"
    assert retry_or_fail(wrapped(RuntimeError("?"))) == "retry"


def test_landing_status_needs_files_and_the_marker(make_cfg):
    cfg = make_cfg()
    assert landing_status(cfg, "2026-03") == (False, landing_status(cfg, "2026-03")[1])
    assert "no landing partition" in landing_status(cfg, "2026-03")[1]
    d = cfg.paths.resolve("landing") / "impressions" / "month=2026-03"
    d.mkdir(parents=True)
    (d / "_started").write_text("")
    landed, why = landing_status(cfg, "2026-03")
    assert not landed and "holds no files" in why
    (d / "part-0.parquet").write_bytes(b"x")
    assert landing_status(cfg, "2026-03")[0]
    landed, why = landing_status(cfg, "2026-03", "_SUCCESS")
    assert not landed and "no _SUCCESS marker" in why
    (d / "_SUCCESS").write_text("")
    assert landing_status(cfg, "2026-03", "_SUCCESS") == (True, f"{d}: 1 file(s) and the _SUCCESS marker")


def test_resolve_hook_names_the_spec_and_the_rule():
    assert resolve_hook("abpo.monthly.common:retry_or_fail") is retry_or_fail
    assert resolve_hook("os.path:join") is importlib.import_module("os.path").join
    with pytest.raises(ValueError, match="rule: package.module:attribute"):
        resolve_hook("abpo.monthly.common.retry_or_fail")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_hook("abpo.monthly.common:no_such_hook")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_hook("no_such_package_xyz:f")
    with pytest.raises(ValueError, match="is not callable"):
        resolve_hook("abpo.monthly.common:REFUSED")
