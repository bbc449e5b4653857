"""The restaged class on the block-table core: the caller's seq_lens, query_start_loc and block
table, rewritten in place between the metadata call and the run.

A pure-torch vLLM-shaped stand-in (a metadata call, then a run handed the same tensors)
proves the harness performs each rewrite and judges it: a stand-in that plans from what
the tensors held at the metadata call and runs that plan is caught on every restaged
tensor; one that runs what it is handed passes, with no false `corrupt` from the caller's
own rewrite. vLLM's own kernels are checked where vllm-cpu is installed."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import cases
from harness.engine.execute import execute_case
from harness.model.capabilities import Capabilities
from harness.targets.base import Target
from harness.targets.block_table.batch import FP8_NAN_BYTE, block_pool, build, owned_blocks
from harness.targets.block_table.restage import Metadata, first_batch
from harness.targets.case_calls import CaseCalls

ROUTES = ("bt.batch_decode", "bt.paged_prefill")
BLOCK = 16


def restaged_cases():
    return [c for c in cases.generate(["restaged_indptr"], routes=ROUTES)
            if "metadata_restage" in c.requires]


def _attend(q, k, v, causal, scale):
    """One request's attention in fp32: q [lq, Hq, D], k/v [lk, Hkv, D], bottom-right causal."""
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    k = k.float().repeat_interleave(hq // hkv, dim=1)
    v = v.float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal:
        keep = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)


