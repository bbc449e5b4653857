"""The logical attention problem a case describes: dense per-request q/k/v.

A Problem is what the reference computes from and what adapters lay out for
a library (paged, strided, padded...). It is rebuilt bit-for-bit from
(params, seed), and the device never influences the numbers: a case rebuilt
on a CPU-only machine gets the same input bits as on a GPU. Two paths:

- up to DEVICE_DRAW_ELEMENTS q+k+v elements (all requests), every value is
  drawn on the CPU from one torch.Generator (torch.randn, float32) in a fixed
  order (q, k, v of request 0, then request 1, ...), reshaped by VALUES, cast
  to the case's dtype and only then moved to the device;
- above it, filling on the CPU and copying would cost seconds a case, so each
  request's q, k, v are drawn on the device itself by draws.normal_draws
  (exact integer hashing: the same bits on every device; stream 3 * r + 0, 1,
  2 for request r's q, k, v), reshaped by VALUES and cast there. Those draws
  are N(0, 1)-like (mean 0, std 1) but bounded at about +-3.46.

Scale: q, k and v are N(0, 1). With the default sm_scale = 1/sqrt(head_dim)
a logit q.k * sm_scale is then N(0, 1) whatever head_dim is: the softmax is
neither one-hot (which would hide a wrong value loop behind a single row of
v) nor uniform (which would hide a wrong mask behind an average), and every
logit stays far from the exp() overflow range even in fp16.

params["values"] reshapes those same draws (elementwise, in float32, before
the cast) into the inputs that break the numerics a kernel gets wrong; see
VALUES below. "normal" leaves them untouched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import torch

from harness.model.draws import normal_draws
from harness.model.sizes import case_work, qkv_elements

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# Keys build_problem interprets; every other key passes through for adapters.
DEFAULTS = {
    "dtype": "bf16",
    "head_dim_vo": None,      # = head_dim
    "num_kv_heads": None,     # = num_qo_heads
    "causal": False,
    "window_left": -1,
    "sm_scale": None,         # = 1 / sqrt(head_dim)
    "return_lse": False,
    "values": "normal",       # one of VALUES
    # Features (params.SCHEMA says what each means; reference.py applies them in the order
    # kernels/README.md documents: soft cap, ALiBi, masking, sinks).
    "logits_soft_cap": 0.0,
    "sinks": False,
    "alibi_slopes": False,
    "kv_dtype": None,         # = dtype
    "k_scale": 1.0,
    "v_scale": 1.0,
    "q_len_per_req": 1,
    "custom_mask": None,
    "cache_tail": None,       # None: the cores' own filling (NaN or zeros) | "nan" | "inf"
}
# What a case may put in the slots of each request's last page past its length.
CACHE_TAILS = {"nan": float("nan"), "inf": float("inf")}

# The stored formats of an fp8 KV cache. torch's casts do not all saturate (e5m2 overflows
# to inf), so quantize() clamps to the format's max first, as a KV-cache writer does.
FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CUSTOM_MASKS = ("random", "tree", "random_empty_row")
REQUIRED = ("head_dim", "num_qo_heads", "qo_lens", "kv_lens")

# Up to this much work (q.k products times q heads times head_dim: isolation.case_work, the
# measure of timeouts and case order too) a device problem keeps a CPU copy of its q, k, v for
# the reference (Problem.on_host): ~96% of the full profile's cases, each a few ms of fp64 on
# one core.
HOST_REFERENCE_WORK = 1 << 21

# Above this many q+k+v elements (all requests together) the values are drawn on the
# problem's device (draws.normal_draws) instead of by torch.randn on the CPU: 16 MiB of
# float32, a few ms to fill and copy; the largest cases (~2^28 elements) cost seconds.
DEVICE_DRAW_ELEMENTS = 1 << 22


@dataclass
class Problem:
    params: dict[str, Any]
    dtype: torch.dtype
    dtype_name: str
    device: torch.device
    q: list[torch.Tensor]          # [qo_len_i, Hq, D]
    k: list[torch.Tensor]          # [kv_len_i, Hkv, D]
    v: list[torch.Tensor]          # [kv_len_i, Hkv, Dv]
    qo_lens: list[int]
    kv_lens: list[int]
    qo_indptr: torch.Tensor        # CPU int32 [batch + 1]
    kv_indptr: torch.Tensor        # CPU int32 [batch + 1]
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_vo: int
    causal: bool
    window_left: int
    sm_scale: float
    return_lse: bool
    seed: int = 0
    # The same q, k, v on the CPU (bit for bit: the draws before they moved), kept for a
    # device problem whose reference is cheaper there; None otherwise (see on_host).
    host_qkv: tuple | None = field(default=None, repr=False)
    # Features. k and v hold what the cache stores: kv_dtype's values (fp8 bytes for an fp8
    # cache), which dequantize to k * k_scale, v * v_scale. Scales are their fp32 values,
    # the number a kernel receives. sinks / alibi_slopes: fp32 [Hq] on the CPU; custom_mask:
    # one bool [qo_len_i, kv_len_i] a request, on the CPU (True: attend).
    kv_dtype: torch.dtype | None = None
    kv_dtype_name: str = ""
    k_scale: float = 1.0
    v_scale: float = 1.0
    logits_soft_cap: float = 0.0
    sinks: torch.Tensor | None = None
    alibi_slopes: torch.Tensor | None = None
    q_len_per_req: int = 1
    custom_mask: list | None = None
    # The value the slots past each request's length in its last page hold (CACHE_TAILS), or
    # None: the cores' own filling. No token is there: the answer does not change.
    cache_tail: float | None = None

    def __post_init__(self):
        if self.kv_dtype is None:
            self.kv_dtype, self.kv_dtype_name = self.dtype, self.dtype_name

    @property
    def fp8_kv(self) -> bool:
        return self.kv_dtype_name in FP8_DTYPES

    def features(self) -> frozenset:
        """The capabilities.FEATURES names this problem uses (scales other than 1 count as
        fp8_kv: the argument that carries them is the fp8 cache's)."""
        used = set()
        if self.logits_soft_cap > 0:
            used.add("softcap")
        if self.sinks is not None:
            used.add("sinks")
        if self.alibi_slopes is not None:
            used.add("alibi")
        if self.fp8_kv or self.k_scale != 1.0 or self.v_scale != 1.0:
            used.add("fp8_kv")
        if self.q_len_per_req > 1:
            used.add("multi_token_decode")
        if self.custom_mask is not None:
            used.add("custom_mask")
        return frozenset(used)

    def custom_mask_flat(self) -> torch.Tensor:
        """The requests' masks concatenated row-major, request 0 first (a paged plan's form)."""
        parts = [m.reshape(-1) for m in self.custom_mask or ()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.bool)

    @property
    def batch_size(self) -> int:
        return len(self.qo_lens)

    def on_host(self) -> "Problem | None":
        """This problem with its q, k, v on the CPU: itself on the CPU, None when no copy was kept.

        On a GPU a small case's reference (a few dozen tiny fp64 kernels and as many
        synchronizing reads per request) costs more in launches, syncs and, with many
        worker processes on one device, context switches than the arithmetic itself; the
        CPU computes the same fp64 values from the same bits without touching the device.
        """
        if self.device.type == "cpu":
            return self
        if self.host_qkv is None:
            return None
        q, k, v = self.host_qkv
        return replace(self, device=torch.device("cpu"), q=q, k=k, v=v, host_qkv=None)

    def q_packed(self) -> torch.Tensor:
        return _cat(self.q, (self.num_qo_heads, self.head_dim), self.dtype, self.device)

    def k_packed(self) -> torch.Tensor:
        return _cat(self.k, (self.num_kv_heads, self.head_dim), self.kv_dtype, self.device)

    def v_packed(self) -> torch.Tensor:
        return _cat(self.v, (self.num_kv_heads, self.head_dim_vo), self.kv_dtype, self.device)


def _cat(parts, tail, dtype, device) -> torch.Tensor:
    if not parts:
        return torch.empty((0, *tail), dtype=dtype, device=device)
    return torch.cat(parts, dim=0)


def _bad(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"params[{key!r}] = {value!r}: {why}")


def _int(p: Mapping[str, Any], key: str, minimum: int) -> int:
    value = p[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(key, value, f"must be an int >= {minimum}")
    return value


def _bool(p: Mapping[str, Any], key: str) -> bool:
    value = p[key]
    if not isinstance(value, bool):
        raise _bad(key, value, "must be true or false")
    return value


def _lens(p: Mapping[str, Any], key: str) -> list[int]:
    value = p[key]
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in value):
        raise _bad(key, value, "must be a non-empty list of ints >= 0")
    return list(value)


def normalize(params: Mapping[str, Any]) -> dict[str, Any]:
    """params with defaults filled and every interpreted key checked.

    Raises ValueError naming the key and its value. Head counts the GQA group
    cannot divide (12 over 8, 0 kv heads) are valid here: refusing them is
    the library's job, and the cases that test that need the tensors.
    """
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a mapping, got {type(params).__name__}")
    missing = [k for k in REQUIRED if k not in params]
    if missing:
        raise ValueError(f"params: missing required key(s) {missing}; got keys {sorted(params)}")
    p = {**DEFAULTS, **params}
    if p["dtype"] not in DTYPES:
        raise _bad("dtype", p["dtype"], f"must be one of {sorted(DTYPES)}")
    _int(p, "head_dim", 1)
    _int(p, "num_qo_heads", 1)
    if p["head_dim_vo"] is None:
        p["head_dim_vo"] = p["head_dim"]
    _int(p, "head_dim_vo", 1)
    if p["num_kv_heads"] is None:
        p["num_kv_heads"] = p["num_qo_heads"]
    _int(p, "num_kv_heads", 0)
    qo, kv = _lens(p, "qo_lens"), _lens(p, "kv_lens")
    if len(qo) != len(kv):
        raise _bad("kv_lens", kv, f"must have one entry per qo_lens entry ({len(qo)})")
    p["qo_lens"], p["kv_lens"] = qo, kv
    _bool(p, "causal")
    _bool(p, "return_lse")
    _int(p, "window_left", -1)
    scale = p["sm_scale"]
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale) or scale <= 0:
            raise _bad("sm_scale", scale, "must be a finite number > 0 or null")
    if p["values"] not in VALUES:
        raise _bad("values", p["values"], f"must be one of {list(VALUES)}")
    if p["cache_tail"] is not None and p["cache_tail"] not in CACHE_TAILS:
        raise _bad("cache_tail", p["cache_tail"], f"must be one of {sorted(CACHE_TAILS)} or null")
    _features(p)
    return p


