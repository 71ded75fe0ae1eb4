"""Hand-built consumption sequences the ground truth's tests fit their components on (tests/sim/test_oracles.py,
test_preference.py): five users over items 1..9, item 9 never consumed."""

from __future__ import annotations

SEQS = {1: [1, 2, 5], 2: [1, 2, 6], 3: [3, 1, 2], 4: [4, 3], 5: [7, 8, 7]}
ITEMS = list(range(1, 10))  # item 9 is never consumed
INDEX = {i: j for j, i in enumerate(ITEMS)}
