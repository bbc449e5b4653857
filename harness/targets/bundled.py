"""bundled: the adapter for the HIP attention library in kernels/.

Maps each route onto the library's FlashInfer-shaped API:

  fa2.single_prefill    single_prefill_with_kv_cache
  fa2.single_decode     single_decode_with_kv_cache (q [Hq, D])
  fa2.paged_prefill     BatchPrefillWithPagedKVCacheWrapper.plan/run
  fa2.ragged_prefill    BatchPrefillWithRaggedKVCacheWrapper.plan/run
  fa2.batch_decode      BatchDecodeWithPagedKVCacheWrapper, use_tensor_cores=False
  fa2_tc.batch_decode   the same, use_tensor_cores=True
  aiter.batch_decode    the same, backend="aiter" (return_lse runs its fa2 shadow plan)
  ll4mi.batch_decode    the same, backend="ll4mi" (its route selector decides the kernel)
  fa2.merge_state       each request's KV split in two, both halves run through
                        single_prefill(return_lse=True), then merge_state or
                        merge_state_in_place; compared with the whole problem's reference
  fa2.mixed_batch       decode_first_attention over a vLLM-shaped block-table cache

The routes themselves are the neutral FlashInfer-shaped core's
(harness/targets/plan_run/); this module says only what the bundled library
differs in: its module and its decode backends. Params (layout, page_size,
cache_form, strided, mismatch, scenario, ...) are declared once, with their
meaning, in harness/model/params.py.
"""
from __future__ import annotations

from typing import Mapping

import torch

from harness.model.routes import BUNDLED_ROUTES
from harness.targets.plan_run import dispatch
from harness.targets.base import Skip, Target
from harness.targets.plan_run.call import Call
from harness.targets.descriptors import bundled as descriptor


def _kernels():
    import kernels  # deferred: importing the adapter must not build the library
    return kernels


class BundledCall(Call):
    """The bundled library's module and its decode backends."""

    @property
    def lib(self):
        return _kernels()

    def decode_backend(self) -> tuple[str, bool]:
        return DECODE_BACKENDS[self.case.backend]

    def route_features(self, op: str) -> tuple[frozenset, frozenset]:
        return ROUTE_FEATURES.get(op, frozenset()), ROUTE_REFUSES.get(op, frozenset())


# kernels/README.md "Features": what each op's calls carry. fp8 KV caches reach single
# prefill/decode and ragged prefill as tensors the library refuses (its fp8_kv_route guard).
_EVERY = frozenset({"softcap", "sinks", "alibi"})
ROUTE_FEATURES = {
    "single_prefill": _EVERY | {"custom_mask"},
    "single_decode": _EVERY,
    "paged_prefill": _EVERY | {"fp8_kv", "custom_mask"},
    "ragged_prefill": _EVERY,
    "batch_decode": _EVERY | {"fp8_kv", "multi_token_decode"},
}
ROUTE_REFUSES = {op: frozenset({"fp8_kv"})
                 for op in ("single_prefill", "single_decode", "ragged_prefill")}


DECODE_BACKENDS = {"fa2": ("fa2", False), "fa2_tc": ("fa2", True),
                   "aiter": ("aiter", False), "ll4mi": ("ll4mi", False)}


class BundledTarget(Target):
    name = "bundled"
    owns_contract = descriptor.OWNS_CONTRACT
    routes = BUNDLED_ROUTES
    capabilities = descriptor.CAPABILITIES
    signature = descriptor.SIGNATURE

    options = descriptor.OPTIONS

    def check_option(self, name: str, value: str) -> None:
        descriptor.check_option(name, value)

    def version(self) -> str:
        return descriptor.version()

    def build_id(self) -> str:
        # The content hash of the sources, platform, arch and flags: what actually ran.
        return _kernels().build_info()["build_hash"][:16]

    def commit(self) -> str:
        return descriptor.commit()

    def platform(self) -> str:
        return _kernels().build_info()["platform"]

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        if case.route not in self.routes:
            raise Skip(f"the bundled library has no route {case.route!r}")
        return dispatch.run(BundledCall(case, problem, buffers, self.capabilities.features))

    def standalone_source(self, case) -> str | None:
        """`def call(inputs) -> dict` for the standalone script (Target.standalone_source)."""
        why = standalone_unsupported(case)
        if why:
            raise Skip(why)
        return standalone_call_source(case)


def make_target() -> BundledTarget:
    return BundledTarget()


# ------------------------------------------------------------------ standalone scripts
#
# `harness repro CASE --standalone` writes a script that needs only torch and this library.
# Its call() is this adapter's own code: the FlashInfer-shaped core every route, feature,
# mis-planned run, multi-call scenario, merge and mixed batch goes through
# (harness/targets/plan_run/), the layouts and the canary-banded, fingerprinted Buffers it
# hands them (harness/targets/layout.py, harness/model/builders.py), and BundledCall above,
# pasted by harness/targets/standalone_paste.py paste_source, so the script cannot drift from what
# the harness ran. What the harness itself provides around them (the Case, the Problem's
# fields) is rebuilt from literals and the inputs' exact bits.

# Names two pasted modules both define: the script's name for one of them (the name its
# importer already uses for it, where it has one).
_STANDALONE_RENAMES = {
    ("harness.targets.plan_run.replan", "restaged"): "run_restaged",
    ("harness.targets.plan_run.replan_scenarios", "SCENARIOS"): "REPLAN_SCENARIOS",
}


