"""abpo.monthly.serve without the simulator (production): a month that did not land fails naming the landing zone,
as an IngestError (the `abpo` command's one-line error), and never fabricates data; a landed month is counted."""

from __future__ import annotations

import pytest


def test_a_month_that_did_not_land_fails_and_nothing_is_fabricated(make_cfg):
    from abpo.monthly.serve import NothingLanded, serve
    from abpo.warehouse import IngestError

    cfg = make_cfg()
    with pytest.raises(IngestError, match=r"nothing landed for month=2026-04 .*simulate") as e:
        serve(cfg, "2026-04", simulate=False)
    assert isinstance(e.value, (NothingLanded, FileNotFoundError))
    assert not (cfg.paths.resolve("landing") / "impressions" / "month=2026-04").exists()


def test_a_landed_month_is_counted(make_cfg):
    from abpo.data.schemas import write_impressions
    from abpo.data.synthetic import synthetic_impressions
    from abpo.monthly.serve import serve

    cfg = make_cfg()
    table, _ = synthetic_impressions(50, "2026-04", seed=1, violation_rate=0.0)
    write_impressions(table, cfg.paths.resolve("landing"), "2026-04", part="a")
    assert serve(cfg, "2026-04", simulate=False).to_json() == {"month": "2026-04", "files": 1, "simulated": False}
