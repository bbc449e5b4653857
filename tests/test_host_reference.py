"""A device problem's reference on the CPU: the same bits, the same values, and only when small."""
from __future__ import annotations

import pytest
import torch

from harness.model.sizes import case_work
from harness.model.problem import HOST_REFERENCE_WORK, build_problem
from harness.model.reference import attention_baseline, attention_reference

SMALL = {"head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2, "qo_lens": [3, 0, 17],
         "kv_lens": [5, 9, 40], "causal": True, "return_lse": True}


@pytest.mark.parametrize("values", ["normal", "large_logits", "tiny", "ties"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_host_copy_is_the_cpu_problem_bit_for_bit(values, dtype):
    params = dict(SMALL, values=values, dtype=dtype)
    # "meta" stands in for a GPU here: a device that is not the CPU.
    on_device = build_problem(params, 7, "meta")
    host, cpu = on_device.on_host(), build_problem(params, 7, "cpu")
    assert host is not None and host.device.type == "cpu" and host.host_qkv is None
    for name in ("q", "k", "v"):
        assert all(a.dtype == b.dtype and torch.equal(a, b)
                   for a, b in zip(getattr(host, name), getattr(cpu, name))), name
    for fn in (attention_reference, attention_baseline):
        want, got = fn(cpu), fn(host)
        for key in ("o", "lse"):
            assert torch.equal(got[key], want[key]), (fn.__name__, key)


def test_a_cpu_problem_is_its_own_host_copy_and_keeps_no_other():
    p = build_problem(SMALL, 1, "cpu")
    assert p.on_host() is p and p.host_qkv is None


def test_a_problem_past_the_threshold_keeps_no_copy():
    params = {"head_dim": 64, "num_qo_heads": 8, "qo_lens": [64], "kv_lens": [2048]}
    assert case_work(params) > HOST_REFERENCE_WORK
    assert build_problem(params, 0, "meta").on_host() is None
    small = dict(params, kv_lens=[HOST_REFERENCE_WORK // (64 * 8 * 64)])
    assert case_work(small) == HOST_REFERENCE_WORK
    assert build_problem(small, 0, "meta").on_host() is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_a_small_case_is_judged_on_the_cpu_and_a_wrong_answer_still_fails():
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    target = load_target("bundled")
    case = next(c for c in target.cases(["valid"]) if c.expect == "match"
                and case_work(c.params) <= HOST_REFERENCE_WORK)
    assert execute_case(case, target, "cuda").outcome == "match"
    run = target.run

    def off_by_a_little(case, problem, buffers):
        result = run(case, problem, buffers)
        result["o"] = result["o"] + 0.25
        return result
    target.run = off_by_a_little
    try:
        assert execute_case(case, target, "cuda").outcome == "wrong"
    finally:
        target.run = run


def _first_valid_case_of_each_route():
    from harness.targets import load_target
    firsts = {}
    for case in load_target("bundled").cases(["valid"], "ci"):
        if case.expect == "match":
            firsts.setdefault(case.route, case)
    return list(firsts.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", _first_valid_case_of_each_route() if torch.cuda.is_available()
                         else [], ids=lambda c: c.route)
def test_on_a_gpu_every_route_runs_its_first_valid_case_to_a_match(case):
    # Every route's whole GPU path (its plan's CPU tensors watched beside device ones, the
    # canaries, the reference on either side): a harness error on one route shows here.
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    result = execute_case(case, load_target("bundled"), "cuda")
    assert result.outcome == "match", (result.outcome, result.message)