class StandIn(Target):
    """A vLLM-shaped library: metadata(seq_lens, query_start_loc, block_table) -> plan, then
    run(q, caches, query_start_loc, seq_lens, block_table, plan). With stale=True its plan
    keeps the values the metadata call read and the run uses them (the planted defect);
    else the run reads the tensors it is handed."""
    name = "block-table-stand-in"
    routes = ROUTES
    capabilities = Capabilities(
        ops=frozenset({"batch_decode", "paged_prefill"}), call_forms=frozenset({"out"}),
        features=frozenset({"metadata_restage"}),
        metadata={"kv_lens": "run", "query_start_loc": "run", "block_table": "run"})

    def __init__(self, stale: bool):
        self.stale = stale

    def version(self):
        return "0"

    def platform(self):
        return "cpu"

    def run(self, case, problem, buffers):
        calls = CaseCalls(case, problem, buffers)
        p = problem
        batch = build(p, BLOCK, "shuffled", 0, case.seed)
        k_cache = block_pool(batch, (BLOCK, p.num_kv_heads, p.head_dim), p.dtype, p.device)
        v_cache = block_pool(batch, (BLOCK, p.num_kv_heads, p.head_dim), p.dtype, p.device)
        k_cache.view(-1, p.num_kv_heads, p.head_dim)[batch.slot_mapping] = batch.key
        v_cache.view(-1, p.num_kv_heads, p.head_dim)[batch.slot_mapping] = batch.value
        meta = Metadata(calls, batch)
        held = meta.tensors()
        plan = {n: t.clone() for n, t in held.items()}      # what the metadata call read
        meta.rewrite()
        given = plan if self.stale else held
        qsl, lens, table = (given[n].tolist() for n in ("query_start_loc", "seq_lens",
                                                         "block_table"))
        out = buffers.output((batch.rows, p.num_qo_heads, p.head_dim), p.dtype, "out")
        for r in range(batch.num_reqs):
            n = lens[r]
            blocks = table[r][:-(-n // BLOCK)]
            k = k_cache[blocks].reshape(-1, p.num_kv_heads, p.head_dim)[:n]
            v = v_cache[blocks].reshape(-1, p.num_kv_heads, p.head_dim)[:n]
            q = batch.query[qsl[r]:qsl[r + 1]]
            out[qsl[r]:qsl[r + 1]] = _attend(q, k, v, p.causal, p.head_dim ** -0.5).to(p.dtype)
        return {"o": out}


def test_every_restageable_tensor_has_a_block_table_row_and_the_seed_lengths():
    chosen = restaged_cases()
    assert {tuple(c.params["restage"]) for c in chosen} == {
        ("seq_lens",), ("query_start_loc",), ("block_table",),
        ("seq_lens", "query_start_loc", "block_table")}
    decode = next(c for c in chosen if c.op == "batch_decode" and c.variant == "seq_lens")
    assert decode.params["kv_lens"] == [100, 50, 300] and decode.expect == "match_or_refuse"
    # Nothing without the feature runs them (the bundled library's plan()/run() has none).
    bundled = Capabilities(ops=frozenset({"batch_decode", "paged_prefill"}),
                           features=frozenset({"plan_run", "restage"}))
    assert all(bundled.lacks(c.op, c.params, c.requires) == "feature metadata_restage"
               for c in chosen)


def test_the_first_batch_is_the_run_batch_regrouped():
    class P:
        num_kv_heads, head_dim, head_dim_vo, num_qo_heads, batch_size = 1, 4, 4, 1, 3
        kv_lens, qo_lens = [100, 50, 300], [5, 1, 9]
        q = [torch.zeros(n, 1, 4) for n in (5, 1, 9)]
        k = [torch.zeros(n, 1, 4) for n in (100, 50, 300)]
        v = k
        qo_indptr = torch.tensor([0, 5, 6, 15])

        def q_packed(self):
            return torch.cat(self.q)
    batch = build(P(), BLOCK, "sequential")
    first = first_batch(batch)
    assert first["seq_lens"] == [300, 50, 100]
    assert first["query_start_loc"] == [0, 9, 10, 15]
    assert first["block_table"] == list(reversed(batch.block_table))


def test_the_pool_poisons_only_blocks_no_request_owns():
    class P:
        num_kv_heads, head_dim, head_dim_vo, num_qo_heads, batch_size = 1, 2, 2, 1, 2
        kv_lens, qo_lens = [20, 3], [1, 1]
        q = [torch.zeros(1, 1, 2)] * 2
        k = [torch.zeros(20, 1, 2), torch.zeros(3, 1, 2)]
        v = k
        qo_indptr = torch.tensor([0, 1, 2])

        def q_packed(self):
            return torch.cat(self.q)
    batch = build(P(), BLOCK, "sequential", offset=2)
    owned = owned_blocks(batch)
    assert owned == [2, 3, 4]
    pool = block_pool(batch, (BLOCK, 1, 2), torch.float16, "cpu")
    assert pool.shape[0] == batch.num_blocks == 6
    assert bool(pool[owned].eq(0).all())
    others = [b for b in range(6) if b not in owned]
    assert bool(pool[others].isnan().all())
    fp8 = block_pool(batch, (BLOCK, 1, 2), torch.uint8, "cpu", fp8=True)
    assert bool(fp8[others].eq(FP8_NAN_BYTE).all()) and bool(fp8[owned].eq(0).all())


def test_a_library_that_runs_its_stale_plan_is_caught_on_every_restaged_tensor():
    for case in restaged_cases():
        result = execute_case(case, StandIn(stale=True), device="cpu")
        assert result.outcome == "wrong" and not result.passed, (case.id, result.message)
        assert result.n_wrong > 0


def test_a_library_that_runs_what_it_is_handed_matches_with_no_false_corruption():
    for case in restaged_cases():
        result = execute_case(case, StandIn(stale=False), device="cpu")
        assert result.outcome == "match" and result.passed, (case.id, result.message)
        assert result.n_wrong == 0 and result.n_total > 0


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu is not installed (make setup-vllm-cpu)")


@needs_vllm
def test_vllm_reads_the_rewritten_seq_lens_with_its_stale_schedule():
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    chosen = {(c.op, c.variant): c for c in target.cases(["restaged_indptr"])
              if "metadata_restage" in c.requires}
    seq = execute_case(chosen[("batch_decode", "seq_lens")], target, device="cpu")
    # A schedule for [300, 50, 100] run over [100, 50, 300]: wrong, no error.
    assert seq.outcome == "wrong" and seq.n_total == 3 * 8 * 128 and seq.n_wrong > 0
    table = execute_case(chosen[("batch_decode", "block_table")], target, device="cpu")
    # get_scheduler_metadata reads no block table: the run reads the rewritten one, right.
    assert table.outcome == "match", table.message


@needs_vllm
def test_vllm_is_handed_strided_caches_and_head_major_keys():
    from harness.model.case import Case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    base = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [1, 1], "kv_lens": [17, 40], "causal": False, "window_left": -1,
            "page_size": 16, "return_lse": True}
    hnd = execute_case(Case("vllm.batch_decode", "t", "hnd", {**base, "layout": "HND"}),
                       target, device="cpu")
    assert hnd.outcome == "match" and "lse not compared" in hnd.message, hnd.message
    for name in ("k_cache", "v_cache"):
        case = Case("vllm.batch_decode", "t", name, {**base, "strided": name},
                    expect="match_or_refuse")
        result = execute_case(case, target, device="cpu")
        # vLLM reads a cache with stride(-1) == 2 as packed: the NaN between its elements.
        assert result.outcome == "wrong" and result.n_wrong > 0, (name, result.message)


@needs_vllm
def test_vllm_runs_the_call_form_where_the_library_allocates_its_output():
    from harness.model.case import Case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    base = {"dtype": "fp16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [1, 1], "kv_lens": [17, 40], "causal": False, "window_left": -1,
            "page_size": 16}
    given = execute_case(Case("vllm.batch_decode", "t", "given", base), target, device="cpu")
    assert given.outcome == "match", given.message
    lib = execute_case(Case("vllm.batch_decode", "t", "lib", {**base, "out_form": "library"}),
                       target, device="cpu")
    # Run as vLLM's own layer calls the kernel (a fresh buffer of the output's exact shape)
    # and judged on every element: a performed case, never a skip or a borrowed verdict.
    assert lib.outcome == "match", lib.message
    assert lib.n_total == given.n_total and lib.n_total > 0


def test_a_non_causal_window_is_vllms_only_where_no_key_follows_a_query_row():
    from harness.targets.base import Skip
    vllm_cpu = pytest.importorskip("harness.targets.vllm_cpu")
    assert vllm_cpu.sliding_window_size(True, 15, [5, 9]) == 16
    assert vllm_cpu.sliding_window_size(False, 15, [1, 1, 1]) == 16
    assert vllm_cpu.sliding_window_size(False, -1, [5]) == -1
    with pytest.raises(Skip, match="symmetric"):
        vllm_cpu.sliding_window_size(False, 15, [1, 3])


@needs_vllm
def test_vllm_runs_a_non_causal_decode_window_and_matches():
    from harness.model.case import Case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    case = Case("vllm.batch_decode", "t", "w", {
        "dtype": "bf16", "head_dim": 128, "num_qo_heads": 4, "num_kv_heads": 2,
        "qo_lens": [1, 1], "kv_lens": [37, 70], "causal": False, "window_left": 15,
        "page_size": 16})
    result = execute_case(case, target, device="cpu")
    assert result.outcome == "match" and result.n_total == 2 * 4 * 128, result.message


@needs_vllm
def test_flashinfer_index_names_reach_vllm_as_its_own_tensor_or_skip_in_its_words():
    from harness.model.case import Case
    from harness.targets import load_target
    target = load_target("vllm-cpu")
    base = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [5, 11], "kv_lens": [21, 40], "causal": True, "window_left": -1,
            "page_size": 16}
    # qo_indptr is vLLM's query_start_loc: handed as int64, vLLM refuses it (performed).
    qo = execute_case(Case("vllm.paged_prefill", "t", "qo",
                           {**base, "index_dtype": {"qo_indptr": "int64"}},
                           expect="match_or_refuse", refuse_words=("qo_indptr",)),
                      target, device="cpu")
    assert qo.outcome == "refused" and "Long" in qo.message, qo.message
    for name in ("kv_indptr", "kv_indices", "last_page_len"):
        result = execute_case(Case("vllm.paged_prefill", "t", name, {**base, "strided": name},
                                   expect="match_or_refuse"), target, device="cpu")
        assert result.outcome == "skipped" and "vLLM's CPU attention takes no" in result.message
