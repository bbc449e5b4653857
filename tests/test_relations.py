"""The call signature and the relations derived from it: one input, one contract.

The contract of a misplanned case must follow from what the library is handed: the
arguments after the adapter's mapping (the neutral cores' own code builds them here), read
by relations.violations. A case whose arguments break no relation is a valid (perhaps
padded) problem and must be `match`; one that breaks any must be `refuse`. So two cases
that hand a library the same input never carry different contracts."""
from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import cases
from harness.model.capabilities import Capabilities
from harness.model.problem import build_problem
from harness.model.relations import RELATIONS, contract_of, violations
from harness.model.signature import CORE_FIELDS, Arg, Signature
from harness.targets.block_table import mismatch as bt_mismatch
from harness.targets.block_table.batch import build as bt_build
from harness.targets.layout import build_paged
from harness.targets.plan_run import mismatch as pr_mismatch

DTYPE_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _misplanned(routes=("vllm.paged_prefill", "vllm.batch_decode", "fa2.paged_prefill",
                        "fa2.ragged_prefill", "fa2.batch_decode")):
    return [c for c in cases.generate(["misplanned"], routes=routes)
            if "mismatch" in c.params]


# ---- the signature ---------------------------------------------------------------------------

def test_unknown_role_is_refused_naming_it():
    with pytest.raises(ValueError, match="unknown role 'seqlens'"):
        Arg("seq_lens", "seqlens", "run")


def test_signature_derives_metadata_and_vocabulary():
    sig = Signature(args=(Arg("query", "q", "run"), Arg("seq_lens", "kv_lengths", "run"),
                          Arg("num_heads_q", "num_qo_heads", "plan"),
                          Arg("block_table", "block_table", "run")),
                    core="block_table")
    assert sig.metadata() == {"num_qo_heads": "plan", "kv_lens": "run", "block_table": "run"}
    assert sig.vocabulary()["kv_lens"] == ("seq_lens",)
    assert sig.vocabulary()["num_qo_heads"] == ("num_heads_q",)
    caps = Capabilities(ops=frozenset({"paged_prefill"}), signature=sig,
                        vocabulary={"kv_lens": ("seq_len",)})
    # declared names first, the signature's added; the metadata is the signature's
    assert caps.vocabulary["kv_lens"] == ("seq_len", "seq_lens")
    assert caps.lacks("paged_prefill", {}, ("metadata.kv_lens",)) is None
    assert caps.lacks("paged_prefill", {}, ("metadata.batch_size",)) == "metadata field batch_size"


def test_unreached_field_says_why_and_is_not_metadata():
    sig = Signature(args=(Arg("indices", "page_indices", "plan"),), core="plan_run",
                    unreached=(("block_table", "no guard yet"),))
    assert "block_table" not in sig.metadata()
    assert sig.reach()["block_table"] == "no guard yet"
    bare = Signature(args=(Arg("indices", "page_indices", "plan"),))
    assert "perform" in bare.reach()["block_table"]


def test_older_declarations_still_load():
    """A Capabilities written before the signature (metadata and vocabulary by hand)."""
    caps = Capabilities(ops=frozenset({"paged_prefill"}), metadata={"kv_lens": "run"},
                        vocabulary={"kv_lens": ("seq_lens",)})
    assert caps.signature is None and caps.metadata == {"kv_lens": "run"}


def test_core_fields_are_what_the_cores_perform():
    assert set(CORE_FIELDS["plan_run"]) == set(pr_mismatch.FIELDS)
    assert set(CORE_FIELDS["block_table"]) == set(bt_mismatch.FIELDS)


