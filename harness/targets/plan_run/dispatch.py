"""One case on the FlashInfer-shaped core: its scenario's script, or its op's route."""
from __future__ import annotations

from harness.targets.plan_run.routes import OPS
from harness.targets.plan_run.scenarios import run_scenario


def run(c, own_routes: dict | None = None) -> dict:
    """The case's calls: its scenario's script, or its op's route (a target's own
    function for an op, from own_routes, where its library's call differs)."""
    c.check_features()
    if c.params.get("scenario"):
        return run_scenario(c)
    return {**OPS, **(own_routes or {})}[c.case.op](c)
