"""The bounds relations a signature declares reach every route of flaggems and flashinfer.

Neither library is installed here: their stand-ins (tests/test_target_flaggems.py,
tests/test_target_flashinfer.py) record what each call is handed. For every relation on a
field the target's signature carries (kv lengths, block table / page indices, query
offsets, last-page lengths, stated maxima), one case per route must run (not skipped, not
our error) and hand the library the bent value: the relation reached the call."""
from __future__ import annotations

import pytest
import torch

import cases as families
from harness.engine.execute import execute_case
from harness.model.relations import BY_VARIANT
from harness.targets import flaggems as fg_target
from harness.targets import flashinfer as fi_target
from test_target_flaggems import FakeFlagGems
from test_target_flashinfer import FakeDecode, FakeFlashInfer, FakePaged, FakeRagged

BOUNDS = ("kv_lens", "block_table", "query_start_loc", "last_page_len", "max_seqlen_q",
          "max_seqlen_k")


def _cases(route, metadata):
    out = {}
    for c in families.generate(["misplanned"], routes=(route,)):
        mm = c.params.get("mismatch")
        if (mm and mm["field"] in BOUNDS and mm["field"] in metadata
                and c.params["dtype"] == "bf16" and c.variant not in out):
            out[c.variant] = c
    return list(out.values())


def _run(case, target):
    result = execute_case(case, target, device="cpu")
    assert result.outcome not in ("skipped", "harness_error"), (case.id, result.message)
    return result


# ---- flaggems -----------------------------------------------------------------------------

def _fg_handed(call, field):
    if field == "kv_lens":
        return call["seqused_k"].tolist()[-1]
    if field == "block_table":
        return call["block_table"].tolist()[-1][0]
    if field == "query_start_loc":
        return call["cu_seqlens_q"].tolist()
    return call[field]


@pytest.mark.parametrize("route", ["fg.paged_prefill", "fg.batch_decode", "fg.ragged_prefill"])
def test_flaggems_bounds_reach_the_call(route):
    fake = FakeFlagGems()
    target = fg_target.make_target(module=fake, device="cpu")
    chosen = _cases(route, target.capabilities.metadata)
    fields = {c.params["mismatch"]["field"] for c in chosen}
    want = {"query_start_loc", "max_seqlen_q", "max_seqlen_k"}
    if route != "fg.ragged_prefill":
        want |= {"kv_lens", "block_table"}
    assert fields == want, fields
    for case in chosen:
        before = len(fake.calls)
        _run(case, target)
        assert len(fake.calls) == before + 1, case.id
        mm = case.params["mismatch"]
        handed = _fg_handed(fake.calls[-1], mm["field"])
        value = mm["value"]
        if mm["field"] == "query_start_loc" and not isinstance(value, list):
            handed = handed[-1]           # a scalar bends the offsets' last entry
        assert handed == value, (case.id, handed, value)


# ---- flashinfer ---------------------------------------------------------------------------

class _Recorded:
    plans: list = []


def _recording(cls):
    class Rec(cls):
        def plan(self, *args, **kw):
            _Recorded.plans.append((cls.__name__, args, kw))
            return super().plan(*args, **kw)
    return Rec


class RecordingFlashInfer(FakeFlashInfer):
    BatchPrefillWithPagedKVCacheWrapper = _recording(FakePaged)
    BatchPrefillWithRaggedKVCacheWrapper = _recording(FakeRagged)
    BatchDecodeWithPagedKVCacheWrapper = _recording(FakeDecode)


def _fi_handed(plan, field):
    name, args, kw = plan
    names = {"FakePaged": ("qo_indptr", "paged_kv_indptr", "paged_kv_indices",
                           "paged_kv_last_page_len"),
             "FakeDecode": ("indptr", "indices", "last_page_len"),
             "FakeRagged": ("qo_indptr", "kv_indptr")}[name]
    got = dict(zip(names, args), **kw)

    def ints(key):
        return [int(x) for x in got[key]]
    if field == "query_start_loc":
        return ints("qo_indptr")
    if field == "last_page_len":
        return ints("paged_kv_last_page_len" if name == "FakePaged" else "last_page_len")[-1]
    indptr = ints("paged_kv_indptr" if name == "FakePaged" else "indptr")
    indices = ints("paged_kv_indices" if name == "FakePaged" else "indices")
    return indices[indptr[-2]]


@pytest.mark.parametrize("route", ["fi_fa2.paged_prefill", "fi_fa2.batch_decode",
                                   "fi_tc.batch_decode", "fi_fa2.ragged_prefill"])
def test_flashinfer_bounds_reach_plan(route, monkeypatch):
    # The stand-in never reads its workspace: FlashInfer's recommended 128 MB, zeroed for
    # every case, was most of this test's time.
    monkeypatch.setattr(fi_target, "WORKSPACE_BYTES", 1 << 20)
    target = fi_target.FlashInferTarget(RecordingFlashInfer(), torch.device("cpu"),
                                        fi_target.ROUTES_FA2)
    chosen = _cases(route, target.capabilities.metadata)
    fields = {c.params["mismatch"]["field"] for c in chosen}
    want = {"paged": {"query_start_loc", "last_page_len", "block_table"},
            "batch_decode": {"last_page_len", "block_table", "query_start_loc"},
            "ragged": {"query_start_loc"}}
    key = "paged" if "paged" in route else "ragged" if "ragged" in route else "batch_decode"
    assert fields == want[key], fields
    reached = set()
    for case in chosen:
        mm = case.params["mismatch"]
        _Recorded.plans.clear()
        result = execute_case(case, target, device="cpu")
        if key == "batch_decode" and mm["field"] == "query_start_loc":
            # a decode plan takes no query offsets: skipped, naming why
            assert result.outcome == "skipped" and "qo_indptr" in result.message, result.message
            continue
        assert result.outcome not in ("skipped", "harness_error"), (case.id, result.message)
        assert _Recorded.plans, case.id
        handed = _fi_handed(_Recorded.plans[0], mm["field"])
        value = mm["value"]
        if mm["field"] == "query_start_loc" and not isinstance(value, list):
            handed = handed[-1]
        assert handed == value, (case.id, handed, value)
        reached.add(mm["field"])
    assert reached == want[key] - ({"query_start_loc"} if key == "batch_decode" else set())


def test_descriptors_declare_the_bounds():
    from harness.targets.descriptors import flaggems, flashinfer
    assert {"kv_lens", "block_table", "query_start_loc", "max_seqlen_q",
            "max_seqlen_k"} <= set(flaggems.CAPABILITIES.metadata)
    assert {"block_table", "query_start_loc", "last_page_len"} <= set(
        flashinfer.CAPABILITIES.metadata)
    assert BY_VARIANT["block_table_negative"].value == -1


def test_a_scalar_is_a_relation_only_where_a_plan_and_its_run_both_read_it():
    from harness.model.signature import Arg, Signature
    q = Arg("query", "q", "run")
    plans_only = Signature(args=(Arg("causal", "causal", "prefill.plan"),
                                 Arg("causal", "causal", "decode.plan"), q), core="declared")
    both = Signature(args=(Arg("causal", "causal", "plan"), Arg("causal", "causal", "run"),
                           Arg("window", "window", "plan"), q), core="declared")
    assert "causal" not in plans_only.fields()        # two plans, no run reads it
    assert "causal" in both.fields() and "window" not in both.fields()
    assert both.reach()["causal"] == ""
