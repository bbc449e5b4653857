"""One case's calls on any library: the problem, its buffers, the views the case asks for.

Every adapter's per-case object starts here (plan_run.call.Call for the
FlashInfer-shaped core, flaggems' FgCall), so the case's layout, mismatch and
adversarial views are read the same way everywhere.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from harness.model.builders import CANARY_ELEMS
from harness.targets.layout import Views


def first_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """The first `rows` rows; rows a short run never produced read NaN."""
    if t.shape[0] >= rows:
        return t[:rows]
    pad = torch.full((rows - t.shape[0], *t.shape[1:]), float("nan"), dtype=t.dtype,
                     device=t.device)
    return torch.cat([t, pad])


class CaseCalls:
    def __init__(self, case, problem, buffers):
        self.case, self.problem, self.buffers = case, problem, buffers
        self.params: Mapping[str, Any] = case.params
        self.views = Views(case.params, buffers)
        self.device = problem.device
        self.layout = self.params.get("layout", "NHD")
        self.mismatch = self.params.get("mismatch")

    def per_head_vector(self, key: str, values: torch.Tensor | None):
        """A per-q-head feature tensor (sinks, ALiBi slopes) as the case hands it: fp32
        [num_qo_heads], or, when params["malformed"] names it, of that length (the first
        heads' values, then the last repeated: a kv-head-long vector of a GQA problem is
        its first num_kv_heads values). None when the case does not use it."""
        if self.params.get(key) in (None, False) or values is None:
            return None
        bad = self.params.get("malformed") or {}
        if bad.get("field") == key:
            n = int(bad["length"])
            values = torch.cat([values, values[-1:].repeat(max(0, n - values.numel()))])[:n]
        return self.views.input(key, values.to(torch.float32).contiguous().to(self.device))

    def out_like_q(self, q_rows: int, rows: int) -> torch.Tensor:
        """The caller's out as a vLLM-shaped caller allocates it (torch.empty_like(query)):
        q's rows, padded past the offsets' `rows` (CUDA-graph padding) or short of them,
        canary-banded, strided where the case says; a short q's missing rows lie in the band,
        so a run that writes them anyway is `corrupt`. Compare first_rows(out, rows)."""
        p = self.problem
        return self.views.output("out", (q_rows, p.num_qo_heads, p.head_dim_vo), p.dtype,
                                 CANARY_ELEMS + max(0, rows - q_rows) * p.num_qo_heads
                                 * p.head_dim_vo)

    @property
    def sm_scale(self):
        # None exercises the library's own default; the reference uses 1/sqrt(head_dim).
        scale = self.params.get("sm_scale")
        return None if scale is None else float(scale)
