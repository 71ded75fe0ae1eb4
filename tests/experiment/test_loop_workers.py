"""The replicated loop experiment's worker processes (abpo.experiment.loop_workers)."""

from __future__ import annotations


def test_spawned_workers_import_this_abpo_not_a_model_code_copy(tmp_path):
    """A registered model loaded in this process puts its code copy of abpo first on sys.path (MLflow pyfunc
    code_paths); while replicates are spawned, no such copy is on the path (the suite saw a worker read configs from
    one), and the path is restored after."""
    import sys
    from pathlib import Path

    import abpo
    from abpo.experiment.loop_workers import abpo_first_on_path

    copy = tmp_path / "artifacts" / "code"
    (copy / "abpo").mkdir(parents=True)
    (copy / "abpo" / "__init__.py").write_text("")
    sys.path.insert(0, str(copy))
    try:
        before = list(sys.path)
        with abpo_first_on_path():
            assert str(copy) not in sys.path
            # nor any other copy (in a long pytest worker, earlier tests' loaded models leave theirs on the path)
            real = Path(abpo.__file__).resolve().parents[1]
            copies = [p for p in sys.path if (Path(p or ".") / "abpo" / "__init__.py").exists()]
            assert all(Path(p or ".").resolve() == real for p in copies)
            others = [p for p in before if not (Path(p or ".") / "abpo" / "__init__.py").exists()]
            assert [p for p in sys.path if p not in copies] == others  # every other entry kept, in its order
        assert sys.path == before
    finally:
        sys.path.remove(str(copy))
