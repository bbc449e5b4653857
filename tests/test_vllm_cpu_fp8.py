"""vllm-cpu's fp8 KV cache: its writer quantizes as it writes, rounding toward zero, so the
adapter hands it values that come back to the case's exact stored bytes under both roundings;
what cannot is skipped, never run with other bytes."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from harness.targets import vllm_cpu
from harness.targets.base import Skip

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _stored(dtype, n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(dtype)
    return bits[torch.isfinite(bits.to(torch.float32))]


@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("scale", (1.0, 0.37, 3.0))
def test_the_writer_input_returns_to_the_stored_bytes_under_both_roundings(fp8, dtype, scale):
    stored = _stored(fp8)
    stored = stored[stored.to(torch.float32).abs() * scale < 3e38]
    try:
        given = vllm_cpu.writer_input(stored, scale, dtype)
    except Skip as skip:
        assert "round trip" in str(skip)
        return
    back = given.to(torch.float32) / scale
    want = stored.view(torch.uint8)
    assert torch.equal(back.to(fp8).view(torch.uint8), want)
    assert torch.equal(vllm_cpu._truncated(back, fp8).view(torch.uint8), want)


def test_the_plain_dequantized_value_would_lose_bytes_to_truncation():
    # Why the nudge: dequantized values rounded to bf16 sit below the stored value about half
    # the time, and a writer that rounds toward zero stores the next code down.
    stored = _stored(torch.float8_e4m3fn)
    plain = (stored.to(torch.float64) * 0.37).to(torch.bfloat16).to(torch.float32) / 0.37
    lost = ~torch.eq(vllm_cpu._truncated(plain, torch.float8_e4m3fn).view(torch.uint8),
                     stored.view(torch.uint8))
    assert int(lost.sum()) > 100


def test_a_value_that_cannot_pass_through_the_query_dtype_is_skipped():
    stored = torch.tensor([448.0], dtype=torch.float32).to(torch.float8_e4m3fn)
    with pytest.raises(Skip, match="round trip"):
        vllm_cpu.writer_input(stored, 1e36, torch.float16)   # past fp16's range


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vllm-cpu is not installed (make setup-vllm-cpu)")
def test_scaled_fp8_cases_match_on_vllm_and_a_16_bit_cache_with_scales_is_skipped():
    from harness.engine.execute import execute_case
    from harness.engine.session import all_cases
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    cases = [c for c in all_cases(target)
             if "features.fp8_kv." in c.id and c.id.endswith("-nolse")
             and any(k in c.id for k in ("_scaled/", "_saturated/", "scales_16bit"))]
    assert cases
    outcomes = {}
    for case in cases[:8]:
        # vLLM's backend plans fp8 caches with blocks of 32 (its vec/amx kernels).
        case = dataclasses.replace(case, params={**case.params, "page_size": 32})
        r = execute_case(case, target, "cpu")
        outcomes[case.id] = (r.outcome, r.message)
    for cid, (outcome, message) in outcomes.items():
        if "scales_16bit" in cid:
            assert outcome == "skipped" and "fp8 cache only" in message, (cid, message)
        else:
            assert outcome == "match", (cid, outcome, message)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vllm-cpu is not installed (make setup-vllm-cpu)")
def test_the_table_is_named_for_vllm_not_for_the_adapter_file():
    # The adapter lives in the harness's checkout; the library is the installed vLLM.
    from importlib import metadata

    from harness.engine import identity
    from harness.targets import load_target
    described = identity.describe(load_target("vllm-cpu"))
    assert described["library_commit"] == f"v{metadata.version('vllm-cpu')}"
    assert identity.table_key(described) == described["library_commit"]
