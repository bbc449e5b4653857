"""Detection, part 2: each guard behind seeds 000 and 002's later fixes, turned off, makes
the harness report the defect class the seeds recorded; with every guard on, the same
cases pass.

  merge_live_rows           graph re-plan 16 -> 8 rows, partial_state   corrupt (rows 8-15
                                                                        behind out written)
  partial_state_needs_lse   partial_state on a split plan, no lse      crash (the merge reads
                                                                        a null lse)
  graph_capacity            re-plan with a smaller batch               match on the host (its
                                                                        answer is defined and
                                                                        nothing is captured);
                                                                        a larger batch, more
                                                                        rows or pages: refused,
                                                                        not naming the field
                                                                        (a failing clarity row)
  plan_copies_indptr        caller restages its CPU indptr / indices /  wrong
                            last_page_len before the first LSE run
  ll4mi_route_selector      head_size 32, 48; a sliding window         wrong
  decode_cu_seqlens_slice   decode-first mixed batch                   wrong or crash

Controls sit next to each guard: cases the guard does not protect still match with
it off, so a detection is the guard's defect and not a broken case.
"""
from __future__ import annotations

import pytest

from detection_helpers import (cases_by_key, failures_with_guards_on, replay_guard_off,
                               run_guard_off)
from harness.model.classify import severity
from harness.targets import load_target

FAMILIES = ("graph_replan", "restaged_indptr", "small_head", "mixed_batch")
_CASES = cases_by_key(FAMILIES)


GRAPH = ("fa2.paged_prefill", "graph_replan")
AITER = ("aiter.batch_decode", "restaged_indptr")
LL4MI = ("ll4mi.batch_decode", "small_head")
FA2_DECODE = ("fa2.batch_decode", "small_head")
MIXED = ("fa2.mixed_batch", "mixed_batch")

# (route and family, variant, guard turned off, outcomes the harness may report)
DETECTIONS = [
    (GRAPH, "rows16_to_8_partial_state", "merge_live_rows", {"corrupt"}),
    (GRAPH, "rows16_to_8_uneven", "merge_live_rows", {"corrupt"}),
    (GRAPH, "rows16_to_16_partial_state", "merge_live_rows", {"match"}),      # control
    (GRAPH, "rows16_to_8_no_partial_state", "merge_live_rows", {"match"}),    # control
    # On host nothing is captured, so the smaller batch computes right: a defined answer
    # computed right passes (match_or_refuse) -- a control, not a detection, here.
    (GRAPH, "batch_shrinks", "graph_capacity", {"match"}),
    # Past the capacity, torch's copy into the caller's buffers or the C scheduler still
    # raises, but without naming the field: a failing `refused` row.
    (GRAPH, "batch_grows", "graph_capacity", {"refused"}),
    (GRAPH, "rows_outgrow", "graph_capacity", {"refused"}),
    (GRAPH, "pages_outgrow", "graph_capacity", {"refused"}),
    (AITER, "indptr", "plan_copies_indptr", {"wrong"}),
    (AITER, "indices", "plan_copies_indptr", {"wrong"}),
    (AITER, "last_page_len", "plan_copies_indptr", {"wrong"}),
    (AITER, "replan_reused_buffers", "plan_copies_indptr", {"wrong"}),
    (AITER, "lse_run_between_plans", "plan_copies_indptr", {"match"}),        # control
    (LL4MI, "d32", "ll4mi_route_selector", {"wrong"}),
    (LL4MI, "d48", "ll4mi_route_selector", {"wrong"}),
    (LL4MI, "d32_window15", "ll4mi_route_selector", {"wrong"}),
    (LL4MI, "d128_window15", "ll4mi_route_selector", {"wrong"}),
    (LL4MI, "d128", "ll4mi_route_selector", {"match"}),                       # control
    (FA2_DECODE, "d32", "ll4mi_route_selector", {"match"}),                   # control
    (MIXED, "decodes1", "decode_cu_seqlens_slice", {"wrong", "crash"}),
    (MIXED, "decodes3_window", "decode_cu_seqlens_slice", {"wrong", "crash"}),
    (MIXED, "decodes8", "decode_cu_seqlens_slice", {"wrong", "crash"}),
]
# Guard off, these kill the process: each runs in a fresh one.
CRASHES = [
    (GRAPH, "partial_state_without_lse", "partial_state_needs_lse"),
]


def _id(row) -> str:
    (route, family), variant, guard = row[0], row[1], row[2]
    return f"{guard}-off/{route}/{family}.{variant}"


@pytest.fixture(scope="module")
def target():
    return load_target("bundled")


@pytest.mark.parametrize("row", DETECTIONS, ids=[_id(r) for r in DETECTIONS])
def test_guard_off_is_detected(row, target, monkeypatch):
    (route, family), variant, guard, outcomes = row
    case = _CASES[(route, family, variant)]
    r = run_guard_off(case, target, guard, monkeypatch)
    assert r.outcome in outcomes, f"{case.id}: {r.outcome} {r.message}"
    # A detection is a failing row; a control (a case that still matches) passes.
    control = outcomes == {"match"}
    assert r.passed == control, f"{case.id}: {r.outcome} {r.message}"
    expected_severity = "" if control else ("clarity" if r.outcome == "refused" else "correctness")
    assert severity(r.outcome, r.passed) == expected_severity, r
    if r.outcome == "corrupt":
        # Seed 002: the rows behind the 8-row out are the ones overwritten.
        assert "canary after out" in r.message, r.message
    if r.outcome == "wrong" and route == "ll4mi.batch_decode" and case.params["window_left"] < 0:
        # The value loop never ran: every output is the buffer's NaN poison, never zeros.
        assert r.n_wrong == r.n_total and r.max_abs_diff == float("inf"), r.message
    if r.outcome == "wrong" and family == "restaged_indptr":
        # Seed 002 measured 7503 of 8192 wrong: most of the batch reads the restaged pages.
        assert r.n_wrong > r.n_total // 3, r.message


@pytest.mark.parametrize("row", CRASHES, ids=[_id(r) for r in CRASHES])
def test_guard_off_crash_is_isolated(row, monkeypatch):
    (route, family), variant, guard = row
    case = _CASES[(route, family, variant)]
    died = replay_guard_off(case, guard, monkeypatch)
    assert died is not None and died[0] == "crash", f"{case.id}: {died}"


def test_all_guards_on_every_case_passes(target, monkeypatch):
    failures = failures_with_guards_on(_CASES.values(), target, monkeypatch)
    assert not failures, failures


def test_every_family_has_a_detection():
    detected = {fam for (_, fam), _, _, outs in DETECTIONS if outs != {"match"}}
    assert detected == set(FAMILIES)
