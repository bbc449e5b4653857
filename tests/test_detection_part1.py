"""Detection, part 1: each guard behind seed 002's strided, mis-planned and odd-GQA fixes,
turned off, makes the harness report the defect class the seed recorded before its fix;
with every guard on, the same cases pass.

  last_dim_contiguous       q, k, v or a cache with stride(-1) == 2      wrong, max|diff| >= 0.5
                            (single decode's q, which it must copy)
  out_contiguous            out, lse with stride(-1) == 2                corrupt (written packed:
                                                                          into the view's gaps)
                            partial_state with stride(-1) == 2           wrong, max|diff| >= 0.5
  state_contiguous          merge_state inputs with stride(-1) == 2      wrong, max|diff| >= 0.5
  run_matches_plan          run() heads / head dims / page size / rank /  silent
                            dtype / kv rows off the plan
                            fewer q (and out) rows than planned          corrupt (the planned rows
                                                                          land past out)
  half_planned_refuses      run() after a plan() that failed midway      silent
  plan_validates_first      run() after a plan() rejected in validation  unexpected_refusal (the
                                                                          run refuses: the previous
                                                                          plan is lost); wrong with
                                                                          half_planned_refuses and
                                                                          run_matches_plan off too
  gqa_divisible             12 q heads over 8                            silent (no defined
                                                                          answer; the message
                                                                          still gives the values
                                                                          against an even spread)
                            4 over 8, 0 kv heads                          crash (SIGFPE: a group
                                                                          size of 0)

A strided view has a defined answer (match_or_refuse): read as packed it is `wrong`, and
the detections also assert the values are far off, as seed 002's table reports. A
mis-planned run() or a group that does not divide has none (`refuse`): a run that goes
ahead is `silent`. Every detection is a correctness failure (severity asserted), except a
lost plan that run() refuses: a valid input refused is a capability failure.

Controls sit next to each guard: cases the guard does not protect (a head-sliced q,
index tensors, padded q rows, divisible odd head counts) still match with it off.
Cases that kill the process with their guard off run in a fresh one (child.replay).
"""
from __future__ import annotations

import math

import pytest

from cases import generate
from detection_helpers import failures_with_guards_on, replay_guard_off, run_guard_off
from harness.model.classify import severity
from harness.model.routes import BUNDLED_ROUTES
from harness.targets import load_target

# The mixed batch's vLLM-shaped call writes only into the caller's out: its
# library-allocated form is skipped, not a detection.
# Every route in the family's own call form; the other call forms (cases/_call_forms.py)
# on two routes, which is enough to show each form is reached and keeps `make test` short.
CRASH_ROUTES = ("fa2.single_prefill", "fa2.batch_decode")
_FORM_TAGS = ("-nolse", "-lib", "-lib-nolse")
_BUNDLED = load_target("bundled").capabilities
# Cases the bundled library can express (the metadata fields of block-table APIs are not
# its own); misplanned in bf16 only: its other dtypes are make check's, guards on.
_ALL = [c for c in generate(("strided", "misplanned", "gqa"), BUNDLED_ROUTES)
        if not (c.op == "mixed_batch" and c.params.get("out_form") == "library")
        and (not c.tag.endswith(_FORM_TAGS) or c.route in CRASH_ROUTES)
        and _BUNDLED.lacks(c.op, c.params, c.requires) is None
        and not (c.family == "misplanned" and c.params.get("dtype") != "bf16")]

INPUTS = {"q", "k", "v", "k_cache", "v_cache", "kv_cache"}
OUTPUTS = {"out", "lse", "partial_state_v", "partial_state_s"}
# Outputs the adapter hands over as strided views whose gaps are watched (Buffers.strided_output).
GAP_WATCHED = {"out", "lse"}
STATES = {"v_a", "s_b", "v", "s", "v_other"}
# Process-killing guard-off cases run on CRASH_ROUTES only: each costs a fresh process.