def _number(p, key: str, minimum: float, strict: bool = False) -> float:
    value = p[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < minimum or (strict and value == minimum):
        raise _bad(key, value, f"must be a finite number {'>' if strict else '>='} {minimum}")
    return float(value)


def _features(p: dict) -> None:
    _number(p, "logits_soft_cap", 0.0)
    for key in ("sinks", "alibi_slopes"):
        value = p[key]
        if isinstance(value, list):
            if len(value) != p["num_qo_heads"] or any(
                    isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                    for x in value):
                raise _bad(key, value, f"must be true, false or {p['num_qo_heads']} finite "
                                       f"numbers (one per q head)")
        elif not isinstance(value, bool):
            raise _bad(key, value, "must be true, false or a list of numbers")
    if p["kv_dtype"] is not None and p["kv_dtype"] not in FP8_DTYPES and p["kv_dtype"] != p["dtype"]:
        raise _bad("kv_dtype", p["kv_dtype"], f"must be one of {sorted(FP8_DTYPES)} or null")
    if p["kv_dtype"] in FP8_DTYPES and p["values"] == "tiny":
        # tiny scales k up by 2^124 (bf16): past every fp8 format, so every key would saturate.
        raise _bad("values", "tiny", "has no fp8 KV form")
    _number(p, "k_scale", 0.0, strict=True)
    _number(p, "v_scale", 0.0, strict=True)
    n = _int(p, "q_len_per_req", 1)
    if n > 1:
        if any(lq != n for lq in p["qo_lens"]):
            raise _bad("qo_lens", p["qo_lens"], f"must all be q_len_per_req ({n})")
        if not p["causal"]:
            raise _bad("causal", False, "multi-token decode is causal within the request: "
                                        "set causal true")
    # With causal too the problem is both masks' intersection; a library may refuse the pair.
    mask = p["custom_mask"]
    if mask is not None and mask not in CUSTOM_MASKS:
        raise _bad("custom_mask", mask, f"must be one of {list(CUSTOM_MASKS)} or null")


# ---------------------------------------------------------------- value kinds
#
# Each reshapes one request's float32 draws in place (q [L, Hq, D], k [K, Hkv, D],
# v [K, Hkv, Dv]) with elementwise operations only: no reduction whose rounding could
# depend on the machine, so the inputs stay bit-for-bit functions of (params, seed).

# The smallest normal of each dtype is 2^EMIN.
EMIN = {"fp16": -14, "bf16": -126, "fp32": -126}


def _normal(q, k, v, **_) -> None:
    """N(0, 1) as drawn."""


def large_logit_offset(r: int, kv_head: int) -> int:
    """The logit offset of request r's kv head: 96 to 192, so LSEs span ~96 to ~200."""
    return 96 + 8 * ((3 * r + 5 * kv_head) % 13)


def _large_logits(q, k, v, *, r, sm_scale, **_) -> None:
    """Every logit near 96..192, the softmax over a row still N(0, ~2)-spread.

    q[..., 0] = 1/sm_scale and k[..., 0] = T + z make a logit T + z + (the other
    dims' N(0, 1)-ish sum): exp() of any logit overflows fp32 (> 88.7), and so
    does exp() of any LSE, unless the kernel subtracts a running max and the
    merge subtracts the larger LSE. T varies with request and kv head.
    """
    q[..., 0] = 1.0 / sm_scale
    for h in range(k.shape[1]):
        k[:, h, 0] += float(large_logit_offset(r, h))


def _outlier(q, k, v, **_) -> None:
    """The middle key of the request 6x larger in k and v, and the last q head 2x larger.

    The outlier key's logit is N(0, 36) (N(0, 144) in the last head): where it is large
    it dominates the row (a running max that jumps by tens mid-stream, one split's LSE
    far above the rest) and its value row dominates the output; the last head alone has
    a sharper softmax. Logits stay below exp()'s fp32 overflow: that is large_logits.
    """
    if k.shape[0]:
        j = k.shape[0] // 2
        k[j] *= 6.0
        v[j] *= 6.0
    q[:, -1] *= 2.0


def _ties(q, k, v, **_) -> None:
    """Every query row of a request equals its first; keys repeat with period 2.

    Each row then has exactly two distinct logits, each repeated: exact ties in
    the running max, and rows that differ only by their masks.
    """
    if q.shape[0]:
        q[:] = q[:1].clone()
    if k.shape[0] > 2:
        k[2:] = k[:2].repeat((k.shape[0] + 1) // 2, 1, 1)[2:k.shape[0]]


def _tiny(q, k, v, *, dtype, **_) -> None:
    """q near the dtype's smallest normal (a fifth of it subnormal), k scaled up by as much.

    q.k, and so the softmax, is as for normal values, v is N(0, 1): a kernel that
    flushes subnormal inputs or products (FTZ/DAZ, a lossy conversion) computes
    visibly different weights, while the output stays above every absolute floor.
    """
    e = EMIN[dtype] + 2
    q.mul_(2.0 ** e)
    k.mul_(2.0 ** -e)


def _nonfinite_v(q, k, v, **_) -> None:
    """The first key's v is +inf in dim 0 and NaN in dim 1 (every kv head).

    Every row that attends to that key (softmax weight > 0: the logits are N(0, 1), so no
    weight underflows) has o = +inf in dim 0 and NaN in dim 1, exactly, in the fp64
    reference as in IEEE fp32. The first key: every causal row sees it (nonfinite_v_masked
    puts it where the mask hides it). The LSE is v-free, so finite. An fp8 cache stores
    the NaN as its NaN encoding (E4M3FN 0x7f) and saturates the inf to its max.
    """
    if k.shape[0]:
        v[0, :, 0] = float("inf")
        if v.shape[2] > 1:
            v[0, :, 1] = float("nan")


def _nonfinite_v_masked(q, k, v, **_) -> None:
    """The last key's v is +inf in dim 0 and NaN in dim 1: a causal row that does not see
    the last key must come out finite, exactly as without it. A kernel that multiplies a
    masked key's v by a zero weight (0 * inf = NaN) instead of leaving it out is caught; the
    reference leaves masked keys out of P @ V (harness/model/reference.py)."""
    if k.shape[0]:
        v[-1, :, 0] = float("inf")
        if v.shape[2] > 1:
            v[-1, :, 1] = float("nan")


def _nan_k(q, k, v, **_) -> None:
    """The last key's k is NaN in dim 0 (every kv head): its logit is NaN.

    A row that attends to it has a NaN LSE and a NaN output in every dim (NaN propagates
    through the softmax sum, as torch.logsumexp says); a row the mask keeps from it (every
    causal row but those at the bottom) must come out exactly as without it.
    """
    if k.shape[0]:
        k[-1, :, 0] = float("nan")


def _subnormal_v(q, k, v, *, dtype, **_) -> None:
    """v scaled to 2^(EMIN - 3) (fp16: deep in the subnormals, where an odd last bit times a
    v_scale of 0.5 is an exact rounding tie of the output). q and k are as drawn."""
    v.mul_(2.0 ** (EMIN[dtype] - 3))


VALUES = {"normal": _normal, "large_logits": _large_logits, "outlier": _outlier,
          "ties": _ties, "tiny": _tiny, "nonfinite_v": _nonfinite_v,
          "nonfinite_v_masked": _nonfinite_v_masked, "nan_k": _nan_k,
          "subnormal_v": _subnormal_v}


# ---------------------------------------------------------------- features
#
# Feature values come from generators of their own, seeded by (seed, salt): a case without
# features draws exactly what it drew before they existed, and adding one feature to a case
# leaves its q, k, v and every other feature's values as they were.

_SALT = {"sinks": 0x51, "alibi_slopes": 0xA1, "custom_mask": 0xC3}


def _feature_gen(seed: int, key: str) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed((int(seed) * 0x9E3779B1 + _SALT[key]) % (1 << 63))
    return gen


def draw_sinks(seed: int, num_qo_heads: int) -> torch.Tensor:
    """One sink logit a q head, N(1, 2): near the LSE of rows over tens of keys, so the sink
    takes a visible share of the denominator without swallowing the row."""
    return 1.0 + 2.0 * torch.randn(num_qo_heads, generator=_feature_gen(seed, "sinks"))


def draw_alibi_slopes(seed: int, num_qo_heads: int) -> torch.Tensor:
    """Slopes 2^-u, u uniform in [0.5, 8): the range of the standard geometric slopes, but
    drawn per head, so the heads of one GQA group differ (kv-head slopes would show)."""
    u = 0.5 + 7.5 * torch.rand(num_qo_heads, generator=_feature_gen(seed, "alibi_slopes"))
    return torch.pow(2.0, -u).to(torch.float32)


def draw_custom_masks(seed: int, kind: str, qo_lens, kv_lens) -> list[torch.Tensor]:
    """One bool [qo_len, kv_len] mask a request (True: attend).

    tree: the keys before the last qo_len are a prefix every row sees; the last qo_len keys
    are the query tokens themselves, a tree whose node t has a parent drawn below t, and row
    t sees its ancestors and itself (tree attention in speculative decoding). Nodes whose key
    position falls before 0 (qo_len > kv_len) are not in the cache: rows see what is.
    """
    gen = _feature_gen(seed, "custom_mask")
    masks = []
    for lq, lk in zip(qo_lens, kv_lens):
        if kind == "tree":
            anc = torch.zeros(lq, lq, dtype=torch.bool)
            for t in range(lq):
                anc[t, t] = True
                if t:
                    parent = int(torch.randint(0, t, (1,), generator=gen))
                    anc[t] |= anc[parent]
            m = torch.zeros(lq, lk, dtype=torch.bool)
            prefix = lk - lq
            if prefix > 0:
                m[:, :prefix] = True
            lo = max(0, -prefix)       # the first tree node with a key
            m[:, max(prefix, 0):] = anc[:, lo:]
        else:
            m = torch.rand(lq, lk, generator=gen) < 0.5
            if kind == "random_empty_row" and lq:
                m[0] = False
        masks.append(m)
    return masks


def quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 cache stores for the values x: x / scale rounded to the format, saturated
    at its max (float32 in, fp8 out)."""
    top = float(torch.finfo(dtype).max)
    return (x / scale).clamp(-top, top).to(dtype)


def _fp32(value: float) -> float:
    return float(torch.tensor(float(value), dtype=torch.float32))


def _indptr(lens: list[int]) -> torch.Tensor:
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return out


def _moved(parts: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The requests' tensors on the device, in one copy for all of them (a batch of 260
    requests would otherwise be 260 synchronizing copies a tensor kind): each request's
    tensor is then a view of its rows of one device tensor, the same bits."""
    if not parts or all(t.device == device for t in parts):
        return parts
    whole = torch.cat([t.reshape(-1) for t in parts]).to(device)
    return [chunk.view(t.shape) for chunk, t in zip(whole.split([t.numel() for t in parts]), parts)]


def build_problem(params: Mapping[str, Any], seed: int, device: torch.device | str = "cpu") -> Problem:
    p = normalize(params)
    dtype = DTYPES[p["dtype"]]
    device = torch.device(device)
    hq, hkv, d, dv = p["num_qo_heads"], p["num_kv_heads"], p["head_dim"], p["head_dim_vo"]
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    scale = p["sm_scale"]
    sm_scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)

    on_device = qkv_elements(p) > DEVICE_DRAW_ELEMENTS

    def draw(r: int, i: int, *shape: int) -> torch.Tensor:
        if on_device:     # request r's q, k, v are streams 3r, 3r + 1, 3r + 2 of the seed
            return normal_draws(int(seed), 3 * r + i, math.prod(shape), device).view(shape)
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    keep_host = device.type != "cpu" and case_work(p) <= HOST_REFERENCE_WORK
    fp8 = FP8_DTYPES.get(p["kv_dtype"])
    k_scale, v_scale = _fp32(p["k_scale"]), _fp32(p["v_scale"])
    drawn = ([], [], [])      # q, k, v of each request, cast, where they were drawn
    for r, (lq, lk) in enumerate(zip(p["qo_lens"], p["kv_lens"])):
        qr, kr, vr = draw(r, 0, lq, hq, d), draw(r, 1, lk, hkv, d), draw(r, 2, lk, hkv, dv)
        VALUES[p["values"]](qr, kr, vr, r=r, dtype=p["dtype"], sm_scale=sm_scale)
        if fp8 is not None:
            kr, vr = quantize(kr, k_scale, fp8), quantize(vr, v_scale, fp8)
        else:
            # A 16/32-bit cache holds the drawn values; k_scale / v_scale other than 1 then
            # scale them in the kernel (the reference multiplies them in too).
            kr, vr = kr.to(dtype), vr.to(dtype)
        for parts, t in zip(drawn, (qr.to(dtype), kr, vr)):
            parts.append(t)
    host = tuple([t.cpu() for t in parts] for parts in drawn) if keep_host else None
    q, k, v = (_moved(parts, device) for parts in drawn)
    return Problem(
        params=p, dtype=dtype, dtype_name=p["dtype"], device=device, q=q, k=k, v=v,
        qo_lens=list(p["qo_lens"]), kv_lens=list(p["kv_lens"]),
        qo_indptr=_indptr(p["qo_lens"]), kv_indptr=_indptr(p["kv_lens"]),
        num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_vo=dv,
        causal=p["causal"], window_left=p["window_left"],
        sm_scale=sm_scale, return_lse=p["return_lse"], seed=int(seed),
        host_qkv=host,
        kv_dtype=fp8 or dtype, kv_dtype_name=p["kv_dtype"] if fp8 is not None else p["dtype"],
        k_scale=k_scale, v_scale=v_scale, logits_soft_cap=float(p["logits_soft_cap"]),
        sinks=_per_head(p, "sinks", seed, draw_sinks),
        alibi_slopes=_per_head(p, "alibi_slopes", seed, draw_alibi_slopes),
        q_len_per_req=p["q_len_per_req"],
        custom_mask=(draw_custom_masks(seed, p["custom_mask"], p["qo_lens"], p["kv_lens"])
                     if p["custom_mask"] else None),
        cache_tail=CACHE_TAILS.get(p["cache_tail"]),
    )


def _per_head(p, key: str, seed: int, drawn) -> torch.Tensor | None:
    value = p[key]
    if value is False:
        return None
    if value is True:
        return drawn(int(seed), p["num_qo_heads"]).to(torch.float32)
    return torch.tensor([float(x) for x in value], dtype=torch.float32)
