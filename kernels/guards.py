"""Every refusal and every fix in the library, one named function each.

`KERNELS_DISABLE_GUARDS=name,name` (or `all`), read at call time, turns guards off: the call
then does what the library did before the fix. A disabled check does nothing; a disabled fix
returns the unfixed value. Whatever goes wrong next comes from the kernels themselves.

Refusals raise ValueError naming the field, the planned (or required) value and the given one.

The fast path: run() (and the single calls) check in full, then remember the key of the call
that passed: switch() below, and every tensor's shape, stride (contiguity for outputs), dtype
and device, which is everything a check reads besides the plan (plan() clears the memo). A
call with an equal key skips the checks; any difference checks again, with the same messages.
The fixes a launch applies at every call (merge_live_rows) are still called. With every guard
off, run() checks nothing and keeps no memo. No check reads the KERNELS_TESTONLY* variables:
which library a launch runs (the shipped one, or kernels.testonly's fault library) is chosen
per process, and every launch, memoized or not, goes to the library loaded at that moment.
"""
from __future__ import annotations

import os
from typing import AbstractSet, Callable

import torch

from ._lib import DTYPE_CODES, FP8_CODES

NAMES: dict[str, str] = {}
_UNFIXED: dict[str, Callable] = {}

_ENV = "KERNELS_DISABLE_GUARDS"
_NONE: frozenset = frozenset()
# Every guard call reads the variable (about ten per run()), and os.environ.get encodes the
# key and decodes the value each time, which alone cost more than the guards' checks. Its
# backing dict, which every write through os.environ updates, answers the same question in
# one lookup; the parsed names are kept per raw value (and per registry size, for `all`).
try:
    _ENV_KEY = os.environ.encodekey(_ENV)
except AttributeError:  # pragma: no cover - os.environ is always an os._Environ at import
    _ENV_KEY = _ENV
_PARSED: dict = {}


def _parse(raw: str) -> frozenset:
    # Runs only with KERNELS_DISABLE_GUARDS set (harness check --disable-guards); the ci coverage run
    # sets none, so no arm of _parse is taken there.
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "all" in names:
        return frozenset(NAMES)
    unknown = names - set(NAMES)
    if unknown:
        raise ValueError(f"{_ENV}: unknown guard(s) {sorted(unknown)}; known: {sorted(NAMES)}")
    return frozenset(names)


def disabled() -> AbstractSet[str]:
    """The guards KERNELS_DISABLE_GUARDS turns off now (read at every call; unknown names raise)."""
    try:  # the stored value (None when unset), without os.environ.get's conversions
        raw = os.environ._data.get(_ENV_KEY)
    # Reachable only if os.environ is replaced by a plain mapping; no ci case does that.
    except AttributeError:  # os.environ replaced by a plain mapping
        raw = os.environ.get(_ENV)
    # Only a run with KERNELS_DISABLE_GUARDS set gets past this return (the rest of disabled());
    # the ci coverage run leaves it unset.
    if raw is None:
        return _NONE
    hit = _PARSED.get(raw)
    if hit is not None and hit[0] == len(NAMES):
        return hit[1]
    names = _parse(os.environ.get(_ENV, ""))  # raises again on every call while a name is unknown
    if len(_PARSED) > 64:
        _PARSED.clear()
    _PARSED[raw] = (len(NAMES), names)
    return names


def switch() -> AbstractSet[str] | None:
    """The switch a run() memo is keyed on: None when every guard is off (the call then skips its
    checks, memo and all), else the disabled set, the same frozenset object while
    KERNELS_DISABLE_GUARDS keeps its value (so a memo compares it by identity first). Read at
    every call, through disabled() unless that is this module's own (a build or test may
    override it), and then with the unset variable answered inline."""
    # Only a build or test that replaces guards.disabled takes the other arm; nothing in the repo does.
    if disabled is _DISABLED:
        try:
            # Not None only with KERNELS_DISABLE_GUARDS set (--disable-guards runs); ci leaves it unset.
            if os.environ._data.get(_ENV_KEY) is None:
                return _NONE
        # Reachable only if os.environ is replaced by a plain mapping; no ci case does that.
        except AttributeError:  # os.environ replaced by a plain mapping
            pass
    off = disabled()
    # Reached only with KERNELS_DISABLE_GUARDS set (the unset variable returns above); ci sets none.
    return off if len(off) < len(NAMES) else None


