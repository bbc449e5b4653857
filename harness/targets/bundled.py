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

merge_state and mixed_batch live in bundled_merge.py and bundled_mixed.py.

Params (layout, page_size, cache_form, strided, mismatch, scenario, ...) are
declared once, with their meaning, in harness/params.py.

A case naming a tensor the route never passes is skipped, not silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from harness.capabilities import FEATURES, Capabilities
from harness.routes import BUNDLED_ROUTES, OPS as ALL_OPS
from harness.targets.base import Skip, Target
from harness.targets.bundled_layout import Views, build_paged, to_layout
from harness.targets.bundled_merge import merge_state
from harness.targets.bundled_mismatch import perturb, perturb_ragged, planned_rows, short_rows
from harness.targets.bundled_mixed import mixed_batch

WORKSPACE_BYTES = 32 << 20


def _kernels():
    import kernels  # deferred: importing the adapter must not build the library
    return kernels


class Call:
    """One case's calls: the problem, its buffers, and the views the case asks for."""

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
        return self.params.get("sm_scale")

    def out(self, rows: int, name: str = "out"):
        p = self.problem
        per_row = p.num_qo_heads * p.head_dim_vo
        return self.views.output(name, (rows, p.num_qo_heads, p.head_dim_vo), p.dtype,
                                 512 + short_rows(self) * per_row)

    def lse(self, rows: int, name: str = "lse"):
        if not self.problem.return_lse:
            return None
        return self.views.output(name, (rows, self.problem.num_qo_heads), torch.float32,
                                 512 + short_rows(self) * self.problem.num_qo_heads)

    def workspace(self) -> torch.Tensor:
        n = int(self.params.get("workspace_bytes", WORKSPACE_BYTES))
        return torch.empty(n, dtype=torch.uint8, device=self.device)

    # What a target's library differs in; FlashInfer's adapter overrides these.
    @property
    def lib(self):
        """The module whose functions and wrappers the routes call."""
        return _kernels()

    def prefill_backend(self) -> dict:
        """Extra constructor keywords of the prefill wrappers."""
        return {}

    def decode_backend(self) -> tuple[str, bool]:
        """The batch-decode wrapper's (backend, use_tensor_cores)."""
        return DECODE_BACKENDS[self.case.backend]

    def plan_extra(self) -> dict:
        """Extra plan() keywords of the batch wrappers."""
        return {"max_kv_chunk": self.params.get("max_kv_chunk")}

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
        res = {"o": _rows(out, rows)}
        if self.problem.return_lse:
            res["lse"] = _rows(lse, rows)
        return res


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] >= rows:
        return t[:rows]
    pad = torch.full((rows - t.shape[0], *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
    return torch.cat([t, pad])


# ------------------------------------------------------------------ single routes

def single_prefill(c: Call) -> dict:
    p, k_ = c.problem, _kernels()
    if p.batch_size != 1:
        raise Skip("single prefill takes one request")
    q = c.views.input("q", p.q[0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    out, lse = c.out(p.qo_lens[0]), c.lse(p.qo_lens[0])
    c.ready("run")
    k_.single_prefill_with_kv_cache(
        q, k, v, causal=p.causal, kv_layout=c.layout, window_left=p.window_left,
        sm_scale=c.sm_scale, return_lse=p.return_lse, out=out, lse=lse)
    return c.result(out, lse)


def single_decode(c: Call) -> dict:
    p, k_ = c.problem, _kernels()
    if p.batch_size != 1 or p.qo_lens[0] != 1:
        raise Skip("single decode takes one request with one query token")
    q = c.views.input("q", p.q[0][0].contiguous())
    k = c.views.input("k", to_layout(p.k[0], c.layout))
    v = c.views.input("v", to_layout(p.v[0], c.layout))
    out = c.views.output("out", (p.num_qo_heads, p.head_dim_vo), p.dtype)
    lse = c.views.output("lse", (p.num_qo_heads,), torch.float32) if p.return_lse else None
    c.ready("run")
    k_.single_decode_with_kv_cache(
        q, k, v, kv_layout=c.layout, window_left=p.window_left, sm_scale=c.sm_scale,
        return_lse=p.return_lse, use_tensor_cores=False, out=out, lse=lse)
    res = {"o": out.unsqueeze(0)}
    if p.return_lse:
        res["lse"] = lse.unsqueeze(0)
    return res


# ------------------------------------------------------------------ batch routes

def paged_inputs(c: Call):
    """Plan-side index tensors and the run-side cache of a paged route."""
    p = c.problem
    paged = build_paged(p, int(c.params.get("page_size", 16)), c.layout,
                        c.params.get("page_order", "shuffled"),
                        int(c.params.get("page_id_offset", 0)), c.case.seed)
    idx = {
        "kv_indptr": c.views.index("kv_indptr", paged.indptr, "cpu"),
        "kv_indices": c.views.index("kv_indices", paged.indices, c.device),
        "last_page_len": c.views.index("last_page_len", paged.last_page_len, "cpu"),
    }
    return paged, idx


def cache_input(c: Call, paged):
    """The paged cache in the case's form: (k_cache, v_cache) or one kv_cache tensor."""
    form = c.params.get("cache_form", "tuple")
    cache = paged.cache(form)
    if form == "single":
        return c.views.input("kv_cache", cache)
    return (c.views.input("k_cache", cache[0]), c.views.input("v_cache", cache[1]))


def graph_buffers(c: Call, n_indices: int, names: tuple) -> dict:
    """Caller-owned capacity buffers of a CUDA-graph-mode wrapper, sized to this batch.

    names: the wrapper's keyword names for (qo_indptr, kv_indptr, kv_indices, last_page_len)
    buffers, None where it takes none.
    """
    if not c.params.get("use_cuda_graph"):
        return {}
    b = c.problem.batch_size
    sizes = (b + 1, b + 1, max(1, n_indices), b)
    return {name: torch.empty(n, dtype=torch.int32, device=c.device)
            for name, n in zip(names, sizes) if name}


PAGED_PREFILL_BUFS = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                      "paged_kv_last_page_len_buf")
RAGGED_BUFS = ("qo_indptr_buf", "kv_indptr_buf", None, None)
DECODE_BUFS = (None, "paged_kv_indptr_buffer", "paged_kv_indices_buffer",
               "paged_kv_last_page_len_buffer")


@dataclass
class Prepared:
    """A batch route's calls, built but not made: scenarios re-plan before running."""
    wrapper: Any
    plan_kw: dict
    run_args: tuple
    run_kw: dict
    out: torch.Tensor
    lse: torch.Tensor | None
    rows: int

    def plan(self, **override) -> None:
        self.wrapper.plan(**{**self.plan_kw, **override})

    def run(self) -> None:
        self.wrapper.run(*self.run_args, **self.run_kw)


def plan_and_run(c: Call, prep: Prepared) -> dict:
    c.ready("plan")
    prep.plan()
    c.buffers.stage("run")
    prep.run()
    return c.result(prep.out, prep.lse, prep.rows)


def _dims(c: Call) -> dict:
    """plan() keywords every batch wrapper takes alike."""
    p = c.problem
    return dict(num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads,
                window_left=p.window_left, sm_scale=c.sm_scale, q_data_type=p.dtype,
                kv_data_type=p.dtype, **c.plan_extra())


def _prepared(c: Call, wrapper, plan_kw: dict, run_args: tuple, out_rows: int,
              rows: int) -> Prepared:
    out, lse = c.out(out_rows), c.lse(out_rows)
    run_kw = dict(out=out, lse=lse, return_lse=c.problem.return_lse)
    return Prepared(wrapper, plan_kw, run_args, run_kw, out, lse, rows)


def prepare_paged_prefill(c: Call) -> Prepared:
    p = c.problem
    paged, idx = paged_inputs(c)
    qo_indptr = c.views.index("qo_indptr", p.qo_indptr.tolist(), "cpu")
    wrapper = c.lib.BatchPrefillWithPagedKVCacheWrapper(
        c.workspace(), kv_layout=c.layout, use_cuda_graph=bool(c.params.get("use_cuda_graph")),
        **c.prefill_backend(), **graph_buffers(c, len(paged.indices), PAGED_PREFILL_BUFS))
    q, cache = perturb(c, p.q_packed(), cache_input(c, paged))
    q = c.views.input("q", q)
    out_rows, rows = planned_rows(c)
    out, lse = c.out(out_rows), c.lse(out_rows)
    partial = c.partial_state(out_rows)
    plan_kw = dict(qo_indptr=qo_indptr, paged_kv_indptr=idx["kv_indptr"],
                   paged_kv_indices=idx["kv_indices"], paged_kv_last_page_len=idx["last_page_len"],
                   head_dim_qk=p.head_dim, page_size=paged.page_size, head_dim_vo=p.head_dim_vo,
                   causal=p.causal, **_dims(c))
    run_kw = dict(out=out, lse=lse, return_lse=p.return_lse)
    if partial is not None:
        run_kw["partial_state"] = partial
    return Prepared(wrapper, plan_kw, (q, cache), run_kw, out, lse, rows)


def prepare_ragged_prefill(c: Call) -> Prepared:
    p = c.problem
    if c.layout != "NHD":
        raise Skip("ragged k/v are token-major (NHD) only")
    qo_indptr = c.views.index("qo_indptr", p.qo_indptr.tolist(), "cpu")
    kv_indptr = c.views.index("kv_indptr", p.kv_indptr.tolist(), "cpu")
    wrapper = c.lib.BatchPrefillWithRaggedKVCacheWrapper(
        c.workspace(), kv_layout="NHD", use_cuda_graph=bool(c.params.get("use_cuda_graph")),
        **c.prefill_backend(), **graph_buffers(c, 0, RAGGED_BUFS))
    q, k, v = perturb_ragged(c, p.q_packed(), p.k_packed(), p.v_packed())
    q, k, v = c.views.input("q", q), c.views.input("k", k), c.views.input("v", v)
    plan_kw = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, head_dim_qk=p.head_dim,
                   head_dim_vo=p.head_dim_vo, causal=p.causal, **_dims(c))
    return _prepared(c, wrapper, plan_kw, (q, k, v), *planned_rows(c))


DECODE_BACKENDS = {"fa2": ("fa2", False), "fa2_tc": ("fa2", True),
                   "aiter": ("aiter", False), "ll4mi": ("ll4mi", False)}


def prepare_batch_decode(c: Call) -> Prepared:
    p = c.problem
    if any(n != 1 for n in p.qo_lens):
        raise Skip("batch decode takes one query token per request")
    if p.head_dim_vo != p.head_dim:
        raise Skip("batch decode plans one head_dim for k and v")
    if p.causal:
        raise Skip("batch decode has no causal flag (one query token sees its whole KV)")
    paged, idx = paged_inputs(c)
    backend, tensor_cores = c.decode_backend()
    wrapper = c.lib.BatchDecodeWithPagedKVCacheWrapper(
        c.workspace(), kv_layout=c.layout, use_cuda_graph=bool(c.params.get("use_cuda_graph")),
        use_tensor_cores=tensor_cores, backend=backend,
        **graph_buffers(c, len(paged.indices), DECODE_BUFS))
    q, cache = perturb(c, p.q_packed(), cache_input(c, paged))
    q = c.views.input("q", q)
    plan_kw = dict(indptr=idx["kv_indptr"], indices=idx["kv_indices"],
                   last_page_len=idx["last_page_len"], head_dim=p.head_dim,
                   page_size=paged.page_size, **_dims(c))
    return _prepared(c, wrapper, plan_kw, (q, cache), *planned_rows(c))


PREPARE = {
    "paged_prefill": prepare_paged_prefill,
    "ragged_prefill": prepare_ragged_prefill,
    "batch_decode": prepare_batch_decode,
}


def run_batch(c: Call) -> dict:
    """A batch route as a plain case makes it: plan, then run."""
    return plan_and_run(c, PREPARE[c.case.op](c))


OPS = {
    "single_prefill": single_prefill,
    "single_decode": single_decode,
    **{op: run_batch for op in PREPARE},
    "merge_state": merge_state,
    "mixed_batch": mixed_batch,
}


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
        c = Call(case, problem, buffers)
        if c.params.get("scenario"):
            from harness.targets.bundled_scenarios import run_scenario
            return run_scenario(c)
        return OPS[case.op](c)


def make_target() -> BundledTarget:
    return BundledTarget()