def _strided_rows():
    rows = []
    for c in _ALL:
        if c.family != "strided":
            continue
        tensor = c.params.get("strided")
        if c.op == "merge_state" and tensor in STATES:
            guard = "state_contiguous"
        elif tensor in INPUTS:
            guard = "last_dim_contiguous"
        elif tensor in OUTPUTS:
            guard = "out_contiguous"
        else:   # head-sliced q, index tensors: controls no layout guard protects
            rows.append((c, "last_dim_contiguous,out_contiguous", {"match"}))
            continue
        rows.append((c, guard, {"corrupt"} if tensor in GAP_WATCHED else {"wrong"}))
    return rows


# The derived bounds relations on plan()'s own index tensors (harness/model/relations.py):
# batch_consistent refuses them at plan(); guard-off the kernels index with them unchecked.
BOUNDS_FIELDS = ("query_start_loc", "last_page_len")


def _bounds_field(c) -> str | None:
    field = (c.params.get("mismatch") or {}).get("field")
    return field if field in BOUNDS_FIELDS else None


def _misplanned_rows():
    rows = []
    for c in _ALL:
        if c.family != "misplanned":
            continue
        if c.variant == "q_rows_fewer" and c.params.get("out_form") == "library":
            continue   # writes past the library's own out: a fresh process (ISOLATED)
        if _bounds_field(c):
            continue   # plan()'s index bounds: guard-off they write anywhere (BOUNDS_ISOLATED)
        if c.variant == "q_rows_fewer":
            # The planned rows past a short out land in its (widened) canary band.
            rows.append((c, "run_matches_plan", {"corrupt"}))
        elif c.variant == "plan_failed_midway":
            rows.append((c, "half_planned_refuses", {"silent", "skipped"}))
        elif c.variant == "plan_rejected_first":
            rows.append((c, "plan_validates_first", {"unexpected_refusal"}))
            # The next guard in line (run() refusing a half-written plan, or its shapes)
            # still catches the lost plan; with all three off the run computes wrongly.
            rows.append((c, "plan_validates_first,half_planned_refuses,run_matches_plan",
                         {"wrong"}))
        elif c.expect == "match":                      # padded q rows: a control
            rows.append((c, "run_matches_plan", {"match"}))
        else:
            rows.append((c, "run_matches_plan", {"silent", "corrupt"}))
    return rows


def _gqa_rows():
    rows = []
    for c in _ALL:
        if c.family != "gqa" or c.variant in ("q4_over_kv8", "kv0"):
            continue
        rows.append((c, "gqa_divisible", {"silent"} if c.expect == "refuse" else {"match"}))
    return rows


DETECTIONS = _strided_rows() + _misplanned_rows() + _gqa_rows()
# (case, guard, signal the worker dies of)
# The other call forms of these reach the same division: one variant on one route shows it.
CRASHES = [(c, "gqa_divisible", "SIGFPE") for c in _ALL
           if c.family == "gqa" and c.variant in ("q4_over_kv8", "kv0") and c.route in CRASH_ROUTES
           and (not c.tag.endswith(_FORM_TAGS)
                or (c.variant == "kv0" and c.route == "fa2.single_prefill"))]


# Guard off, these write the planned rows past an out the library allocated for fewer:
# heap corruption, so each runs in its own process (`harness repro`, isolated by default).
# What a corrupted heap does next depends on its layout, which differs run to run: the
# process dies (SIGSEGV, SIGABRT), carries on (silent), or spins in the next launch
# (hang: seen on the host in up to a third of runs of both cases). Each is a failing
# correctness row; a pass or any other outcome fails the test.
ISOLATED = [(c, "run_matches_plan", {"crash", "silent", "hang"}) for c in _ALL
            if c.variant == "q_rows_fewer" and c.params.get("out_form") == "library"
            and c.route in CRASH_ROUTES]


