"""Families whose dtype is not their point reach a library in the dtypes it declares."""
from __future__ import annotations

import cases
from cases._dtypes import each_declared, own_or_first
from harness.model.capabilities import Capabilities
from harness.model.routes import BUNDLED_ROUTES
from harness.targets.base import Target

FAMILIES = ["small_head", "gqa", "restaged_indptr"]


class Fp16Only(Target):
    name = "fp16-only"
    routes = BUNDLED_ROUTES
    capabilities = Capabilities(ops=frozenset({"batch_decode", "single_prefill",
                                               "single_decode", "paged_prefill",
                                               "ragged_prefill", "merge_state",
                                               "mixed_batch"}),
                                dtypes=frozenset({"fp16"}))


def test_the_choice_keeps_the_own_dtype_and_else_takes_the_first_declared():
    assert own_or_first("bf16", None) == "bf16"
    assert own_or_first("bf16", {"fp16", "fp32"}) == "fp16"
    assert own_or_first("fp16", {"bf16", "fp16"}) == "fp16"
    assert own_or_first("bf16", {"fp32"}) == "fp32"
    assert own_or_first("bf16", frozenset()) is None
    assert each_declared(("bf16", "fp16", "fp32"), {"fp32", "fp16"}) == ("fp16", "fp32")
    assert each_declared(("bf16",), {"fp32"}) == ("fp32",)
    assert each_declared(("bf16",), frozenset()) == ()


def test_a_target_without_bf16_gets_every_case_of_the_families_in_fp16():
    every = cases.generate(FAMILIES)
    fp16 = Fp16Only().cases(FAMILIES)
    assert {c.params["dtype"] for c in fp16} == {"fp16"}
    # The same cases, one for one: only the dtype (and the id's dtype tag) moved.
    assert len(fp16) == len(every)
    assert sorted((c.family, c.route, c.variant) for c in fp16) == \
        sorted((c.family, c.route, c.variant) for c in every)
    assert all("fp16" in c.id for c in fp16)
    # The bf16 routes of the families reached it only through this choice.
    assert any(c.params["dtype"] == "bf16" for c in every)


def test_a_target_declaring_every_dtype_keeps_the_bundled_ids():
    class Every(Fp16Only):
        capabilities = Capabilities(ops=Fp16Only.capabilities.ops)
    assert [c.id for c in Every().cases(FAMILIES)] == [c.id for c in cases.generate(FAMILIES)]


def test_the_full_profile_runs_each_declared_dtype():
    full = Fp16Only().cases(["small_head"], profile="full")
    assert {c.params["dtype"] for c in full} == {"fp16"}
    both = cases.generate(["small_head"], profile="full", dtypes={"fp16", "fp32"})
    assert {c.params["dtype"] for c in both} == {"fp16", "fp32"}
