"""flashinfer: the adapter for FlashInfer's public Python API.

One adapter serves the CUDA build (flashinfer-python) and the ROCm port,
which keeps the same API. Routes, each a separate backend:

  fi_fa2.single_prefill    single_prefill_with_kv_cache(backend="fa2")
  fi_fa3.single_prefill    the same, backend="fa3"                       (sm_90 only)
  fi_fa2.single_decode     single_decode_with_kv_cache(use_tensor_cores=False), q [Hq, D]
  fi_tc.single_decode      the same, use_tensor_cores=True (the prefill kernel)
  fi_fa2.paged_prefill     BatchPrefillWithPagedKVCacheWrapper(backend="fa2").plan/run
  fi_fa3.paged_prefill     the same, backend="fa3"                       (sm_90 only)
  fi_fa2.ragged_prefill    BatchPrefillWithRaggedKVCacheWrapper(backend="fa2").plan/run
  fi_fa3.ragged_prefill    the same, backend="fa3"                       (sm_90 only)
  fi_fa2.batch_decode      BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=False, backend="fa2")
  fi_tc.batch_decode       the same, use_tensor_cores=True
  fi.merge_state           each request's KV split in two, both halves through
                           single_prefill(return_lse=True), then merge_state or
                           merge_state_in_place

The batch routes and the multi-call scenarios are the neutral core's
(harness/targets/plan_run/); params are harness/model/params.py's. What FlashInfer
has no analogue for is a capability it lacks (the case is skipped naming
it): fp32 inputs, run(partial_state=), a caller-set KV split (max_kv_chunk:
its plan() picks its own split schedule, so it is not passed and the case
still checks the answer).

LSE: FlashInfer returns log2-based LSE (its kernels use exp2); rows report
the natural log, so every LSE it returns is multiplied by ln 2. merge_state
consumes and produces the same base-2 states, so its inputs are passed as
FlashInfer returned them and only its output is converted.

FlashInfer's single-request functions allocate their own outputs (no out=
or lse=): a case naming a strided "out" or "lse" there is skipped.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from harness.targets.plan_run import dispatch
from harness.targets.base import Skip, Target, device_platform
from harness.targets.layout import to_layout
from harness.targets.plan_run.call import Call
from harness.targets.descriptors import flashinfer as descriptor
from harness.targets.plan_run.merge import check_splits, cut, merged

LN2 = math.log(2.0)
WORKSPACE_BYTES = 128 << 20     # FlashInfer's recommended float workspace

ROUTES_FA2, ROUTES_FA3 = descriptor.ROUTES_FA2, descriptor.ROUTES_FA3

INSTALL_HINT = ("the flashinfer target needs FlashInfer's Python package and a GPU it runs on: "
                "`pip install flashinfer-python` on a machine with a CUDA GPU (or the ROCm port "
                "on an AMD GPU); its attention kernels compile on first use with nvcc "
                "(set CUDA_HOME)")


class FiCall(Call):
    """The neutral core's per-case plumbing (and its batch routes), with FlashInfer's
    module, backends, workspace and LSE base."""

    def __init__(self, case, problem, buffers, fi, features=frozenset()):
        super().__init__(case, problem, buffers, features)
        self.fi = fi

    def workspace(self) -> torch.Tensor:
        n = int(self.params.get("workspace_bytes", WORKSPACE_BYTES))
        return torch.zeros(n, dtype=torch.uint8, device=self.device)

    def result(self, out, lse, rows: int | None = None) -> dict:
        res = super().result(out, lse, rows)
        if "lse" in res:
            res["lse"] = natural_lse(res["lse"])
        return res

    @property
    def lib(self):
        return self.fi

    def prefill_backend(self) -> dict:
        return {"backend": _backend(self)}

    def decode_backend(self) -> tuple[str, bool]:
        return "fa2", self.case.backend == "fi_tc"

    def plan_extra(self) -> dict:
        # max_kv_chunk is the bundled planner's; FlashInfer's plan() picks its own splits and
        # owes the same answer, so a split case is this case here, with FlashInfer's split.
        self.params.get("max_kv_chunk")
        return {}

    def partial_state(self, rows: int):
        if self.params.get("partial_state"):
            raise Skip("FlashInfer's paged run() takes no partial_state to merge into")
        return None

    def route_features(self, op: str) -> tuple[frozenset, frozenset]:
        return ROUTE_FEATURES.get(op, frozenset()), frozenset()


# What FlashInfer's documented API carries, per op. Its ALiBi slopes are its own fixed
# geometric series (pos_encoding_mode="ALIBI"), not a caller's, and its fa2 decode and
# prefill wrappers take no sinks: neither is mapped. q_len_per_req of its decode wrapper
# is read by the trtllm-gen backend alone, so a verify step goes through the paged prefill
# wrapper, causal, n rows a request: FlashInfer's own form of multi-token decode.
ROUTE_FEATURES = {
    "single_prefill": frozenset({"softcap", "custom_mask"}),
    "single_decode": frozenset({"softcap"}),
    "paged_prefill": frozenset({"softcap", "fp8_kv", "custom_mask"}),
    "ragged_prefill": frozenset({"softcap"}),
    "batch_decode": frozenset({"softcap", "fp8_kv", "multi_token_decode"}),
}


def natural_lse(lse2: torch.Tensor) -> torch.Tensor:
    """FlashInfer's log2-sum-exp2 as the natural log the reference uses."""
    return lse2.float() * LN2


def _backend(c: Call) -> str:
    return {"fi_fa2": "fa2", "fi_fa3": "fa3", "fi_tc": "fa2", "fi": "fa2"}[c.case.backend]


# ------------------------------------------------------------------ single routes