_DISABLED = disabled


def guard(name: str, doc: str, unfixed: Callable | None = None):
    """Register a guard. When disabled, the call goes to `unfixed` (a fix) or does nothing (a check)."""
    def deco(fn):
        NAMES[name] = doc
        if unfixed is not None:
            _UNFIXED[name] = unfixed

        def wrapper(*args, **kwargs):
            # disabled() is looked up at call time: a build that overrides it turns guards off.
            # The disabled arm (and the unfixed call below) needs KERNELS_DISABLE_GUARDS; ci disables no guard.
            if name not in disabled():
                return fn(*args, **kwargs)
            return unfixed(*args, **kwargs) if unfixed is not None else None
        wrapper.__name__ = fn.__name__
        wrapper.__doc__ = fn.__doc__
        wrapper.guard_name = name
        return wrapper
    return deco


# ---- layouts ---------------------------------------------------------------------------------

def _copy_listed(where, tensors, copy=()):
    return dict(tensors)


@guard("last_dim_contiguous",
       "q/k/v and paged caches need stride(-1) == 1 (kernels read head_dim packed); single_decode copies its q",
       unfixed=_copy_listed)
def last_dim_contiguous(where: str, tensors: dict, copy=()) -> dict:
    out = {}
    for name, t in tensors.items():
        # stride()[-1] rather than stride(-1): the same value, without the index argument's parsing.
        # Reachable by a 0-d k/v (single calls) or q (batch run()), a None half of a cache tuple, or a
        # head_dim-1 tensor with stride(-1) != 1 (accepted); no ci case yet.
        if t is not None and t.dim() > 0 and t.stride()[-1] != 1 and t.shape[-1] > 1:
            if name in copy:
                t = t.contiguous()
            else:
                raise ValueError(f"{where}: {name} has stride(-1) == {t.stride(-1)}; "
                                 f"the kernels read head_dim packed, so it must be 1")
        out[name] = t
    return out


@guard("out_contiguous", "out, lse and partial_state must be contiguous and shaped as the kernel writes them")
def out_contiguous(where: str, tensors: dict, shapes: dict) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        want = shapes.get(name)
        # torch.Size is a tuple: it compares with a tuple as tuple(t.shape) would.
        # want is always a tuple here (every caller passes all four names as tuples); a wrong-shaped
        # out=/lse=/partial_state reaches the refusal; no ci case yet.
        if want is not None and t.shape != (want if type(want) is tuple else tuple(want)):
            raise ValueError(f"{where}: {name} must have shape {tuple(want)} but has {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous (the kernels write it packed) "
                             f"but has strides {tuple(t.stride())}")


@guard("state_contiguous", "merge_state inputs are read packed: v [rows, H, D] and s [rows, H] contiguous, shapes agree")
def state_contiguous(where: str, v: dict, s: dict) -> None:
    ref_v = next(iter(v.values()))
    for name, t in {**v, **s}.items():
        if not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous but has strides {tuple(t.stride())}")
    for name, t in v.items():
        # Reachable by merge_state(_in_place) with differently shaped v's; no ci case yet.
        if tuple(t.shape) != tuple(ref_v.shape):
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)} but the first state has {tuple(ref_v.shape)}")
    for name, t in s.items():
        # Reachable by merge_state(_in_place) with s of the wrong shape or a non-float32 s; no ci case yet.
        if tuple(t.shape) != tuple(ref_v.shape[:2]):
            raise ValueError(f"{where}: {name} must have shape {tuple(ref_v.shape[:2])} but has {tuple(t.shape)}")
        if t.dtype != torch.float32:
            raise ValueError(f"{where}: {name} must be float32 but is {t.dtype}")


# ---- shapes, dtypes, devices -----------------------------------------------------------------

@guard("dtype_supported", "q/k/v/out dtypes must be float16, bfloat16 or float32")
def dtype_supported(where: str, tensors: dict) -> None:
    for name, t in tensors.items():
        # t is never None (check_device drops None; merge reads v first); an unsupported dtype
        # (e.g. float64 q) reaches the refusal; no ci case yet.
        if t is not None and t.dtype not in DTYPE_CODES:
            raise ValueError(f"{where}: {name} dtype is {t.dtype}; supported: float16, bfloat16, float32")


