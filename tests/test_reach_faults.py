"""Generator reach, round three (issue 37): each class of case built for a crossing or a
boundary that no family visited before catches a defect planted there, with at least 10 ci
rows, and the ci profile without those cases misses it.

A class's defect is a test-only fault (kernels.testonly.REACH_FAULTS, in the test-only
library; the k/v pair's is a run() check of k alone, planted here since run()'s checks are
Python). Each is the identity wherever its trigger (a predicate on a case's params, written
from the fault's code) is false. Three things are shown per class:

  - no ci case outside the class's new ones meets the trigger: the old profile cannot see it;
  - every new case that meets it fails under the fault, at least 10 rows, on the routes
    the class was built for;
  - the old cases nearest to it (the same routes and code paths; one of each route, family,
    variant and dtype) all pass under the fault: the trigger is not narrower than the fault.

In this process through execute_case (testonly.fault_library points the bundled adapter at
the test-only library); the fault that dies (a 32-bit offset wrapped before the buffer)
runs each case in a child forked from this process (harness/engine/child.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from cases import generate
from detection_helpers import keep_references
from harness.engine.child import Spec, run as run_child
from harness.engine.execute import execute_case
from harness.model.problem import normalize
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.targets import load_target
from kernels import guards, testonly
from kernels.build import detect

pytestmark = pytest.mark.skipif(detect()[0] != "host", reason="runs the host library in this process")

PAIR_FAULT = "pair_checked_on_k_alone"
PAIR_FIELDS = ("page_size", "dtype")


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _ws_misplanned(c) -> bool:
    """A split whose workspace lies in [need - the partial LSEs, need) at the chunk the
    planner settles on: the plan the fault makes differs only there. ll4mi's and aiter's own
    kernels (no LSE asked) never split: their plan's workspace is never read."""
    from cases.schedule import DEFAULT_CHUNK
    p = c.params
    if "workspace_bytes" not in p:
        return False
    if c.backend in ("ll4mi", "aiter") and not p.get("return_lse"):
        return False
    n = normalize(p)
    qo, kv, hq, dv = n["qo_lens"], n["kv_lens"], n["num_qo_heads"], n["head_dim_vo"]
    ws, chunk = p["workspace_bytes"], p.get("max_kv_chunk") or DEFAULT_CHUNK

    def need(c, lse=True):
        chunks = [max(1, -(-k // c)) for k in kv]
        if all(x == 1 for x in chunks) and not p.get("use_cuda_graph"):   # a graph always splits
            return 0
        return sum(q * x for q, x in zip(qo, chunks)) * hq * (dv + (1 if lse else 0)) * 4
    while True:
        if need(chunk, lse=False) <= ws < need(chunk):
            return True
        if need(chunk) <= ws or p.get("max_kv_chunk") or chunk >= max([1, *kv]):
            return False
        chunk = min(2 * chunk, max(kv))           # kernels/_plan.py fit_chunk


def _feature_rescaled(c) -> bool:
    p = c.params
    n = normalize(p)
    rescaled = p.get("sinks") not in (None, False) or (
        bool(p.get("kv_dtype")) and p.get("v_scale", 1.0) != 1.0)
    return rescaled and n["head_dim_vo"] > n["head_dim"]


@dataclass(frozen=True)
class Reach:
    new: Callable            # Case -> bool: the cases built for the class
    trigger: Callable        # Case -> bool: where the fault changes what runs
    routes: frozenset        # the routes the caught rows cover, every one
    near: Callable           # Case -> bool: old cases on the same routes and code paths
    dies: bool = False       # the fault kills the process (run in forked children)


CLASSES = {
    PAIR_FAULT: Reach(
        new=lambda c: c.family == "pair_fields",
        trigger=lambda c: (c.params.get("mismatch") or {}).get("only") == "v"
        and c.params["mismatch"]["field"] in PAIR_FIELDS,
        routes=frozenset(r for r in BUNDLED_ROUTES if op_of(r) in (
            "paged_prefill", "ragged_prefill", "batch_decode")),
        near=lambda c: c.family == "misplanned" and c.route in ("fa2.paged_prefill",
                                                                 "fa2.ragged_prefill",
                                                                 "fa2.batch_decode")
        and (c.params.get("mismatch") or {}).get("field") in PAIR_FIELDS),
    "page_offset_mask": Reach(
        new=lambda c: c.variant == "page_size_odd",
        trigger=lambda c: "page_size" in c.params and not _pow2(c.params["page_size"])
        and c.expect != "refuse",
        routes=frozenset(r for r in BUNDLED_ROUTES if op_of(r) in (
            "paged_prefill", "batch_decode", "mixed_batch")),
        near=lambda c: c.family == "valid" and "page_size" in c.params
        and c.route in ("fa2.paged_prefill", "fa2.batch_decode", "ll4mi.batch_decode",
                        "fa2.mixed_batch")),
    "token_offset_32": Reach(
        new=lambda c: c.variant.startswith("rows_past_2_31_"),
        trigger=lambda c: str(c.params.get("strided", "")).endswith("_far"),
        routes=frozenset({"fa2.ragged_prefill", "fa2.single_prefill", "fa2.single_decode"}),
        near=lambda c: (c.family == "strided" and c.route in (
            "fa2.ragged_prefill", "fa2.single_prefill", "fa2.single_decode"))
        or (c.family == "scale" and c.route == "fa2.ragged_prefill"),
        dies=True),
    "workspace_without_lse": Reach(
        new=lambda c: c.variant.startswith("ws_edge_"),
        trigger=_ws_misplanned,
        routes=frozenset({"fa2.paged_prefill", "fa2.ragged_prefill", "fa2.batch_decode",
                          "fa2_tc.batch_decode"}),
        near=lambda c: c.family in ("schedule", "valid")
        and (c.params.get("workspace_bytes") or c.params.get("max_kv_chunk"))),
    "empty_merge_keeps_a": Reach(
        new=lambda c: c.variant.startswith("held_empty_"),
        trigger=lambda c: bool(c.params.get("empty_state_values")) and 0 in c.params["kv_lens"],
        routes=frozenset({"fa2.merge_state"}),
        near=lambda c: c.route == "fa2.merge_state" and c.family in ("edge_rows", "valid")),
    "feature_dims_qk": Reach(
        new=lambda c: c.variant.startswith("cover."),
        trigger=_feature_rescaled,
        routes=frozenset({"fa2.single_prefill", "fa2.single_decode", "fa2.paged_prefill",
                          "fa2.ragged_prefill"}),
        near=lambda c: (c.family == "features" and c.route in ("fa2.single_prefill",
                                                                "fa2.paged_prefill")
                        and bool({"sinks", "fp8_kv"} & set(c.requires)))
        or (c.family == "schedule" and "vo_dim" in c.variant)),
}
FAILS_AS = {"wrong", "silent", "crash", "corrupt"}


@pytest.fixture(scope="module")
def ci():
    return generate(None, BUNDLED_ROUTES, profile="ci")


@pytest.fixture(scope="module")
def target():
    return load_target("bundled")


@pytest.fixture(scope="module")
def references() -> dict:
    """Each case's reference, computed once for this module's runs of it: the new cases are
    judged under their fault and on the faultless library (detection_helpers.keep_references)."""
    return {}


def near_sample(near: list) -> list:
    """The near cases run under a fault: the first of each (route, family, variant, dtype),
    in generation order. Passing under the fault is a property of each near case, and this
    keeps every route, code path (family and variant) and dtype of the near set; the
    variants' other axes (head sizes, layouts, lse or not) repeat those paths. 218 of the
    421 near runs are kept; the rest were ~40% of the module's time."""
    seen, out = set(), []
    for c in near:
        key = (c.route, c.family, c.variant, c.params["dtype"])
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _checked_on_k_alone(real):
    """run()'s plan check with the v side of each k/v pair field left out."""
    def check(where, checks):
        return real(where, [c for c in checks
                            if not (c[0] in PAIR_FIELDS and c[3] in ("v_cache", "v"))])
    return check


def _outcomes(cases, fault, target, monkeypatch, fork=False) -> dict:
    """case id -> (outcome, passed, message) with the fault planted (fork: each case in a
    child forked from this process, for a fault that kills it)."""
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = {}
    if fault == PAIR_FAULT:
        monkeypatch.setattr(guards, "run_matches_plan", _checked_on_k_alone(guards.run_matches_plan))
        for c in cases:
            r = execute_case(c, target, "cpu")
            out[c.id] = (r.outcome, r.passed, r.message)
        return out
    with testonly.fault_library(fault):
        for c in cases:
            if fork:
                # One forked child a case: a death ends the sequence it is in.
                rows = run_child(Spec(target="bundled", cases=[c]), budget_s=120,
                                 fork_from=target).rows
                assert len(rows) == 1, (c.id, rows)
                out[c.id] = (rows[0]["outcome"], rows[0]["pass"], rows[0].get("message", ""))
            else:
                r = execute_case(c, target, "cpu")
                out[c.id] = (r.outcome, r.passed, r.message)
    return out


def test_every_reach_fault_has_its_class():
    assert set(CLASSES) == set(testonly.REACH_FAULTS) | {PAIR_FAULT}


@pytest.mark.parametrize("fault", list(CLASSES))
def test_only_the_new_cases_meet_the_trigger(fault, ci):
    reach = CLASSES[fault]
    new = [c for c in ci if reach.new(c)]
    met = [c for c in new if reach.trigger(c)]
    assert len(met) >= 10, (fault, len(met))
    # Two dtypes at least, and more than one shape (head_dim, heads or lengths).
    assert len({c.params["dtype"] for c in met}) >= 2
    assert len({(c.params["head_dim"], c.params["num_qo_heads"], str(c.params["kv_lens"]))
                for c in met}) >= 2
    # The profile before this round: ci less every class's new cases.
    old = [c.id for c in ci if not any(r.new(c) for r in CLASSES.values())
           and reach.trigger(c)]
    assert not old, old[:5]


@pytest.mark.parametrize("fault", list(CLASSES))
def test_the_fault_fails_the_new_cases_and_passes_the_old_near_ones(fault, ci, target,
                                                                   monkeypatch, references):
    reach = CLASSES[fault]
    met = [c for c in ci if reach.new(c) and reach.trigger(c)]
    near = near_sample([c for c in ci if not any(r.new(c) for r in CLASSES.values())
                        and reach.near(c)])
    assert near, fault
    keep_references(references, monkeypatch)
    got = {**_outcomes(met, fault, target, monkeypatch, fork=reach.dies),
           **_outcomes(near, fault, target, monkeypatch)}
    caught = [c for c in met if not got[c.id][1]]
    missed = [c.id for c in met if got[c.id][1]]
    assert not missed, missed[:5]
    assert len(caught) >= 10
    assert {got[c.id][0] for c in caught} <= FAILS_AS, {got[c.id][0] for c in caught}
    # The routes the class was built for, every one of them.
    assert {c.route for c in caught} == reach.routes
    failing_near = [(c.id, got[c.id][0], got[c.id][2][:80]) for c in near if not got[c.id][1]]
    assert not failing_near, failing_near[:5]


def test_the_new_cases_pass_on_the_faultless_test_only_library(ci, target, monkeypatch,
                                                                 references):
    """The same test-only library with no fault active: what failed above is the faults'."""
    new = [c for c in ci if any(r.new(c) and r.trigger(c) for r in CLASSES.values())]
    keep_references(references, monkeypatch)
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with testonly.fault_library(None):
        failing = [(c.id, r.outcome, r.message[:80]) for c in new
                   for r in [execute_case(c, target, "cpu")] if not r.passed]
    assert not failing, failing[:5]
