"""Case sizes from params alone: the estimate a ceiling is judged by, and absurd sizes refused."""
from __future__ import annotations

import pytest

from harness.model import budget


def _params(**kw):
    base = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 8, "qo_lens": [1], "kv_lens": [1024]}
    base.update(kw)
    return base


def test_the_estimate_grows_with_the_context_and_the_dtype():
    small = budget.case_bytes_estimate(_params())
    assert budget.case_bytes_estimate(_params(kv_lens=[2048])) > 1.9 * small
    assert budget.case_bytes_estimate(_params(dtype="fp32")) > small
    # At least the inputs in their own dtype: k and v of 1024 tokens x 8 heads x 128.
    assert small >= 2 * 1024 * 8 * 128 * 2


def test_a_case_over_the_ceiling_names_the_estimate_and_the_ceiling():
    params = _params(kv_lens=[1 << 20])
    estimate = budget.case_bytes_estimate(params)
    message = budget.over_ceiling(params, estimate - 1)
    assert f"{estimate:,}" in message and f"{estimate - 1:,}" in message
    assert budget.over_ceiling(params, estimate) is None
    assert budget.over_ceiling(params, None) is None


@pytest.mark.parametrize("params,words", [
    (_params(kv_lens=[-1]), ["kv_lens", "[0]", "0 or more"]),
    (_params(qo_lens=[1 << 31]), ["qo_lens", "2^31"]),
    (_params(kv_lens=[1 << 30, 1 << 30]), ["kv_lens", "sums"]),
    (_params(head_dim=-8), ["head_dim", "0 or more"]),
    (_params(num_qo_heads=2.5), ["num_qo_heads", "whole number"]),
    (_params(kv_lens="1024"), ["kv_lens", "list"]),
    (_params(window_left=float("nan")), ["window_left", "finite"]),
])
def test_absurd_sizes_are_refused_naming_case_and_field(params, words):
    case = {"route": "a.b", "family": "f", "variant": "v", "params": params}
    with pytest.raises(budget.CasesFileError) as err:
        budget.check_cases([case], "c.json")
    assert str(err.value).startswith("c.json: case 0: ")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_sane_case_passes():
    budget.check_cases([{"route": "a.b", "family": "f", "variant": "v", "params": _params()}],
                       "c.json")
