"""Issue 59 point 7: the SASRec ranker's weights (`sasrec.pt`, torch's zip format). A truncated or missing file was a
raw torch or OS traceback, and a cached version's `.complete` check accepted a version without its weights (the
marker listed whatever the download held). Now the weights get the one-line integrity check the safetensors get
(abpo.registry.weights), and a download is complete only when every file the arm needs is there."""

from __future__ import annotations

import json
import os

import pytest

from tests.sizes import SASREC_RANKER_MONTH

ITEMS = list(range(1, 21))


def _sasrec_arm_dir(path):
    """A fitted (tiny) SASRec ranker arm saved as a version's files: ranker.json, sasrec.pt, arm.json."""
    from abpo.arms.rankers import RankerArm
    from abpo.baselines import make_ranker

    ranker = make_ranker("sasrec", seed=0, max_length=4, blocks=1, heads=1, hidden_size=8, epochs=1)
    ranker.fit({u: [ITEMS[(u + k) % 20] for k in range(5)] for u in range(8)}, ITEMS)
    return RankerArm("ml_retrain", ranker, 0.1, "").save(path)


def test_a_truncated_or_missing_sasrec_pt_is_one_line(tmp_path):
    from abpo import registry
    from abpo.arms.rankers import RankerArm

    d = _sasrec_arm_dir(tmp_path / "arm")
    w = d / "sasrec.pt"
    whole = w.read_bytes()
    os.truncate(w, len(whole) // 2)
    with pytest.raises(registry.ModelFilesDamaged) as e:
        RankerArm.load("ml_retrain", d)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(f"{w}: not a whole torch weights file ("), msg
    assert "rule: model weights are loaded only when whole" in msg, msg
    w.unlink()
    with pytest.raises(registry.ModelFilesDamaged) as e:
        RankerArm.load("ml_retrain", d)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and f"{d}: missing sasrec.pt" in msg and "ranker sasrec" in msg, msg
    w.write_bytes(whole)
    assert RankerArm.load("ml_retrain", d).ranker.name == "sasrec"


def test_the_rankers_own_load_names_the_file_in_one_line(tmp_path):
    from abpo.baselines import load_ranker

    d = _sasrec_arm_dir(tmp_path / "arm")
    w = d / "sasrec.pt"
    os.truncate(w, w.stat().st_size - 100)
    with pytest.raises(ValueError, match=rf"^{w}: not loadable SASRec weights \(") as e:
        load_ranker(d)
    assert len(str(e.value).splitlines()) == 1
    w.unlink()
    with pytest.raises(FileNotFoundError, match=rf"^{w}: missing; rule: a SASRec ranker's directory holds"):
        load_ranker(d)


def _register(cfg, arm_dir) -> str:
    from abpo import registry
    from abpo.arms import promotion, versions as arm_versions

    with registry.start_run(cfg, arm_versions.EXPERIMENT, "refit") as run:
        uri = arm_versions.log_arm_model(cfg, "ml_retrain", arm_dir)
    return str(promotion.register_champion(cfg, "ml_retrain", uri, run.info.run_id, {"source": "refit"}).version)


@pytest.mark.slow  # MLflow logs and downloads three small models: ~30 s
def test_a_version_without_its_weights_is_never_a_complete_download(tmp_path, caplog):
    from abpo import registry
    from abpo.arms import versions as arm_versions
    from abpo.config import load_config

    cfg = load_config("tiny", [f"paths.root={tmp_path / 'var'}", *SASREC_RANKER_MONTH])
    # a version registered without sasrec.pt: the download holds every file the registry has, and is still refused
    lacking = _sasrec_arm_dir(tmp_path / "lacking")
    (lacking / "sasrec.pt").unlink()
    v = _register(cfg, lacking)
    with pytest.raises(registry.ModelFilesDamaged) as e:
        arm_versions.local_dir(cfg, "ml_retrain", v)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "missing sasrec.pt" in msg and f"abpo-arm-ml_retrain v{v}" in msg, msg
    dst = cfg.paths.resolve("models") / "registry" / "abpo-arm-ml_retrain" / f"v{v}"
    assert not (dst / ".complete").exists()  # nothing taken for a whole copy

    # a version whose registered sasrec.pt is truncated: refused by its integrity check, not by torch
    truncated = _sasrec_arm_dir(tmp_path / "truncated")
    os.truncate(truncated / "sasrec.pt", (truncated / "sasrec.pt").stat().st_size // 2)
    v2 = _register(cfg, truncated)
    with pytest.raises(registry.ModelFilesDamaged) as e:
        arm_versions.local_dir(cfg, "ml_retrain", v2)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "sasrec.pt: not a whole torch weights file" in msg, msg
    assert f"in the registry's copy of abpo-arm-ml_retrain v{v2}" in msg, msg

    # a whole version cached by an older abpo whose marker accepted it without its weights: downloaded again
    v3 = _register(cfg, _sasrec_arm_dir(tmp_path / "whole"))
    arm_versions.local_dir(cfg, "ml_retrain", v3)  # cached whole first
    done = dst.parent / f"v{v3}" / ".complete"
    marker = json.loads(done.read_text())
    rel = next(k for k in marker["files"] if k.endswith("sasrec.pt"))
    (done.parent / rel).unlink()
    del marker["files"][rel]
    done.write_text(json.dumps(marker))
    again = arm_versions.local_dir(cfg, "ml_retrain", v3)
    assert (again / "sasrec.pt").exists() and "fails its check" in caplog.text and "sasrec.pt" in caplog.text