@guard("device_matches", "tensors must live where the built platform runs kernels (CPU for host, CUDA for GPUs)")
def device_matches(where: str, platform: str, tensors: dict) -> None:
    # ci runs the host library; the "cuda" arm is the GPU builds'.
    want = "cpu" if platform == "host" else "cuda"
    cpu = want == "cpu"
    for name, t in tensors.items():
        # is_cpu / is_cuda say device.type == "cpu" / "cuda" without building a torch.device.
        # On the host library cpu is always True (is_cuda is the GPU builds'); every ci tensor is on the
        # CPU; a non-CPU tensor (e.g. device="meta") would reach the refusal; no ci case yet.
        if t is not None and not (t.is_cpu if cpu else t.is_cuda):
            raise ValueError(f"{where}: {name} is on {t.device} but the {platform} library runs on {want}")


@guard("head_dim_supported", "head_dim_qk and head_dim_vo must be 1..256 (the kernels' register arrays)")
def head_dim_supported(where: str, head_dim_qk: int, head_dim_vo: int) -> None:
    for name, d in (("head_dim_qk", head_dim_qk), ("head_dim_vo", head_dim_vo)):
        # Reachable by head_dim 0 or > 256 (plan() head_dim_qk/head_dim_vo, or a single call's q/v); no ci case yet.
        if not 1 <= d <= 256:
            raise ValueError(f"{where}: {name} is {d}; supported 1..256")


