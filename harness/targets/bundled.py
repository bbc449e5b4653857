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

from harness.model.capabilities import FEATURES, Capabilities
from harness.model.routes import BUNDLED_ROUTES, OPS as ALL_OPS
from harness.targets.plan_run import dispatch
from harness.targets.base import Skip, Target
from harness.targets.plan_run.call import Call
from harness.targets.plan_run.mismatch import PLAN_METADATA


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
    owns_contract = True
    routes = BUNDLED_ROUTES
    capabilities = Capabilities(ops=frozenset(ALL_OPS), features=FEATURES, metadata=PLAN_METADATA)

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
        from harness.model.platform_info import repo_commit
        return repo_commit()

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
# `harness repro CASE --standalone` writes a script that needs only torch and this library:
# the source below is this adapter's calls (harness/targets/plan_run/routes.py) written out
# with nothing of the harness left, so whoever reads the script reads the calls that failed.

_STANDALONE_OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
                   "batch_decode")
_STANDALONE_STRIDED = ("q", "k", "v", "out", "lse", "k_cache", "v_cache", "kv_cache",
                       "q_heads", "k_heads", "v_heads", "kv_indptr", "kv_indices",
                       "last_page_len", "qo_indptr")
# Past this many pool elements the harness poisons only pages near the owned ones; a
# script filling the whole pool would not hand the library the same memory.
_STANDALONE_POOL_ELEMS = 1 << 26


