"""Named multi-call scripts: plan() twice, then run() (the misplanned family's scenarios).

Each scenario prepares a batch route's calls for the problem exactly as the
plain route would (same tensors, same plan arguments), plans it, makes one
second plan() that must fail, and runs the first plan's tensors. What the
run must do is the case's `expect`:

  plan_failed_midway   the second plan asks for max_kv_chunk=params["replan_max_kv_chunk"],
                       whose split schedule does not fit the (small) workspace: plan()
                       fails after it began updating the wrapper, so run() must refuse.
  plan_rejected_first  the second plan names num_kv_heads=3 (no GQA group for the
                       problem's q heads): plan() rejects it during validation, so
                       the first plan is untouched and run() must match the problem.

A second plan that does not fail (a guard turned off) is not an adapter error:
the run goes ahead and the harness judges what it computes.
"""
from __future__ import annotations

from harness.targets.base import Skip


def _second_plan(c, prep, override: dict) -> None:
    c.buffers.stage("plan")
    try:
        prep.plan(**override)
    except Exception:  # noqa: BLE001 - any refusal: the scenario is about what it leaves behind
        pass


def plan_failed_midway(c, prep) -> None:
    if c.case.backend == "aiter":
        raise Skip("aiter decode plans never split, so no schedule can outgrow the workspace")
    _second_plan(c, prep, {"max_kv_chunk": int(c.params["replan_max_kv_chunk"])})


def plan_rejected_first(c, prep) -> None:
    _second_plan(c, prep, {"num_kv_heads": 3})


SCENARIOS = {
    "plan_failed_midway": plan_failed_midway,
    "plan_rejected_first": plan_rejected_first,
}


def run_scenario(c) -> dict:
    from harness.targets.plan_run.replan_scenarios import SCENARIOS as REPLAN_SCENARIOS
    from harness.targets.plan_run.routes import PREPARE
    name = c.params["scenario"]
    if name in REPLAN_SCENARIOS:   # graph_replan and restaged_indptr script their own calls
        return REPLAN_SCENARIOS[name](c)
    if name not in SCENARIOS:
        raise Skip(f"unknown scenario {name!r}; known: {sorted(SCENARIOS)}")
    if c.case.op not in PREPARE:
        raise Skip(f"scenario {name!r} needs a plan()/run() route, not {c.case.op}")
    prep = PREPARE[c.case.op](c)
    c.ready("plan")
    prep.plan()
    SCENARIOS[name](c, prep)
    c.buffers.stage("run")
    return prep.result(c, prep.run())
