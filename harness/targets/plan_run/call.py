"""One case's calls on a FlashInfer-shaped library: the problem, its buffers, its views.

Call holds what every route needs (the problem laid out as the case asks,
canary-guarded outputs, the case's adversarial views) and names, as methods,
what a library differs in: its module, its backends, its plan() extras, its
LSE base. A target subclasses it (harness/targets/bundled.py, flashinfer.py).
"""
from __future__ import annotations

import torch

from harness.model.builders import CANARY_ELEMS
from harness.targets.base import Skip
from harness.targets.case_calls import CaseCalls, first_rows
from harness.targets.plan_run.mismatch import short_rows

WORKSPACE_BYTES = 32 << 20
# The feature a params["malformed"] field belongs to.
_MALFORMED_FEATURE = {"sinks": "sinks", "alibi_slopes": "alibi", "k_scale": "fp8_kv",
                      "v_scale": "fp8_kv", "custom_mask": "custom_mask"}


class Call(CaseCalls):
    """One case's calls on a FlashInfer-shaped library."""

    @property
    def caller_outputs(self) -> bool:
        """Whether the caller hands out= and lse= (params["out_form"] "given", the default)
        or lets the library allocate and return them ("library")."""
        return self.params.get("out_form", "given") == "given"

    def out(self, rows: int, name: str = "out"):
        if not self.caller_outputs:
            return None
        p = self.problem
        per_row = p.num_qo_heads * p.head_dim_vo
        return self.views.output(name, (rows, p.num_qo_heads, p.head_dim_vo), p.dtype,
                                 CANARY_ELEMS + short_rows(self) * per_row)

    def lse(self, rows: int, name: str = "lse"):
        if not self.problem.return_lse or not self.caller_outputs:
            return None
        return self.views.output(name, (rows, self.problem.num_qo_heads), torch.float32,
                                 CANARY_ELEMS + short_rows(self) * self.problem.num_qo_heads)

    def outputs(self, returned, out, lse):
        """What the caller reads: the buffers it handed over, else what the call returned."""
        if out is not None:
            return out, lse
        if self.problem.return_lse:
            got_out, got_lse = returned
            return got_out, (lse if lse is not None else got_lse)
        return returned, None

    def workspace(self) -> torch.Tensor:
        n = int(self.params.get("workspace_bytes", WORKSPACE_BYTES))
        return torch.empty(n, dtype=torch.uint8, device=self.device)

    # What a target's library differs in: each target's Call subclass says.
    def __init__(self, case, problem, buffers, features=frozenset()):
        super().__init__(case, problem, buffers)
        self.features = features     # the target's declared features (harness/model/capabilities.py)

    @property
    def graphs(self):
        """The graph API the graph_replan script captures and replays with, or None where the
        device has none (the host: the graph mode's fixed buffers, called directly)."""
        if self.device.type != "cuda":
            return None
        from harness.targets.plan_run.replan import CudaGraphs
        return CudaGraphs(self.device)

    @property
    def has_partial_state(self) -> bool:
        """Whether paged run() takes partial_state=(v, s) to merge into: the target says."""
        return "partial_state" in self.features

    @property
    def lib(self):
        """The module whose functions and wrappers the routes call."""
        raise NotImplementedError

    def prefill_backend(self) -> dict:
        """Extra constructor keywords of the prefill wrappers."""
        return {}

    def decode_backend(self) -> tuple[str, bool]:
        """The batch-decode wrapper's (backend, use_tensor_cores)."""
        raise NotImplementedError

    def plan_extra(self) -> dict:
        """Extra plan() keywords of the batch wrappers (the split control, where it has one)."""
        return {"max_kv_chunk": self.params.get("max_kv_chunk")}

    # ---- features (harness/model/capabilities.py FEATURES; kernels/README.md "Features")

    def route_features(self, op: str) -> tuple[frozenset, frozenset]:
        """(the features `op`'s calls carry, the features the library has an argument for on
        `op` but refuses): the target's library says. None by default."""
        return frozenset(), frozenset()

    def check_features(self) -> None:
        """Skip, naming why, a case using a feature its route cannot carry. A feature the
        library takes an argument for there but refuses is passed when the case expects a
        refusal (the library's guard is then what is tested); any other case has no call."""
        used = self.problem.features()
        takes, refuses = self.route_features(self.case.op)
        for name in sorted(used - takes):
            if name in refuses and self.case.expect == "refuse":
                continue
            why = "refuses" if name in refuses else "has no argument for"
            raise Skip(f"the library {why} {name} on {self.case.op}")
        bad = self.params.get("malformed")
        if bad and _MALFORMED_FEATURE.get(bad.get("field")) not in takes:
            raise Skip(f"malformed {bad.get('field')!r}: {self.case.op} takes no such argument")

    def _malformed(self, field: str):
        bad = self.params.get("malformed") or {}
        return bad if bad.get("field") == field else None

    def _per_head(self, key: str, values: torch.Tensor | None):
        if self.params.get(key) in (None, False) or values is None:
            return None
        bad = self._malformed(key)
        if bad is not None:
            # n entries: the first heads' values, then the last one repeated (a kv-head-long
            # vector of a GQA problem is its first num_kv_heads slopes).
            n = int(bad["length"])
            values = torch.cat([values, values[-1:].repeat(max(0, n - values.numel()))])[:n]
        return self.views.input(key, values.to(torch.float32).contiguous().to(self.device))

    def _scale(self, key: str):
        if key not in self.params:
            return None
        value = getattr(self.problem, key)
        bad = self._malformed(key)
        if bad is not None:
            return torch.full(tuple(bad["shape"]), value, dtype=torch.float32, device=self.device)
        return value

    def custom_mask_arg(self, flat: bool):
        """The problem's masks as the library takes them: one [qo_len, kv_len] (single
        prefill) or every request's, flat, row-major (a paged plan)."""
        if not self.params.get("custom_mask"):
            return None
        mask = self.problem.custom_mask_flat() if flat else self.problem.custom_mask[0]
        bad = self._malformed("custom_mask")
        if bad is not None:
            delta = int(bad["delta"])
            mask = mask.reshape(-1)
            mask = torch.cat([mask, mask[:delta]]) if delta >= 0 else mask[:delta]
            if not flat:
                mask = mask.unsqueeze(0)      # a [1, n] mask: the wrong shape for one request
        return self.views.input("custom_mask", mask.contiguous().to(self.device))

    def soft_cap_kw(self) -> dict:
        cap = self.params.get("logits_soft_cap")
        return {"logits_soft_cap": self.problem.logits_soft_cap} if cap else {}

    def run_features_kw(self) -> dict:
        """The run()-side features given: sinks, alibi_slopes, k_scale, v_scale."""
        kw = {"sinks": self._per_head("sinks", self.problem.sinks),
              "alibi_slopes": self._per_head("alibi_slopes", self.problem.alibi_slopes),
              "k_scale": self._scale("k_scale"), "v_scale": self._scale("v_scale")}
        return {k: v for k, v in kw.items() if v is not None}

    def call_features_kw(self, mask: bool) -> dict:
        """A single-request call's features: soft cap, sinks, ALiBi and (prefill) the mask."""
        kw = {**self.soft_cap_kw(), **self.run_features_kw()}
        kw.pop("k_scale", None)
        kw.pop("v_scale", None)
        given = self.custom_mask_arg(flat=False) if mask else None
        if given is not None:
            kw["custom_mask"] = given
        return kw

    def kv_data_type(self):
        """The cache dtype plan() is told: the problem's stored format."""
        self.params.get("kv_dtype")
        return self.problem.kv_dtype

    def construct(self, factory, *args, **kwargs):
        """A library object built in the "construct" stage, so that what it raises is the
        library's (a refusal); anything raised while the inputs are built is the harness's."""
        self.buffers.stage("construct")
        made = factory(*args, **kwargs)
        self.buffers.stage("build inputs")
        return made

    def decode_wrapper(self, **buffers):
        """The batch-decode wrapper this case's route names."""
        backend, tensor_cores = self.decode_backend()
        return self.construct(
            self.lib.BatchDecodeWithPagedKVCacheWrapper, self.workspace(), kv_layout=self.layout,
            use_cuda_graph=bool(self.params.get("use_cuda_graph")),
            use_tensor_cores=tensor_cores, backend=backend, **buffers)

    def partial_state(self, rows: int):
        """An empty attention state (v = 0, s = -inf) for run(partial_state=): merging it is
        a no-op. None where the case asks for none."""
        if not self.params.get("partial_state"):
            return None
        p = self.problem
        v = torch.zeros(rows, p.num_qo_heads, p.head_dim_vo, dtype=p.dtype, device=self.device)
        s = torch.full((rows, p.num_qo_heads), float("-inf"), dtype=torch.float32,
                       device=self.device)
        return self.views.input("partial_state_v", v), self.views.input("partial_state_s", s)

    def ready(self, stage: str) -> None:
        """Everything the case names must be in place before the library sees it."""
        self.views.check_used()
        self.buffers.stage(stage)

    def result(self, out, lse, rows: int | None = None) -> dict:
        """The first `rows` rows; rows a short run never produced read NaN."""
        rows = out.shape[0] if rows is None else rows
        res = {"o": first_rows(out, rows)}
        if self.problem.return_lse:
            res["lse"] = first_rows(lse, rows)
        return res