# Guard-off, a bound past its tensor reads or writes wherever it lands: the process dies,
# carries on silently, or spins (measured on the host: crash, silent). Each runs in a forked
# child. batch_decode's plan() takes no qo_indptr, so its query-offset cases are skipped rows
# and detect nothing here.
BOUNDS_ISOLATED = [(c, "batch_consistent,run_matches_plan", {"crash", "silent", "hang", "corrupt"})
                   for c in _ALL if c.family == "misplanned" and _bounds_field(c)
                   and not (c.op == "batch_decode" and _bounds_field(c) == "query_start_loc")]
ISOLATED += BOUNDS_ISOLATED


def _id(row) -> str:
    return f"{row[1]}-off/{row[0].id}"


@pytest.fixture(scope="module")
def target():
    return load_target("bundled")


@pytest.mark.parametrize("row", DETECTIONS, ids=[_id(r) for r in DETECTIONS])
def test_guard_off_is_detected(row, target, monkeypatch):
    case, guard, outcomes = row
    r = run_guard_off(case, target, guard, monkeypatch)
    assert r.outcome in outcomes, f"{case.id}: {r.outcome} {r.message}"
    if r.outcome == "skipped":
        return
    assert r.passed == (outcomes == {"match"}), f"{case.id}: {r.outcome} {r.message}"
    # A lost plan refused on run() is a capability failure (the input was valid);
    # everything else a guard catches is a correctness failure.
    expected = "" if r.passed else ("capability" if r.outcome == "unexpected_refusal"
                                    else "correctness")
    assert severity(r.outcome, r.passed) == expected, r
    if r.outcome == "corrupt" and case.family == "strided":
        assert f"gaps of strided {case.params['strided']}:" in r.message, r.message
    elif r.outcome == "corrupt":
        assert "canary after out" in r.message, r.message
    if case.family == "strided" and r.outcome == "wrong":
        # Seed 002: max |diff| 0.98-1.40 on real data; NaN poison in the skipped slots
        # makes it inf here. Either way far beyond any dtype's tolerance.
        assert r.max_abs_diff is not None and (math.isinf(r.max_abs_diff) or r.max_abs_diff >= 0.5), \
            f"{case.id}: {r.message}"


@pytest.mark.parametrize("row", CRASHES, ids=[_id(r) for r in CRASHES])
def test_guard_off_crash_is_isolated(row, monkeypatch):
    case, guard, sig = row
    died = replay_guard_off(case, guard, monkeypatch)
    assert died is not None and died[0] == "crash", f"{case.id}: {died}"
    if sig:
        assert sig in died[1], f"{case.id}: {died}"


def test_all_guards_on_every_case_passes(target, monkeypatch):
    cases = {row[0].id: row[0] for row in DETECTIONS + CRASHES}.values()
    failures = failures_with_guards_on(cases, target, monkeypatch)
    assert not failures, failures


@pytest.mark.parametrize("row", ISOLATED, ids=[_id(r) for r in ISOLATED])
def test_guard_off_heap_write_is_caught_in_its_own_process(row, monkeypatch):
    from harness.engine import forkserver
    from harness.engine.child import Spec
    case, guard, outcomes = row
    # The case runs in milliseconds: a 3 s case timeout ends a spinning run in 3 s instead
    # of the default 60 (and a run slowed past it by a loaded host is a `hang`, accepted
    # like the spin itself: no outcome that fails the test depends on the timeout). Its
    # process is a child forked from a warm fork server, the row the one a worker writes.
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS", raising=False)
    out = forkserver.run_spec(Spec(target="bundled", cases=[case], disable_guards=guard,
                                   case_timeout=3), budget_s=120)
    assert len(out.rows) == 1, (out.returncode, out.stderr[-2000:])
    found = out.rows[-1]
    assert found["outcome"] in outcomes and not found["pass"], found
    assert found["severity"] == "correctness", found