def standalone_unsupported(case) -> str | None:
    """Why this adapter cannot write `case` as a standalone script, or None when it can."""
    params = case.params
    if case.op not in _STANDALONE_OPS:
        return f"the standalone script covers {', '.join(_STANDALONE_OPS)}, not {case.op}"
    for key, why in (("scenario", "a multi-call scenario"), ("mismatch", "a mis-planned run()"),
                     ("partial_state", "a run() merging into a partial state"),
                     ("logits_soft_cap", "a soft cap"), ("sinks", "attention sinks"),
                     ("alibi_slopes", "ALiBi"), ("kv_dtype", "an fp8 KV cache"),
                     ("k_scale", "a k_scale"), ("v_scale", "a v_scale"),
                     ("q_len_per_req", "multi-token decode"), ("custom_mask", "a custom mask"),
                     ("malformed", "a malformed feature argument")):
        if params.get(key):
            return f"{why} ({key}) has no standalone script yet"
    strided = params.get("strided")
    if strided and strided not in _STANDALONE_STRIDED:
        return f"strided {strided!r} has no standalone script yet"
    if case.op in ("paged_prefill", "batch_decode"):
        from harness.model.problem import normalize
        p = normalize(params)
        page = int(params.get("page_size", 16))
        pages = sum(-(-n // page) for n in p["kv_lens"]) + int(params.get("page_id_offset", 0))
        if pages * page * p["num_kv_heads"] * max(p["head_dim"], p["head_dim_vo"]) \
                > _STANDALONE_POOL_ELEMS:
            return "the paged pool is too large to fill whole in a script"
    return None


def standalone_config(case) -> dict:
    """The literal settings the script's call() reads: the params the adapter reads, with the
    page order the harness drew (its shuffle is seeded by the case) spelled out."""
    from harness.model.problem import normalize
    from harness.targets.layout import page_ids
    p, params = normalize(case.params), case.params
    cfg = {
        "op": case.op, "layout": params.get("layout", "NHD"), "strided": params.get("strided"),
        "index_dtype": dict(params.get("index_dtype") or {}),
        "out_form": params.get("out_form", "given"), "sm_scale": params.get("sm_scale"),
        "causal": p["causal"], "window_left": p["window_left"], "return_lse": p["return_lse"],
        "qo_lens": p["qo_lens"], "kv_lens": p["kv_lens"], "num_qo_heads": p["num_qo_heads"],
        "num_kv_heads": p["num_kv_heads"], "head_dim": p["head_dim"],
        "head_dim_vo": p["head_dim_vo"], "use_cuda_graph": bool(params.get("use_cuda_graph")),
        "max_kv_chunk": params.get("max_kv_chunk"),
        "workspace_bytes": int(params.get("workspace_bytes", 32 << 20)),
    }
    if case.op in ("paged_prefill", "batch_decode"):
        page = int(params.get("page_size", 16))
        offset = int(params.get("page_id_offset", 0))
        total = sum(-(-n // page) for n in p["kv_lens"])
        cfg.update(page_size=page, page_id_offset=offset, cache_form=params.get("cache_form", "tuple"),
                   page_order=params.get("page_order", "shuffled"), seed=case.seed,
                   # what build_paged draws from the seed, for whoever reads the script
                   page_ids=page_ids(total, params.get("page_order", "shuffled"), offset, case.seed))
    if case.op == "batch_decode":
        cfg["decode_backend"] = list(DECODE_BACKENDS[case.backend])
    return cfg


def standalone_call_source(case) -> str:
    """`def call(inputs) -> dict` for this case, as the bundled adapter makes its calls."""
    import pprint
    import inspect
    from harness.targets import layout
    cfg = pprint.pformat(standalone_config(case), width=96, compact=True)
    # The paged cache is the adapter's own build_paged (harness/targets/layout.py), verbatim.
    paged = "\n\n\n".join(
        [f"FULL_POISON_ELEMS = {layout.FULL_POISON_ELEMS!r}\n_NEIGHBOURS = {layout._NEIGHBOURS!r}"]
        + [inspect.getsource(f).rstrip() for f in
           (layout.page_ids, layout._pool, layout.PagedKV, layout.build_paged)])
    return (f"import random\nfrom dataclasses import dataclass\n\nimport kernels\n\n"
            f"CFG = {cfg}\n\n\n{_STANDALONE_SKIP}\n\n\n{paged}\n\n{_STANDALONE_CALL}")


_STANDALONE_SKIP = '''class Skip(Exception):
    """The harness's 'this route cannot express the case' (never raised for a case a script
    was written for)."""


class PagedProblem:
    """The fields of the harness's Problem that build_paged reads, from the inputs."""

    def __init__(self, k, v, dtype, device):
        self.k, self.v, self.dtype, self.device = k, v, dtype, device
        self.kv_lens = CFG["kv_lens"]
        self.num_kv_heads, self.head_dim = CFG["num_kv_heads"], CFG["head_dim"]
        self.head_dim_vo = CFG["head_dim_vo"]'''


_STANDALONE_CALL = '''
NAN = float("nan")


def _poisoned(shape, like):
    # Slots a kernel must never read hold poison, so one that ignores a stride reads NaN.
    fill = NAN if like.dtype.is_floating_point else -(2 ** 30)
    return torch.full(shape, fill, dtype=like.dtype, device=like.device)


def _passed(name, t):
    """The tensor as the case hands it over: a view whose hidden slots hold poison."""
    if CFG["strided"] == name:                        # stride(-1) == 2
        view = _poisoned((*t.shape[:-1], 2 * t.shape[-1]), t)[..., ::2]
        view.copy_(t)
        return view
    if CFG["strided"] == name + "_heads":             # [rows, H, D] cut from [rows, H + 1, D]
        t3 = t if t.dim() == 3 else t.unsqueeze(1)
        view = _poisoned((t3.shape[0], t3.shape[1] + 1, t3.shape[2]), t3)[:, :t3.shape[1]]
        view.copy_(t3)
        return view if t.dim() == 3 else view.squeeze(1)
    return t


def _index(name, values, device):
    dtype = torch.int64 if CFG["index_dtype"].get(name) == "int64" else torch.int32
    t = torch.as_tensor(values, dtype=torch.int64).to(dtype).to(device)
    if CFG["strided"] == name:                        # every other element, poison between
        view = _poisoned((t.shape[0] * 2, *t.shape[1:]), t)[::2]
        view.copy_(t)
        t = view
    return t


def _output(name, shape, dtype, device):
    """A caller's out=/lse= buffer, NaN until written; None when the library allocates."""
    if CFG["out_form"] != "given":
        return None
    if CFG["strided"] == name:
        return torch.full((*shape[:-1], 2 * shape[-1]), NAN, dtype=dtype, device=device)[..., ::2]
    return torch.full(shape, NAN, dtype=dtype, device=device)


def _read(returned, out, lse):
    """What the caller reads: the buffers it handed over, else what the call returned."""
    if out is not None:
        return out, lse
    if CFG["return_lse"]:
        return returned
    return returned, None


def _layout(t):
    return t.contiguous() if CFG["layout"] == "NHD" else t.transpose(0, 1).contiguous()


def _paged(k_list, v_list, dtype, device):
    """A paged cache holding each request's k/v on its pages (build_paged above: every other
    slot is NaN), as the case hands it over, and its index tensors."""
    paged = build_paged(PagedProblem(k_list, v_list, dtype, device), CFG["page_size"],
                        CFG["layout"], CFG["page_order"], CFG["page_id_offset"], CFG["seed"])
    if CFG["cache_form"] == "single":
        cache = _passed("kv_cache", paged.cache("single"))
    else:
        cache = (_passed("k_cache", paged.k_pages), _passed("v_cache", paged.v_pages))
    idx = dict(kv_indptr=_index("kv_indptr", paged.indptr, "cpu"),
               kv_indices=_index("kv_indices", paged.indices, device),
               last_page_len=_index("last_page_len", paged.last_page_len, "cpu"))
    return cache, idx


def _graph_buffers(names, n_indices, device):
    """Caller-owned capacity buffers of a CUDA-graph-mode wrapper, sized to this batch."""
    if not CFG["use_cuda_graph"]:
        return {}
    b = len(CFG["qo_lens"])
    sizes = (b + 1, b + 1, max(1, n_indices), b)
    return {name: torch.empty(n, dtype=torch.int32, device=device)
            for name, n in zip(names, sizes) if name}


def _dims(dtype):
    return dict(num_qo_heads=CFG["num_qo_heads"], num_kv_heads=CFG["num_kv_heads"],
                window_left=CFG["window_left"], sm_scale=CFG["sm_scale"], q_data_type=dtype,
                kv_data_type=dtype, max_kv_chunk=CFG["max_kv_chunk"])


def call(inputs):
    """The library's calls for this case; outputs in the logical layout [rows, heads, dim]."""
    qs, ks, vs = inputs["q"], inputs["k"], inputs["v"]
    dtype, device = qs[0].dtype, qs[0].device
    hq, dv, lse_on = CFG["num_qo_heads"], CFG["head_dim_vo"], CFG["return_lse"]
    rows = sum(CFG["qo_lens"])
    op = CFG["op"]
    if op == "single_decode":
        q = _passed("q", qs[0][0].contiguous())                      # [Hq, D]
        k, v = _passed("k", _layout(ks[0])), _passed("v", _layout(vs[0]))
        out = _output("out", (hq, dv), dtype, device)
        lse = _output("lse", (hq,), torch.float32, device) if lse_on else None
        returned = kernels.single_decode_with_kv_cache(
            q, k, v, kv_layout=CFG["layout"], window_left=CFG["window_left"],
            sm_scale=CFG["sm_scale"], return_lse=lse_on, use_tensor_cores=False, out=out, lse=lse)
        out, lse = _read(returned, out, lse)
        return {"o": out.unsqueeze(0), **({"lse": lse.unsqueeze(0)} if lse_on else {})}
    out = _output("out", (rows, hq, dv), dtype, device)
    lse = _output("lse", (rows, hq), torch.float32, device) if lse_on else None
    if op == "single_prefill":
        q = _passed("q", qs[0].contiguous())
        k, v = _passed("k", _layout(ks[0])), _passed("v", _layout(vs[0]))
        returned = kernels.single_prefill_with_kv_cache(
            q, k, v, causal=CFG["causal"], kv_layout=CFG["layout"],
            window_left=CFG["window_left"], sm_scale=CFG["sm_scale"], return_lse=lse_on,
            out=out, lse=lse)
    else:
        workspace = torch.empty(CFG["workspace_bytes"], dtype=torch.uint8, device=device)
        graph = CFG["use_cuda_graph"]
        qo_indptr = [0]
        for n in CFG["qo_lens"]:
            qo_indptr.append(qo_indptr[-1] + n)
        if op == "ragged_prefill":
            kv_indptr = [0]
            for n in CFG["kv_lens"]:
                kv_indptr.append(kv_indptr[-1] + n)
            plan_qo = _index("qo_indptr", qo_indptr, "cpu")
            plan_kv = _index("kv_indptr", kv_indptr, "cpu")
            wrapper = kernels.BatchPrefillWithRaggedKVCacheWrapper(
                workspace, kv_layout="NHD", use_cuda_graph=graph,
                **_graph_buffers(("qo_indptr_buf", "kv_indptr_buf", None, None), 0, device))
            q = _passed("q", torch.cat(qs))
            k, v = _passed("k", torch.cat(ks)), _passed("v", torch.cat(vs))
            wrapper.plan(qo_indptr=plan_qo, kv_indptr=plan_kv, head_dim_qk=CFG["head_dim"],
                         head_dim_vo=dv, causal=CFG["causal"], **_dims(dtype))
            returned = wrapper.run(q, k, v, out=out, lse=lse, return_lse=lse_on)
        elif op == "paged_prefill":
            cache, idx = _paged(ks, vs, dtype, device)
            plan_qo = _index("qo_indptr", qo_indptr, "cpu")
            wrapper = kernels.BatchPrefillWithPagedKVCacheWrapper(
                workspace, kv_layout=CFG["layout"], use_cuda_graph=graph,
                **_graph_buffers(("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                                  "paged_kv_last_page_len_buf"), len(CFG["page_ids"]), device))
            q = _passed("q", torch.cat(qs))
            wrapper.plan(qo_indptr=plan_qo, paged_kv_indptr=idx["kv_indptr"],
                         paged_kv_indices=idx["kv_indices"],
                         paged_kv_last_page_len=idx["last_page_len"], head_dim_qk=CFG["head_dim"],
                         page_size=CFG["page_size"], head_dim_vo=dv, causal=CFG["causal"],
                         **_dims(dtype))
            returned = wrapper.run(q, cache, out=out, lse=lse, return_lse=lse_on)
        else:   # batch_decode
            cache, idx = _paged(ks, vs, dtype, device)
            backend, tensor_cores = CFG["decode_backend"]
            wrapper = kernels.BatchDecodeWithPagedKVCacheWrapper(
                workspace, kv_layout=CFG["layout"], use_cuda_graph=graph,
                use_tensor_cores=tensor_cores, backend=backend,
                **_graph_buffers((None, "paged_kv_indptr_buffer", "paged_kv_indices_buffer",
                                  "paged_kv_last_page_len_buffer"), len(CFG["page_ids"]), device))
            q = _passed("q", torch.cat(qs))
            wrapper.plan(indptr=idx["kv_indptr"], indices=idx["kv_indices"],
                         last_page_len=idx["last_page_len"], head_dim=CFG["head_dim"],
                         page_size=CFG["page_size"], **_dims(dtype))
            returned = wrapper.run(q, cache, out=out, lse=lse, return_lse=lse_on)
    out, lse = _read(returned, out, lse)
    return {"o": out[:rows], **({"lse": lse[:rows]} if lse_on else {})}
'''