def standalone_unsupported(case) -> str | None:
    """Why this adapter cannot write `case` as a standalone script, or None when it can."""
    if case.route not in BundledTarget.routes:
        return f"the bundled library has no route {case.route!r}"
    return None


def _standalone_parts() -> list:
    """What the script's call() runs, in dependency order (each module's source goes in)."""
    import sys
    from harness.model import builders, problem
    from harness.targets import base, case_calls, layout
    from harness.targets.plan_run import (call, dispatch, merge, mismatch, mixed, replan,
                                          replan_scenarios, routes, scenarios)
    here = sys.modules[__name__]
    return [(base, ["Skip"]), builders, (problem, ["DTYPES", "FP8_DTYPES", "Problem", "_cat"]),
            layout, case_calls, mismatch, call, merge, mixed, routes, scenarios, replan,
            replan_scenarios, dispatch,
            (here, ["_kernels", "BundledCall", "_EVERY", "ROUTE_FEATURES", "ROUTE_REFUSES",
                    "DECODE_BACKENDS"])]


def _problem_fields(problem) -> dict:
    """The Problem's fields as literals: tensors by their exact bits (encode_tensor), dtypes
    by name; q, k, v and the custom masks come from the script's INPUTS, the device is its."""
    import dataclasses
    from harness.targets.standalone_paste import encode_tensor
    out = {}
    for f in dataclasses.fields(problem):
        value = getattr(problem, f.name)
        if f.name in ("q", "k", "v", "custom_mask", "host_qkv", "device"):
            continue
        if isinstance(value, torch.dtype):
            out[f.name] = {"dtype": str(value).rpartition(".")[2]}
        elif isinstance(value, torch.Tensor):
            out[f.name] = {"tensor": encode_tensor(value)}
        else:
            out[f.name] = {"value": value}
    return out


def standalone_call_source(case) -> str:
    """`def call(inputs) -> dict` for this case: dispatch.run on a BundledCall, as
    BundledTarget.run makes it, with the script's stand-ins for the Case and Problem."""
    import json
    import pprint
    from harness.model.problem import build_problem
    from harness.model import reference
    from harness.targets.standalone_paste import paste_source
    p = build_problem(case.params, case.seed, "cpu")
    cfg = {"case": {"id": case.id, "route": case.route, "family": case.family,
                    "variant": case.variant, "expect": case.expect, "seed": case.seed,
                    "refuse_words": list(case.refuse_words),
                    "params": json.loads(json.dumps(case.to_json()["params"]))},
           "features": sorted(BundledTarget.capabilities.features)}
    # The reference's functions are the script's own (standalone.py pastes them after this).
    provided = {("harness.model.reference", n): n for n in dir(reference)}
    imports, code = paste_source(_standalone_parts(), _STANDALONE_RENAMES, provided=provided)
    fields = pprint.pformat(_problem_fields(p), width=96, compact=True)
    return (imports + f"\n\nimport kernels\n\nCFG = {pprint.pformat(cfg, width=96, compact=True)}"
            f"\n# The harness's Problem for this case, less q, k, v and the masks (INPUTS).\n"
            f"PROBLEM_FIELDS = {fields}\n\n\n"
            "# ---- the adapter's code (harness/targets/bundled.py and the core it runs on), "
            "verbatim ----\n\n" + code + "\n\n\n" + _STANDALONE_CALL)


_STANDALONE_CALL = '''
# ---- the harness's side of the call: the case, the problem, the buffers ----

class ScriptCase:
    """The fields of the harness's Case that the adapter reads."""

    def __init__(self, spec):
        for key, value in spec.items():
            setattr(self, key, value)
        self.refuse_words = tuple(self.refuse_words)

    @property
    def op(self):
        return self.route.split(".", 1)[1]

    @property
    def backend(self):
        return self.route.split(".", 1)[0]


def script_problem(inputs, device):
    """The harness's Problem (pasted above) from PROBLEM_FIELDS and the inputs' exact bits."""
    fields = {}
    for key, spec in PROBLEM_FIELDS.items():
        if "dtype" in spec:
            fields[key] = getattr(torch, spec["dtype"])
        elif "tensor" in spec:
            fields[key] = decode(spec["tensor"])
        else:
            fields[key] = spec["value"]
    masks = INPUTS.get("custom_mask")
    return Problem(q=inputs["q"], k=inputs["k"], v=inputs["v"], device=torch.device(device),
                   custom_mask=[decode(m) for m in masks] if masks else None, **fields)


_BUFFERS = []


def corruption():
    """What the harness's Buffers.check (pasted above) finds after the calls: a canary band
    around an output overwritten, or an input the library was handed changed."""
    return _BUFFERS[-1].check() if _BUFFERS else []


def call(inputs):
    """The library's calls for this case: BundledTarget.run's dispatch.run(BundledCall(...))."""
    problem = script_problem(inputs, DEVICE)
    buffers = Buffers(torch.device(DEVICE))
    _BUFFERS.append(buffers)
    buffers.stage("build inputs")
    return run(BundledCall(ScriptCase(CFG["case"]), problem, buffers, frozenset(CFG["features"])))
'''