def single_prefill(c: FiCall) -> dict:
    p = c.problem
    if p.batch_size != 1:
        raise Skip("single prefill takes one request")
    q = c.views.input("q", p.q[0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    feats = c.soft_cap_kw()
    mask = c.custom_mask_arg(flat=False)
    if mask is not None:
        feats["custom_mask"] = mask
    c.ready("run")
    res = c.fi.single_prefill_with_kv_cache(
        q, k, v, causal=p.causal, kv_layout=c.layout, window_left=p.window_left,
        sm_scale=c.sm_scale, backend=_backend(c), return_lse=p.return_lse, **feats)
    out, lse = res if p.return_lse else (res, None)
    return c.result(out, lse)


def single_decode(c: FiCall) -> dict:
    p = c.problem
    if p.batch_size != 1 or p.qo_lens[0] != 1:
        raise Skip("single decode takes one request with one query token")
    if p.head_dim_vo != p.head_dim:
        raise Skip("single_decode_with_kv_cache takes one head_dim for q, k and v")
    q = c.views.input("q", p.q[0][0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    feats = c.soft_cap_kw()
    c.ready("run")
    res = c.fi.single_decode_with_kv_cache(
        q, k, v, kv_layout=c.layout, window_left=p.window_left, sm_scale=c.sm_scale,
        use_tensor_cores=c.case.backend == "fi_tc", return_lse=p.return_lse, **feats)
    out, lse = res if p.return_lse else (res, None)
    return c.result(out.unsqueeze(0), None if lse is None else lse.unsqueeze(0))


# ------------------------------------------------------------------ merge

def merge_state(c: FiCall) -> dict:
    """Two partial states per request (KV halves, through FlashInfer), merged back."""
    p = c.problem
    check_splits(p, c.params)
    halves = []
    c.buffers.stage("partial")
    for half in (0, 1):
        o_half, s_half = [], []
        for q, k, v, lk in zip(p.q, p.k, p.v, p.kv_lens):
            at = cut(c.params, lk)
            sl = slice(0, at) if half == 0 else slice(at, lk)
            o, s = c.fi.single_prefill_with_kv_cache(
                q.contiguous(), k[sl].contiguous(), v[sl].contiguous(), causal=False,
                kv_layout="NHD", window_left=-1, sm_scale=c.sm_scale, backend="fa2",
                return_lse=True)
            o_half.append(o)
            s_half.append(s)
        halves.append((c.buffers.place(torch.cat(o_half), f"o_{'ab'[half]}"),
                       c.buffers.place(torch.cat(s_half).float(), f"lse_{'ab'[half]}")))
    return merged(c, halves)


def batch_decode(c: FiCall) -> dict:
    """One row a request through the decode wrapper; a multi-token decode (q_len_per_req n)
    through the paged prefill wrapper: qo_indptr steps by n, causal, bottom-right aligned."""
    from harness.targets.plan_run.routes import plan_and_run, prepare_paged_prefill, run_batch
    if int(c.params.get("q_len_per_req", 1)) > 1:
        return plan_and_run(c, prepare_paged_prefill(c))
    return run_batch(c)


# FlashInfer's own calls where they differ from the core's (no out=, base-2 LSE halves).
OWN_ROUTES = {
    "single_prefill": single_prefill,
    "single_decode": single_decode,
    "batch_decode": batch_decode,
    "merge_state": merge_state,
}
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill", "batch_decode",
       "merge_state")


# ------------------------------------------------------------------ the target

class FlashInferTarget(Target):
    name = "flashinfer"
    # FlashInfer's checks say where they fired before why (`Error in function 'F' at
    # /path/prefill.cuh:3258: ...`, `Check failed: (cond) is false: ...`): the reason follows.
    message_prefix = (r"(?:RuntimeError: )?(?:Error in function '[^']*' at \S+?:\d+: "
                      r"|Check failed: \(.*?\) is false: )")
    # plan()/run() wrappers with CUDA-graph caller buffers, fp16/bf16 only; its planner
    # picks its own KV split and its paged run() merges no partial state.
    capabilities = descriptor.CAPABILITIES
    signature = descriptor.SIGNATURE

    def __init__(self, fi, device: torch.device, routes: tuple[str, ...]):
        self.fi = fi
        self.device = torch.device(device)
        self.routes = tuple(routes)

    def version(self) -> str:
        return str(getattr(self.fi, "__version__", "?"))

    def commit(self) -> str:
        return str(getattr(self.fi, "__git_commit__", "") or "")

    def platform(self) -> str:
        return device_platform(self.device)

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        if case.route not in self.routes:
            raise Skip(f"flashinfer has no route {case.route!r} here (routes: "
                       f"{', '.join(self.routes)})")
        return dispatch.run(FiCall(case, problem, buffers, self.fi, self.capabilities.features),
                            OWN_ROUTES)


def routes_for_device(device: torch.device) -> tuple[str, ...]:
    """fa2 routes everywhere; fa3 where the GPU is Hopper (sm_90) and CUDA, not ROCm."""
    routes = ROUTES_FA2
    if device.type == "cuda" and not getattr(torch.version, "hip", None):
        if torch.cuda.get_device_capability(device)[0] == 9:
            routes = routes + ROUTES_FA3
    return routes


def make_target(module: Any = None, device: torch.device | str | None = None) -> FlashInferTarget:
    """The flashinfer target over the installed package (or `module`, a stand-in with its API)."""
    if module is None:
        if not torch.cuda.is_available():
            raise RuntimeError(f"flashinfer target: no GPU visible to torch; {INSTALL_HINT}")
        try:
            import flashinfer as module
        except ImportError as error:
            raise RuntimeError(f"flashinfer target: cannot import flashinfer ({error}); "
                               f"{INSTALL_HINT}") from error
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    return FlashInferTarget(module, device, routes_for_device(device))
