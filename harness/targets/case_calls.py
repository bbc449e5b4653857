"""One case's calls on any library: the problem, its buffers, the views the case asks for.

Every adapter's per-case object starts here (plan_run.call.Call for the
FlashInfer-shaped core, flaggems' FgCall), so the case's layout, mismatch and
adversarial views are read the same way everywhere.
"""
from __future__ import annotations

from typing import Any, Mapping

from harness.targets.layout import Views


class CaseCalls:
    def __init__(self, case, problem, buffers):
        self.case, self.problem, self.buffers = case, problem, buffers
        self.params: Mapping[str, Any] = case.params
        self.views = Views(case.params, buffers)
        self.device = problem.device
        self.layout = self.params.get("layout", "NHD")
        self.mismatch = self.params.get("mismatch")

    @property
    def sm_scale(self):
        # None exercises the library's own default; the reference uses 1/sqrt(head_dim).
        scale = self.params.get("sm_scale")
        return None if scale is None else float(scale)