def test_descriptors_import_no_torch():
    from harness.targets.descriptors import NAMES
    mods = sorted(NAMES.values()) + ["harness.targets.descriptors.vllm_cpu"]
    code = ("import sys, importlib\n"
            "import harness.targets\n"
            f"for m in {mods!r}:\n"
            "    d = importlib.import_module(m)\n"
            "    assert d.SIGNATURE.args, m\n"
            "    assert m.endswith('vllm_cpu') or d.CAPABILITIES.ops, m\n"
            "bad = sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))\n"
            "print('TORCH' if bad else 'CLEAN')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "CLEAN"


# ---- one input, one contract ------------------------------------------------------------------

def _block_table_values(case) -> dict:
    """What a vLLM-shaped call is handed for this case (the block-table core's own mapping)."""
    p = build_problem(case.params, case.seed)
    batch = bt_mismatch.perturb(bt_build(p, int(case.params["page_size"])), case.params["mismatch"])
    return {"q_rows": batch.query.shape[0], "q_heads": batch.query.shape[1],
            "q_dim": batch.query.shape[-1], "q_dtype": DTYPE_NAME[batch.query.dtype],
            "num_qo_heads": batch.num_qo_heads, "num_kv_heads": batch.num_kv_heads,
            "head_dim": batch.head_dim, "dtype": DTYPE_NAME[p.dtype],
            "k_heads": batch.key.shape[1], "v_heads": batch.value.shape[1],
            "batch_size": batch.num_reqs, "qo_offsets": batch.query_start_loc,
            "kv_lens": batch.seq_lens, "block_table": batch.block_table,
            "num_blocks": batch.num_blocks, "block_size": batch.block_size,
            "causal_planned": batch.planned.get("causal", p.causal), "causal_run": p.causal,
            "window_planned": batch.planned.get("window", p.window_left),
            "window_run": p.window_left}


def _plan_run_values(case) -> dict:
    """What a FlashInfer-shaped plan() and run() are handed (the plan_run core's mapping)."""
    p = build_problem(case.params, case.seed)
    c = SimpleNamespace(mismatch=case.params["mismatch"], problem=p, params=case.params,
                        layout=case.params.get("layout", "NHD"), case=case)
    op = case.op
    pr_mismatch.check_index_field(c, op)
    v = {"num_qo_heads": p.num_qo_heads, "num_kv_heads": p.num_kv_heads,
         "head_dim": p.head_dim, "head_dim_vo": p.head_dim_vo, "dtype": DTYPE_NAME[p.dtype]}
    if op == "ragged_prefill":
        q, k, vv = pr_mismatch.perturb_ragged(c, p.q_packed(), p.k_packed(), p.v_packed())
        v.update(k_heads=k.shape[1], v_heads=vv.shape[1], v_dim=vv.shape[-1],
                 kv_rows_k=k.shape[0], kv_rows_v=vv.shape[0],
                 kv_offsets=p.kv_indptr.tolist())
    else:
        paged = build_paged(p, int(case.params["page_size"]), c.layout, "shuffled", 0, case.seed)
        q, cache = pr_mismatch.perturb(c, p.q_packed(), paged.cache("tuple"))
        head = 2 if c.layout == "NHD" else 1
        page = 1 if c.layout == "NHD" else 2
        v.update(k_heads=cache[0].shape[head], v_heads=cache[1].shape[head],
                 v_dim=cache[1].shape[-1], page_size_held=cache[0].shape[page],
                 page_size_stated=paged.page_size,
                 last_page_len=pr_mismatch.index_values(c, "last_page_len", paged.last_page_len))
        indices = pr_mismatch.index_values(c, "kv_indices", paged.indices, paged.indptr)
        v.update(num_blocks=paged.k_pages.shape[0], block_size=paged.page_size,
                 kv_lens=list(p.kv_lens),
                 block_table=[indices[a:b] for a, b in zip(paged.indptr, paged.indptr[1:])])
    v.update(q_rows=q.shape[0], q_heads=q.shape[1] if q.dim() == 3 else None,
             q_dim=q.shape[-1] if q.dim() == 3 else None, q_rank=q.dim(),
             q_dtype=DTYPE_NAME[q.dtype])
    if op != "batch_decode":
        v["qo_offsets"] = pr_mismatch.index_values(c, "qo_indptr", p.qo_indptr.tolist())
    else:     # a decode plan's offsets are implicit: one query row per request it plans
        v["qo_offsets"] = list(range(p.batch_size + 1))
    return {k: x for k, x in v.items() if x is not None}


def _effective(case):
    from harness.targets.base import Skip
    core = _block_table_values if case.backend == "vllm" else _plan_run_values
    if case.backend == "vllm" and case.params["mismatch"]["field"] not in bt_mismatch.FIELDS:
        return None
    if case.backend != "vllm" and case.params["mismatch"]["field"] not in pr_mismatch.FIELDS:
        return None
    try:
        return core(case)
    except Skip:
        return None     # the core cannot lay this input out: no input, no contract to hold


@pytest.fixture(scope="module")
def judged():
    out = []
    seen = set()
    for case in _misplanned():
        # one call form and dtype per variant and route suffices: the forms and dtypes hand
        # the same index and tensor shapes (the forms' own contract: test_families)
        key = (case.route, case.variant)
        if key in seen:
            continue
        seen.add(key)
        values = _effective(case)
        if values is not None:
            out.append((case, violations(values)))
    return out


def test_contract_follows_the_input(judged):
    """Every misplanned case: refuse exactly when its handed arguments break a relation the
    run cannot resolve, match_or_refuse when they break only ones it can (its own causal
    flag and window), match when they break none."""
    wrong = [(c.id, c.expect, sorted(v)) for c, v in judged if c.expect != contract_of(v)]
    assert not wrong, wrong
    assert len(judged) > 80


def test_same_input_same_contract(judged):
    by_input = defaultdict(set)
    for c, v in judged:
        by_input[(c.route, c.params["dtype"], v)].add(c.expect)
    assert all(len(e) == 1 for e in by_input.values()), \
        {k: e for k, e in by_input.items() if len(e) > 1}


def test_the_retired_short_offsets_input_is_padding():
    """query_start_loc's last entry short of q's rows (the retired case) breaks nothing:
    it is q_rows_padded's input, which must match; so no refuse case may hand it."""
    values = {"q_rows": 19, "qo_offsets": [0, 7, 18], "batch_size": 2, "kv_lens": [25, 40]}
    assert violations(values) == frozenset()
    assert "query_start_loc_short" not in {r.variant for r in RELATIONS}


def test_every_relation_breaks_what_it_says():
    """The detector itself: each broken relation shows in violations."""
    base = {"q_rows": 19, "q_heads": 8, "num_qo_heads": 8, "qo_offsets": [0, 7, 19],
            "batch_size": 2, "kv_lens": [25, 40], "block_table": [[3, 1], [0, 2, 4]],
            "num_blocks": 6, "block_size": 16}
    assert violations(base) == frozenset()
    assert "count.q_heads" in violations({**base, "q_heads": 16})
    assert "offsets.last_past_rows" in violations({**base, "qo_offsets": [0, 7, 20]})
    assert "offsets.first" in violations({**base, "qo_offsets": [-1, 7, 19]})
    assert "offsets.monotone" in violations({**base, "qo_offsets": [0, 12, 7, 19],
                                             "batch_size": 3, "kv_lens": [1, 1, 1]})
    assert "count.batch" in violations({**base, "batch_size": 1})
    assert "lengths.negative" in violations({**base, "kv_lens": [25, -1]})
    assert "lengths.past_table" in violations({**base, "kv_lens": [25, 64]})
    assert "index.negative" in violations({**base, "block_table": [[3, 1], [-1, 2, 4]]})
    assert "index.past_pool" in violations({**base, "block_table": [[3, 1], [6, 2, 4]]})
    assert "maxima.kv" in violations({**base, "max_seqlen_k": 39})
    assert violations({**base, "max_seqlen_k": 45}) == frozenset()


def test_no_two_cases_of_any_family_hand_the_same_input_with_different_contracts():
    """Over every family's catalogue, on the bundled routes and a vLLM-shaped target's: two
    cases on one op whose params are the same (what any adapter maps to the library's
    arguments) carry the same contract."""
    routes = tuple(__import__("harness.model.routes", fromlist=["BUNDLED_ROUTES"]).BUNDLED_ROUTES) \
        + ("vllm.paged_prefill", "vllm.batch_decode", "vllm.mixed_batch", "vllm.single_prefill")
    import json
    by_input = defaultdict(dict)
    for c in cases.generate(None, routes=routes):
        key = (c.op, json.dumps(dict(c.params), sort_keys=True, default=str))
        by_input[key][c.id] = c.expect
    clashes = {k[0]: ids for k, ids in by_input.items() if len(set(ids.values())) > 1}
    assert not clashes, list(clashes.items())[:3]
    assert len(by_input) > 1000


def test_vllm_cpus_signature_derives_its_declared_fields():
    """The vllm-cpu adapter still declares its metadata by hand (the older contract); its
    signature derives the same fields and names every word of its vocabulary's roles."""
    from harness.targets.descriptors.vllm_cpu import SIGNATURE
    from harness.targets.vllm_cpu import CAPABILITIES
    assert set(SIGNATURE.metadata()) == set(CAPABILITIES.metadata)
    derived = SIGNATURE.vocabulary()
    for ours in ("num_qo_heads", "num_kv_heads", "batch_size", "kv_lens"):
        assert set(derived[ours]) & set(CAPABILITIES.vocabulary[ours]), ours
