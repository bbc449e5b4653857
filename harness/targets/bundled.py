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
meaning, in harness/params.py.
"""
from __future__ import annotations

from typing import Mapping

import torch

from harness.capabilities import FEATURES, Capabilities
from harness.routes import BUNDLED_ROUTES, OPS as ALL_OPS
from harness.targets import plan_run
from harness.targets.base import Skip, Target
from harness.targets.plan_run.call import Call


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


DECODE_BACKENDS = {"fa2": ("fa2", False), "fa2_tc": ("fa2", True),
                   "aiter": ("aiter", False), "ll4mi": ("ll4mi", False)}


class BundledTarget(Target):
    name = "bundled"
    owns_contract = True
    routes = BUNDLED_ROUTES
    capabilities = Capabilities(ops=frozenset(ALL_OPS), features=FEATURES)

    def validate_options(self, disable_guards: str | None = None) -> None:
        """--disable-guards names guards the library has (or `all`)."""
        if not disable_guards:
            return
        from kernels.guards import NAMES
        names = {n.strip() for n in disable_guards.split(",") if n.strip()}
        unknown = sorted(names - set(NAMES) - {"all"})
        if unknown:
            raise ValueError(f"--disable-guards: unknown guard(s) {unknown}; known: all, "
                             f"{', '.join(sorted(NAMES))}")

    def version(self) -> str:
        return _kernels().__version__

    def build_id(self) -> str:
        # The content hash of the sources, platform, arch and flags: what actually ran.
        return _kernels().build_info()["build_hash"][:16]

    def commit(self) -> str:
        # The library lives in this repository, so its commit is the repository's.
        from harness.platform_info import repo_commit
        return repo_commit()

    def platform(self) -> str:
        return _kernels().build_info()["platform"]

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        if case.route not in self.routes:
            raise Skip(f"the bundled library has no route {case.route!r}")
        return plan_run.run(BundledCall(case, problem, buffers, self.capabilities.features))


def make_target() -> BundledTarget:
    return BundledTarget()
