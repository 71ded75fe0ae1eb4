"""The replicated loop experiment's saved work (abpo.experiment.loop_fingerprints): a folder that other code began
starts over, one this code began resumes; a saved result counts only under its fingerprint and (unless --any-code)
its code."""

from __future__ import annotations


def test_a_folder_that_other_code_began_starts_over_and_results_need_their_code(tmp_path):
    from abpo.experiment import loop_fingerprints as le

    folder = tmp_path / "replicates" / "fp"
    le.start_over_unless(folder, "a")
    (folder / "state").mkdir()
    le.start_over_unless(folder, "a")  # the same code: an interrupted run resumes
    assert (folder / "state").is_dir()
    le.save_json(folder / "result.json", {"fingerprint": "fp", "code": "a"})
    assert le.load_result(folder / "result.json", "fp", "a") == {"fingerprint": "fp", "code": "a"}
    assert le.load_result(folder / "result.json", "fp", "b") is None
    assert le.load_result(folder / "result.json", "fp", None) is not None  # --any-code
    assert le.load_result(folder / "result.json", "other", None) is None
    le.start_over_unless(folder, "b")  # other code: everything it began is gone
    assert not (folder / "state").exists() and (folder / "code.txt").read_text() == "b"