@guard("gqa_divisible", "num_qo_heads must be a multiple of num_kv_heads, and num_kv_heads > 0")
def gqa_divisible(where: str, num_qo_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads <= 0:
        raise ValueError(f"{where}: num_kv_heads is {num_kv_heads}; it must be positive")
    if num_qo_heads % num_kv_heads != 0:
        raise ValueError(f"{where}: num_qo_heads {num_qo_heads} is not a multiple of num_kv_heads "
                         f"{num_kv_heads} (GQA group size must divide)")


@guard("kv_shapes_agree", "k and v (and q's head_dim_qk) agree on kv length, kv heads and head dims")
def kv_shapes_agree(where: str, fields: dict) -> None:
    """fields: name -> (value from k or q, value from v or k)."""
    for field, (a, b) in fields.items():
        # Reachable by a single call whose k and v disagree (kv_len, heads) or q/k head_dim differ; no ci case yet.
        if a != b:
            raise ValueError(f"{where}: {field} is {a} for one tensor but {b} for the other")


@guard("run_matches_plan",
       "run() tensors agree with plan(): rank, heads, head dims, page size, dtype, at least the planned rows")
def run_matches_plan(where: str, checks) -> None:
    """checks: (field, planned, given, tensor name[, "at_least"]) tuples."""
    for check in checks:
        # Any fifth item means "at least". Indexed, not unpacked: this loop runs in every run().
        at_least = len(check) > 4
        if (check[2] < check[1]) if at_least else (check[2] != check[1]):
            field, want, have, src = check[:4]
            more = "at least " if at_least else ""
            raise ValueError(f"{where}: {field} is {more}{_show(want)} in plan() but {src} has {_show(have)}")


def _show(v):
    return str(v).replace("torch.", "")


@guard("batch_consistent",
       "plan() index tensors agree: indptr lengths, non-decreasing from 0, indices cover indptr[-1], last_page_len in 1..page_size")
def batch_consistent(where: str, fields: dict, indptrs: dict, indices_len=None, last_page=None) -> None:
    """fields: name -> (expected len, given len); indptrs: name -> list of ints."""
    for name, (want, have) in fields.items():
        # Reachable by plan() with an indptr or last_page_len of the wrong length; no ci case yet.
        if want != have:
            raise ValueError(f"{where}: {name} has {have} entries but the batch needs {want}")
    for name, ip in indptrs.items():
        # Reachable by plan() with an empty indptr, or one not starting at 0; no ci case yet.
        if ip and ip[0] != 0:
            raise ValueError(f"{where}: {name}[0] is {ip[0]}; it must be 0")
        for a, b in zip(ip, ip[1:]):
            # Reachable by plan() with a decreasing indptr; no ci case yet.
            if b < a:
                raise ValueError(f"{where}: {name} decreases ({a} then {b})")
    if indices_len is not None:
        need, have = indices_len
        # Reachable by plan() with fewer paged_kv_indices than indptr[-1]; no ci case yet.
        if have < need:
            raise ValueError(f"{where}: paged_kv_indices has {have} entries but indptr[-1] is {need}")
    if last_page is not None:
        page_size, pages, lens = last_page
        for n, l in zip(pages, lens):
            # Reachable by plan() with a last_page_len outside 1..page_size; no ci case yet.
            if n > 0 and not 1 <= l <= page_size:
                raise ValueError(f"{where}: paged_kv_last_page_len {l} is outside 1..page_size ({page_size})")


# ---- plan()/run() state ----------------------------------------------------------------------

def _early_write_first(validate, early_write):
    early_write()
    validate()


@guard("plan_validates_first",
       "plan() validates the whole batch before its first write, so a rejected plan leaves the previous plan usable",
       unfixed=_early_write_first)
def plan_validates_first(validate: Callable, early_write: Callable) -> None:
    validate()
    early_write()


@guard("half_planned_refuses", "run() refuses after a plan() that raised after its first write, or before any plan()")
def half_planned_refuses(where: str, state: str) -> None:
    # Reachable by run() before any plan(); no ci case yet.
    if state == "none":
        raise ValueError(f"{where}: plan() has not been called")
    if state == "partial":
        raise ValueError(f"{where}: the last plan() failed after it began updating the wrapper; call plan() again")


def _keep_callers(t):
    return t


@guard("plan_copies_indptr",
       "plan() keeps its own clone of a CPU indptr/indices/last_page_len for the lazy fa2 shadow plan",
       unfixed=_keep_callers)
def plan_copies_indptr(t: torch.Tensor) -> torch.Tensor:
    host = t.to("cpu")
    # Only a non-CPU (CUDA) index tensor takes the other arm: .to("cpu") copies it; ci's are on the CPU.
    return host.clone() if host is t else host


@guard("graph_capacity", "a CUDA-graph re-plan keeps the batch size and fits the capacity of the first plan()")
def graph_capacity(where: str, fixed: dict, given: dict) -> None:
    """fixed/given: 'batch_size' must be equal; every other field must not exceed."""
    for field, cap in fixed.items():
        have = given[field]
        if field == "batch_size" and have != cap:
            raise ValueError(f"{where}: batch_size is {cap} in the first (CUDA-graph) plan() but this plan has {have}")
        if field != "batch_size" and have > cap:
            raise ValueError(f"{where}: {field} capacity is {cap} from the first (CUDA-graph) plan() but this plan needs {have}")


@guard("max_kv_chunk_positive", "plan(max_kv_chunk=) is None (the library picks the split) or a positive int")
def max_kv_chunk_positive(where: str, max_kv_chunk) -> None:
    """Off: 0 means the default chunk and a negative one reaches kernels_plan, which fails."""
    if max_kv_chunk is None:
        return
    # Reachable by max_kv_chunk=True or a non-int such as 64.0; no ci case yet.
    if isinstance(max_kv_chunk, bool) or not isinstance(max_kv_chunk, int) or max_kv_chunk <= 0:
        raise ValueError(f"{where}: max_kv_chunk is {max_kv_chunk!r}; expected None (the library picks "
                         f"the split) or a positive int (kv tokens per work item)")


def _merge_over_capacity(live_rows_ptr):
    return None


@guard("merge_live_rows",
       "graph-mode partial_state merge stops at this plan's live rows (a device row count), not the capacity",
       unfixed=_merge_over_capacity)
def merge_live_rows(live_rows_ptr):
    return live_rows_ptr


@guard("partial_state_needs_lse", "partial_state on a split-KV plan needs an lse (return_lse=True or lse=), which the merge reads")
def partial_state_needs_lse(where: str, split: bool, lse) -> None:
    if split and lse is None:
        raise ValueError(f"{where}: partial_state on a split-KV plan needs lse (pass return_lse=True or lse=); "
                         f"the merge reads it")


# ---- routes ----------------------------------------------------------------------------------

LL4MI_MIN_HEAD_SIZE = 64
LL4MI_HEAD_MULTIPLE = 64  # 16 value dims x NWARPS (4) per VHELOOP iteration


def _always_ll4mi(head_size, window_left, q_len_per_req=1):
    return "ll4mi"


@guard("ll4mi_route_selector",
       "ll4mi decode only for head_size >= 64 and a multiple of 64, one q row per request, no sliding window; else fa2",
       unfixed=_always_ll4mi)
def ll4mi_route_selector(head_size: int, window_left: int, q_len_per_req: int = 1) -> str:
    if (head_size < LL4MI_MIN_HEAD_SIZE or head_size % LL4MI_HEAD_MULTIPLE != 0 or window_left >= 0
            or q_len_per_req > 1):
        return "fa2"
    return "ll4mi"


def _slice_without_end(query_start_loc, num_decodes):
    return query_start_loc[:num_decodes]


@guard("decode_cu_seqlens_slice",
       "a mixed batch's decode cu_seqlens_q is query_start_loc[:num_decodes + 1] (num_decodes + 1 entries)",
       unfixed=_slice_without_end)
def decode_cu_seqlens_slice(query_start_loc: torch.Tensor, num_decodes: int) -> torch.Tensor:
    return query_start_loc[:num_decodes + 1]


@guard("rank_expected", "tensors have the rank the route reads (q [rows, H, D], dense k/v 3-D, paged caches 4-D or [P, 2, ...])")
def rank_expected(where: str, tensors: dict) -> None:
    """tensors: name -> (tensor, expected rank)."""
    for name, (t, rank) in tensors.items():
        # Reachable by q=None (single calls; fails later) or a tensor of the wrong rank; no ci case yet.
        if t is not None and t.dim() != rank:
            raise ValueError(f"{where}: {name} must have rank {rank} but has {t.dim()} (shape {tuple(t.shape)})")


@guard("layout_known", "kv_layout is 'NHD' or 'HND'; backend is one the wrapper has")
def layout_known(where: str, field: str, value: str, known: tuple) -> None:
    # Reachable by an unknown kv_layout or backend (e.g. "NDH", "fa3"); no ci case yet.
    if value not in known:
        raise ValueError(f"{where}: {field} is {value!r}; expected one of {known}")


# ---- features ---------------------------------------------------------------------------------

@guard("fp8_kv_route", "fp8 (float8_e4m3fn, float8_e5m2) only as the k/v caches of paged prefill and batch decode")
def fp8_kv_route(where: str, tensors: dict, fp8_ok=()) -> None:
    for name, t in tensors.items():
        # Reachable by an fp8 q/out, or fp8 k/v to a single call or ragged run(); no ci case yet.
        if t.dtype in FP8_CODES and name not in fp8_ok:
            raise ValueError(f"{where}: {name} dtype is {_show(t.dtype)}; fp8 is supported only for the k/v "
                             f"caches of paged prefill and batch decode (q and out stay float16, bfloat16 "
                             f"or float32)")


@guard("logits_soft_cap_valid", "logits_soft_cap is a finite float >= 0 (0: off)")
def logits_soft_cap_valid(where: str, cap) -> float:
    try:
        c = float(cap)
    # Reachable by a non-numeric logits_soft_cap (e.g. "x"); no ci case yet.
    except (TypeError, ValueError):
        raise ValueError(f"{where}: logits_soft_cap is {cap!r}; expected a float >= 0 (0: off)") from None
    # Reachable by logits_soft_cap < 0, inf or nan; no ci case yet.
    if not (c >= 0.0 and c != float("inf")):
        raise ValueError(f"{where}: logits_soft_cap is {c}; expected a finite float >= 0 (0: off)")
    return c


@guard("per_head_vector",
       "sinks and alibi_slopes are float32 [num_qo_heads] (one per q head, not per kv head), contiguous, on the kernels' device")
def per_head_vector(where: str, platform: str, tensors: dict, num_qo_heads: int) -> None:
    device_matches(where, platform, tensors)
    for name, t in tensors.items():
        if t is None:
            continue
        # A non-tensor sinks/alibi_slopes fails in device_matches above (no .is_cpu) first; only with
        # device_matches disabled does it get here; no ci run disables it.
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{where}: {name} is {type(t).__name__}; expected a float32 tensor [num_qo_heads]")
        # Reachable by a sinks/alibi_slopes tensor that is not 1-D; no ci case yet.
        if t.dim() != 1 or t.shape[0] != num_qo_heads:
            raise ValueError(f"{where}: {name} has shape {tuple(t.shape)} but num_qo_heads is {num_qo_heads} "
                             f"(one value per q head: shape ({num_qo_heads},))")
        # Reachable by non-float32 sinks/alibi_slopes; no ci case yet.
        if t.dtype != torch.float32:
            raise ValueError(f"{where}: {name} dtype is {_show(t.dtype)}; expected float32")
        # Reachable by non-contiguous sinks/alibi_slopes (e.g. x[::2]); no ci case yet.
        if not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous but has strides {tuple(t.stride())}")


def _first_scale(where, name, scale):
    # The unfixed path: runs only with kv_scale_scalar disabled (KERNELS_DISABLE_GUARDS); ci disables none.
    if scale is None:
        return 1.0
    return float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)


