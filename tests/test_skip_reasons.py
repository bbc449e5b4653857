"""check's skip line folds numbers, so one reason at several sizes counts once, but never the
digits inside a name (fp8_kv, int64): a reason must stay readable."""
from __future__ import annotations

import pandas as pd

from harness.tools.check import _reasons


def test_numbers_fold_and_names_keep_their_digits():
    skipped = pd.DataFrame({"message": [
        "bundled lacks feature fp8_kv", "bundled lacks feature fp8_kv",
        "block_size 12: multiples of 16", "block_size 4: multiples of 16",
        "an int64 index tensor"]})
    line = _reasons(skipped)
    assert "2: bundled lacks feature fp8_kv" in line
    assert "2: block_size N: multiples of N" in line
    assert "an int64 index tensor" in line
