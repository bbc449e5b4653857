"""The torch-sdpa target on this machine's CPU: a real external library end to end."""
from __future__ import annotations

import pytest
import torch

import cases as families
from harness.model.case import Case
from harness.engine.execute import execute_case
from harness.model.reference import visible_mask
from harness.targets import load_target
from harness.targets.torch_sdpa import bottom_right_mask


@pytest.fixture(scope="module")
def target():
    return load_target("torch-sdpa")


@pytest.mark.parametrize("qo_len,kv_len,causal,window", [
    (5, 9, True, -1), (9, 9, True, -1), (7, 3, True, -1), (4, 12, False, 2),
    (6, 6, True, 0), (1, 17, False, 15), (3, 3, False, -1),
])
def test_mask_is_the_references_bottom_right_mask(qo_len, kv_len, causal, window):
    mask = bottom_right_mask(qo_len, kv_len, causal, window, "cpu")
    expected = visible_mask(qo_len, kv_len, causal, window)
    if mask is None:
        assert bool(expected.all())
    else:
        assert torch.equal(mask, expected)


def test_routes_are_the_backends_this_cpu_has(target):
    assert target.name == "torch-sdpa" and target.platform() == "cpu"
    assert {"sdpa_math.single_prefill", "sdpa_math.single_decode"} <= set(target.routes)
    assert all(r.split(".")[0] in ("sdpa_math", "sdpa_flash") for r in target.routes)


def test_valid_family_passes_on_every_route(target):
    # Every other case keeps this lean; the covering design's rows alternate factors.
    chosen = families.generate(["valid"], routes=target.routes)[::2]
    outcomes = {}
    for case in chosen:
        result = execute_case(case, target, device="cpu")
        assert result.passed, (case.id, result.outcome, result.message)
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
    assert outcomes.get("match", 0) > len(chosen) // 2


def test_lse_comes_from_the_flash_op_and_matches(target):
    if "sdpa_flash.single_prefill" not in target.routes:
        pytest.skip("no CPU flash backend in this torch")
    case = Case("sdpa_flash.single_prefill", "t", "lse",
                {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
                 "qo_lens": [5], "kv_lens": [13], "causal": True, "return_lse": True})
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match", result.message
    assert result.n_total == 5 * 4 * 64 + 5 * 4     # o and lse both compared


def test_math_has_no_lse_and_plan_params_have_no_analogue(target):
    base = {"dtype": "fp16", "head_dim": 64, "num_qo_heads": 2, "qo_lens": [3], "kv_lens": [5]}
    lse = execute_case(Case("sdpa_math.single_prefill", "t", "lse", {**base, "return_lse": True}),
                       target, device="cpu")
    # The output is still judged; the row declares that the LSE could not be.
    assert lse.outcome == "match" and "lse not compared" in lse.message and "LSE" in lse.message
    plan = execute_case(Case("sdpa_math.single_prefill", "t", "mm",
                             {**base, "mismatch": {"field": "rank", "value": 2}}),
                        target, device="cpu")
    assert plan.outcome == "skipped" and "plan" in plan.message
    out = execute_case(Case("sdpa_math.single_prefill", "t", "out", {**base, "strided": "out"}),
                       target, device="cpu")
    assert out.outcome == "skipped" and "out" in out.message


def test_odd_gqa_reaches_torch_and_its_refusal_is_recorded(target):
    case = Case("sdpa_math.single_prefill", "t", "odd",
                {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 12, "num_kv_heads": 8,
                 "qo_lens": [4], "kv_lens": [9], "return_lse": True}, expect="refuse")
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "refused" and "heads" in result.message


def test_strided_k_that_torch_computes_right_is_judged_by_its_output(target):
    case = Case("sdpa_math.single_prefill", "t", "k_stride2",
                {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
                 "qo_lens": [5], "kv_lens": [11], "causal": True, "return_lse": True,
                 "strided": "k"}, expect="match_or_refuse")
    result = execute_case(case, target, device="cpu")
    # A strided view has a defined answer: SDPA's math backend computes it right (its
    # output is compared; the math backend gives no LSE), and that passes.
    assert result.outcome == "match" and result.passed and result.n_wrong == 0
    assert result.n_total == 5 * 4 * 64
    assert "lse not compared" in result.message and "sdpa_math" in result.message