@guard("kv_scale_scalar", "k_scale / v_scale are per-tensor: a float or a one-element tensor (None: 1.0)",
       unfixed=_first_scale)
def kv_scale_scalar(where: str, name: str, scale) -> float:
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        # Reachable by a one-element tensor k_scale/v_scale (e.g. torch.tensor([0.5])); no ci case yet.
        if scale.numel() != 1:
            raise ValueError(f"{where}: {name} has shape {tuple(scale.shape)}; expected a float or a "
                             f"one-element tensor (one per-tensor scale)")
        return float(scale.reshape(-1)[0])
    try:
        return float(scale)
    # Reachable by a non-numeric k_scale/v_scale (e.g. "x"); no ci case yet.
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} is {scale!r}; expected a float or a one-element tensor") from None


@guard("custom_mask_shape",
       "custom_mask is a contiguous bool tensor: [qo_len, kv_len] (single prefill), or flat with sum(qo_len_i * kv_len_i) elements (paged prefill)")
def custom_mask_shape(where: str, mask, want) -> None:
    """want: the shape tuple (single) or the element count (paged, flat)."""
    # Reachable by a non-tensor custom_mask (e.g. a list); no ci case yet.
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{where}: custom_mask is {type(mask).__name__}; expected a bool tensor")
    # Reachable by a non-bool custom_mask; no ci case yet.
    if mask.dtype != torch.bool:
        raise ValueError(f"{where}: custom_mask dtype is {_show(mask.dtype)}; expected bool (True: attend)")
    if isinstance(want, tuple):
        if tuple(mask.shape) != want:
            raise ValueError(f"{where}: custom_mask has shape {tuple(mask.shape)} but [qo_len, kv_len] is {want}")
    # Reachable by a paged plan() custom_mask that is not flat (2-D); no ci case yet.
    elif mask.dim() != 1 or mask.numel() != want:
        raise ValueError(f"{where}: custom_mask has shape {tuple(mask.shape)} but the batch needs a flat mask "
                         f"of {want} elements (sum of qo_len_i * kv_len_i)")
    # Reachable by a non-contiguous custom_mask; no ci case yet.
    if not mask.is_contiguous():
        raise ValueError(f"{where}: custom_mask must be contiguous but has strides {tuple(mask.stride())}")


@guard("custom_mask_replaces_causal", "a custom_mask replaces causal: causal=True with a custom_mask is refused")
def custom_mask_replaces_causal(where: str, causal: bool, mask) -> None:
    # mask is never None: both callers call this only when a custom_mask is given.
    if mask is not None and causal:
        raise ValueError(f"{where}: causal is True and a custom_mask is given; the mask replaces causal "
                         f"(put the causal triangle in the mask and pass causal=False)")


@guard("multi_token_decode_rows",
       "batch decode's q_len_per_req is an int >= 1 and run()'s q rows are a multiple of it")
def multi_token_decode_rows(where: str, q_len_per_req, q_rows=None) -> None:
    if q_rows is None:
        # Reachable by q_len_per_req 2.0, True or 0; no ci case yet.
        if not isinstance(q_len_per_req, int) or isinstance(q_len_per_req, bool) or q_len_per_req < 1:
            raise ValueError(f"{where}: q_len_per_req is {q_len_per_req!r}; expected an int >= 1")
    elif q_rows % q_len_per_req != 0:
        raise ValueError(f"{where}: q has {q_rows} rows, not a multiple of q_len_per_req {q_len_per_req} "
                         f"(planned in plan())")
