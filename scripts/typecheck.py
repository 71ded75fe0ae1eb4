"""mypy over abpo/ (its settings: [tool.mypy] in pyproject.toml) against a baseline that only shrinks.

    .venv/bin/python scripts/typecheck.py                    # make typecheck (tests/test_lint.py runs it too)
    .venv/bin/python scripts/typecheck.py --write-baseline   # make typecheck-baseline: record today's count

tests/typecheck_baseline.txt holds the total number of errors and, for information, the count of each file when it
was written. Exit 0 when today's total equals the baseline's; 1 when it is higher (the errors of every file above
its recorded count are printed: the likely new ones) or lower (lower the baseline: make typecheck-baseline); 2 when
mypy itself failed. The total, not each file's count, is the rule: files move and split while the total holds.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tests" / "typecheck_baseline.txt"
ERROR = re.compile(r"^(?P<file>[^:\s]+\.pyi?):\d+:(?:\d+:)? error: ")


def run_mypy() -> tuple[list[str], str]:
    """(mypy's error lines, its whole output). Exits 2 when mypy did not check the package (a crash, a bad
    setting, a syntax error: exit status 2)."""
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    out = done.stdout + done.stderr
    if done.returncode not in (0, 1):
        print(out[-5000:], file=sys.stderr)
        raise SystemExit(f"mypy exited {done.returncode} (not a count of type errors): see above")
    return [line for line in out.splitlines() if ERROR.match(line)], out


def per_file(errors: list[str]) -> Counter:
    return Counter(ERROR.match(line)["file"] for line in errors)


def read_baseline(path: Path = BASELINE) -> tuple[int, Counter]:
    """(the total, the per-file counts) of ``path``; a missing or malformed file names itself and the rule."""
    total, files = None, Counter()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if not value.isdigit():
            raise SystemExit(f"{path}:{n}: {line!r} is not '<total|file> <count>'")
        if key == "total":
            total = int(value)
        else:
            files[key] = int(value)
    if total is None:
        raise SystemExit(f"{path}: no 'total <count>' line (regenerate it: make typecheck-baseline)")
    return total, files


def write_baseline(counts: Counter, path: Path = BASELINE) -> None:
    lines = [
        "# mypy errors over abpo/ ([tool.mypy] in pyproject.toml): the total may only go down",
        "# (scripts/typecheck.py, tests/test_lint.py). Regenerate after fixing errors: make typecheck-baseline",
        f"total {sum(counts.values())}",
        "# per file when written (information only: the rule is the total)",
    ]
    lines += [f"{f} {c}" for f, c in sorted(counts.items())]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-baseline", action="store_true", help=f"record today's counts in {BASELINE.name}")
    args = ap.parse_args(argv)
    errors, _ = run_mypy()
    counts = per_file(errors)
    total = len(errors)
    if args.write_baseline:
        write_baseline(counts)
        print(f"{BASELINE.relative_to(ROOT)}: total {total} in {len(counts)} files")
        return 0
    base_total, base_files = read_baseline()
    print("mypy errors per file (baseline's count in brackets):")
    for f in sorted(set(counts) | set(base_files)):
        if counts[f] or base_files[f]:
            print(f"  {f}: {counts[f]} [{base_files[f]}]")
    print(f"total {total}, baseline {base_total}")
    if total > base_total:
        above = {f for f in counts if counts[f] > base_files[f]}
        print(
            f"\nFAIL: {total - base_total} more mypy error(s) than {BASELINE.relative_to(ROOT)} allows "
            f"(rule: the count only goes down). The errors of the files above their recorded count:"
        )
        for line in errors:
            if ERROR.match(line)["file"] in above:
                print(line)
        return 1
    if total < base_total:
        print(
            f"\nFAIL: {base_total - total} fewer mypy error(s) than the baseline: lower it so they stay fixed "
            f"(make typecheck-baseline, then commit {BASELINE.relative_to(ROOT)})"
        )
        return 1
    print("OK: the same count as the baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
