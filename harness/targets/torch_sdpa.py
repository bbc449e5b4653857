"""torch-sdpa: torch.nn.functional.scaled_dot_product_attention, one route per backend.

Routes: "<backend>.single_prefill" and "<backend>.single_decode" for each SDPA
backend that runs on this machine's device (probed once, on a tiny input):

  sdpa_math        SDPBackend.MATH (everywhere)
  sdpa_flash       SDPBackend.FLASH_ATTENTION (CUDA, and torch's CPU flash kernel)
  sdpa_efficient   SDPBackend.EFFICIENT_ATTENTION (CUDA)
  sdpa_cudnn       SDPBackend.CUDNN_ATTENTION (CUDA)

Each call runs under torch.nn.attention.sdpa_kernel([that backend]), so a
backend that cannot take the inputs refuses instead of handing them to another.

How a case becomes a call:
  q        [L, Hq, D] passed as the [1, Hq, L, D] transpose view (no copy)
  k, v     the case's `layout`: NHD passes the transposed view of [S, Hkv, D],
           HND a contiguous [1, Hkv, S, D]
  GQA      enable_gqa=True whenever Hq != Hkv; head counts that do not divide
           go to torch as they are: its refusal is the row
  mask     bottom-right causal and sliding window (harness/model/reference.py):
           is_causal=True only where top-left and bottom-right coincide
           (L == S, no window), no mask where every kv is visible, an
           explicit boolean mask otherwise
  strided  "q", "k", "v" (stride(-1) == 2, NaN in the gaps) and "q_heads"
           are passed as the views they are; SDPA allocates its own output,
           so a case naming "out" or "lse" is skipped
  LSE      the public function returns none. Where the backend's own op
           (the one SDPA dispatches to) returns a logsumexp, a return_lse
           case first calls SDPA (its output and its input checks are what
           the row tests), then that op for the LSE; elsewhere it is skipped

A backend whose envelope excludes the inputs (dtype, head dims, an
attention mask) is asked first, on clean contiguous stand-ins of the same
shapes: torch.backends.cuda.can_use_* on CUDA, a dry run on the CPU. A case
that must match is then skipped with torch's reason, not counted as a
refusal; its adversarial layout never decides that. Cases that may or must
be refused always reach torch.
"""
from __future__ import annotations

import inspect

import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from harness.targets.descriptors import torch_sdpa as descriptor
from harness.targets.base import Skip, Target, device_platform
from harness.targets.layout import Views, to_layout

BACKENDS = {
    "sdpa_math": "MATH",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}
OPS = ("single_prefill", "single_decode")

# Params that describe a plan()/run() or a paged cache: SDPA has no analogue.
_NO_ANALOGUE = {
    "mismatch": "torch SDPA has no plan(): a run() that disagrees with it cannot be expressed",
    "scenario": "torch SDPA has no plan()/run() scripts",
    "use_cuda_graph": "torch SDPA has no CUDA-graph wrapper with caller buffers",
    "merge": "torch SDPA has no merge_state",
    "num_decodes": "torch SDPA has no mixed prefill/decode entry",
}


def _backend_enum(backend: str):
    from torch.nn.attention import SDPBackend
    return getattr(SDPBackend, BACKENDS[backend])


def bottom_right_mask(qo_len: int, kv_len: int, causal: bool, window_left: int,
                      device) -> torch.Tensor | None:
    """Bool [L, S] (True = visible), or None where every kv is visible to every row.

    Row i's diagonal is kv i + S - L: causal keeps j <= diagonal, a window
    keeps j >= diagonal - window_left.
    """
    shift = kv_len - qo_len
    keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        keep = keep.tril(diagonal=shift)
    if window_left >= 0:
        keep = keep.triu(diagonal=shift - window_left)
    return None if bool(keep.all()) else keep


def _additive(mask: torch.Tensor | None, dtype: torch.dtype, align: int = 1) -> torch.Tensor | None:
    """The boolean mask as the float bias the backends' own ops take (0 / -inf).

    align: the row stride is padded to a multiple of it, as SDPA does before
    handing a mask to the CUDA kernels (they need aligned rows).
    """
    if mask is None:
        return None
    if mask.dtype != torch.bool:      # already a float bias (ALiBi): [..., L, S]
        *lead, rows, cols = mask.shape
        padded = -(-cols // align) * align
        bias = torch.empty(*lead, rows, padded, dtype=dtype, device=mask.device)[..., :cols]
        return bias.copy_(mask)
    rows, cols = mask.shape
    padded = -(-cols // align) * align
    bias = torch.zeros(rows, padded, dtype=dtype, device=mask.device)[:, :cols]
    return bias.masked_fill_(~mask, float("-inf"))


# ------------------------------------------------------------------ the LSE ops

def _bias4d(q, mask):
    """[B, Hq, L, S] view of the aligned additive mask, the shape SDPA hands the CUDA ops."""
    bias = _additive(mask, q.dtype, 16)
    if bias is None:
        return None
    return bias.expand(q.shape[0], q.shape[1], *bias.shape[-2:])


def _lse_cpu_flash(q, k, v, mask, is_causal, scale):
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=_additive(mask, q.dtype), scale=scale)
    return lse


def _heads_of(q, k, v):
    """k, v with q's head count: the CUDA ops take no GQA group (SDPA expands for them too)."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _lse_cuda_flash(q, k, v, mask, is_causal, scale):
    if mask is not None:
        raise Skip("the flash op takes no attention mask")
    k, v = _heads_of(q, k, v)
    return torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, is_causal, False, scale=scale)[1]


def _lse_efficient(q, k, v, mask, is_causal, scale):
    k, v = _heads_of(q, k, v)
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, _bias4d(q, mask), True, 0.0, is_causal, scale=scale)[1]


def _lse_cudnn(q, k, v, mask, is_causal, scale):
    k, v = _heads_of(q, k, v)
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, _bias4d(q, mask), True, 0.0, is_causal, False, scale=scale)[1]


def _lse_op(backend: str, device: torch.device) -> Callable | None:
    if backend == "sdpa_flash":
        return _lse_cpu_flash if device.type == "cpu" else _lse_cuda_flash
    if device.type == "cuda":
        return {"sdpa_efficient": _lse_efficient, "sdpa_cudnn": _lse_cudnn}.get(backend)
    return None


def _lse_rows(lse: torch.Tensor, qo_len: int, heads: int) -> torch.Tensor:
    """[L, Hq] from an op's [1, Hq, L'] / [1, Hq, L', 1] logsumexp (L' may be padded)."""
    return lse.reshape(heads, -1)[:, :qo_len].transpose(0, 1).float()


# ------------------------------------------------------------------ envelope

_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")


def _reasons(said) -> list[str]:
    """torch's warnings as reasons, without source locations and empty preambles."""
    out = []
    for w in said:
        text = _TRIGGERED.sub("", str(w.message)).strip()
        if text and not text.endswith("because:") and text not in out:
            out.append(text)
    return out


_CAN_USE = {"sdpa_flash": "can_use_flash_attention",
            "sdpa_efficient": "can_use_efficient_attention",
            "sdpa_cudnn": "can_use_cudnn_attention"}


def envelope_refusal(backend: str, device: torch.device, dtype, hq: int, hkv: int,
                     d: int, dv: int, qo_len: int, kv_len: int, mask, is_causal: bool) -> str | None:
    """torch's own reason why this backend cannot take inputs of this kind, or None.

    Asked on clean, contiguous stand-ins of the case's shape, so an
    adversarial layout (strides, an odd head count) never turns into a skip.
    """
    if backend == "sdpa_math":
        return None
    gqa = hq != hkv and hkv > 0 and hq % hkv == 0
    hkv = hkv if gqa else hq

    def blank(h, n, e):
        return torch.zeros(1, h, max(n, 1), e, dtype=dtype, device=device)

    q, k, v = blank(hq, qo_len, d), blank(hkv, kv_len, d), blank(hkv, kv_len, dv)
    if device.type != "cuda":
        # No can_use_* for the CPU kernels: a dry run on the blanks answers the same.
        try:
            _call_sdpa(backend, q, k, v, mask, is_causal, None, gqa)
        except RuntimeError as error:
            return f"{backend} cannot take these inputs ({error})"
        return None
    from torch.backends import cuda as tbc
    can_use = getattr(tbc, _CAN_USE.get(backend, ""), None)
    if can_use is None:
        return None
    params = tbc.SDPAParams(q, k, v, mask, 0.0, is_causal, gqa)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ok = can_use(params, True)
    if ok:
        return None
    why = " | ".join(_reasons(said)) or "no reason given"
    return f"{backend} cannot take these inputs (torch: {why})"


# ------------------------------------------------------------------ the target

@dataclass
class SdpaTarget(Target):
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backends: tuple[str, ...] = ("sdpa_math",)
    probe_notes: dict = field(default_factory=dict)
    name: str = "torch-sdpa"
    # No out= buffer, no plan(): the LSE comes from each backend's own op where it has one.
    # Of the features only ALiBi has SDPA's form, an additive float mask; a soft cap is a
    # function of the logits (no bias can be it) and a sink is no key's.
    capabilities = descriptor.CAPABILITIES
    signature = descriptor.SIGNATURE

    @property
    def routes(self) -> tuple[str, ...]:
        return tuple(f"{b}.{op}" for b in self.backends for op in OPS)

    def version(self) -> str:
        return torch.__version__

    def platform(self) -> str:
        return device_platform(self.device)

    def run(self, case, problem, buffers) -> Mapping[str, torch.Tensor]:
        backend, op = case.backend, case.op
        if backend not in self.backends or op not in OPS:
            raise Skip(f"torch-sdpa has no route {case.route!r} on this machine "
                       f"(routes: {', '.join(self.routes)})")
        for key, why in _NO_ANALOGUE.items():
            if case.params.get(key) is not None:
                raise Skip(why)
        p = problem
        if p.batch_size != 1:
            raise Skip("SDPA here takes one request (single prefill/decode)")
        if op == "single_decode" and p.qo_lens[0] != 1:
            raise Skip("single decode takes one query token")

        layout = case.params.get("layout", "NHD")
        views = Views(case.params, buffers)
        if op == "single_decode":
            q = views.input("q", p.q[0][0].contiguous()).unsqueeze(1)     # [Hq, 1, D]
        else:
            q = views.input("q", p.q[0].contiguous()).transpose(0, 1)     # [Hq, L, D]
        k = views.input("k", to_layout(p.k[0], layout))
        v = views.input("v", to_layout(p.v[0], layout))
        if layout == "NHD":
            k, v = k.transpose(0, 1), v.transpose(0, 1)                   # [Hkv, S, D]
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        views.check_used()

        qo_len, kv_len = p.qo_lens[0], p.kv_lens[0]
        mask = bottom_right_mask(qo_len, kv_len, p.causal, p.window_left, p.device)
        is_causal = mask is not None and qo_len == kv_len and p.window_left < 0
        if is_causal:
            mask = None
        if case.params.get("alibi_slopes") not in (None, False):
            mask, is_causal = alibi_bias(p, mask, is_causal), False
        if case.expect == "match":
            why = envelope_refusal(backend, p.device, p.dtype, p.num_qo_heads, p.num_kv_heads,
                                   p.head_dim, p.head_dim_vo, qo_len, kv_len, mask, is_causal)
            if why:
                raise Skip(why)
        lse_op = _lse_op(backend, p.device) if p.return_lse else None

        scale = case.params.get("sm_scale")
        scale = None if scale is None else float(scale)
        gqa = p.num_qo_heads != p.num_kv_heads
        buffers.stage("run")
        o = _call_sdpa(backend, q, k, v, mask, is_causal, scale, gqa)
        result = {"o": o[0].transpose(0, 1)}                                # [L, Hq, Dv]
        if not p.return_lse:
            return result
        # Head counts no GQA group divides have no reference, and a must-refuse
        # case that ran fails whatever its LSE: the public call alone decides
        # those rows (the backend's private op, which skips the public checks,
        # must not), and their values compare the output only.
        divides = p.num_kv_heads > 0 and p.num_qo_heads % p.num_kv_heads == 0
        if not divides:
            return result
        if case.expect == "refuse":
            from harness.model.reference import attention_reference
            result["expected"] = {"o": attention_reference(p)["o"]}
            return result
        if lse_op is None:
            # The output is judged; the row says the LSE could not be (a declared gap,
            # not an inferred one).
            result["not_returned"] = {"lse": f"torch SDPA returns no LSE, and {backend} has "
                                             "no op that does"}
            return result
        buffers.stage("lse")
        lse = lse_op(q, k, v, mask, is_causal, scale)
        result["lse"] = _lse_rows(lse, qo_len, p.num_qo_heads)
        return result

    def standalone_source(self, case) -> str | None:
        """`def call(inputs) -> dict` for the standalone script (Target.standalone_source)."""
        for key, why in _NO_ANALOGUE.items():
            if case.params.get(key) is not None:
                raise Skip(why)
        if case.backend not in self.backends or case.op not in OPS:
            raise Skip(f"torch-sdpa has no route {case.route!r} on this machine")
        return standalone_call_source(case, self.device)


def alibi_bias(p, mask, is_causal: bool) -> torch.Tensor:
    """ALiBi as SDPA's additive float mask [1, Hq, L, S]: slope[h] * (j - pos_i), pos_i
    bottom-right aligned as causal is, -inf where the boolean mask hides a key.

    SDPA takes a float mask only in q's dtype: in fp16 / bf16 the bias itself is rounded
    (|slope * distance| ~ 30 moves by ~0.06, far past any tolerance), so only fp32 has a
    faithful form; the others are skipped, naming why."""
    if p.dtype != torch.float32:
        raise Skip(f"ALiBi reaches SDPA only as a float mask in q's dtype ({p.dtype_name}), "
                   f"which rounds the bias itself")
    qo_len, kv_len = p.qo_lens[0], p.kv_lens[0]
    if is_causal:
        mask = bottom_right_mask(qo_len, kv_len, True, -1, p.device)
    i = torch.arange(qo_len, device=p.device, dtype=torch.float32).unsqueeze(1)
    j = torch.arange(kv_len, device=p.device, dtype=torch.float32).unsqueeze(0)
    dist = j - (i + (kv_len - qo_len))
    slopes = p.alibi_slopes.to(device=p.device, dtype=torch.float32).view(-1, 1, 1)
    bias = slopes * dist
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    return bias.unsqueeze(0).to(p.dtype)


def _call_sdpa(backend, q, k, v, mask, is_causal, scale, gqa) -> torch.Tensor:
    """SDPA under one backend; a refusal carries the reasons torch gave as warnings.

    torch raises a bare "No available kernel" and says why in warnings
    (strides, head counts, dtype); the row's message needs the why.
    """
    from torch.nn.attention import sdpa_kernel
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([_backend_enum(backend)]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                      is_causal=is_causal, scale=scale,
                                                      enable_gqa=gqa)
        except RuntimeError as error:
            reasons = _reasons(said)
            if not reasons:
                raise
            raise type(error)(f"{error} (torch warned: {' | '.join(reasons)})") from error


def _probe(backend: str, device: torch.device) -> str | None:
    """None when the backend runs a tiny problem here, else why not."""
    from torch.nn.attention import sdpa_kernel
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    q = torch.zeros(1, 2, 4, 64, dtype=dtype, device=device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with sdpa_kernel([_backend_enum(backend)]):
                F.scaled_dot_product_attention(q, q, q)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as error:  # noqa: BLE001 - any failure means the backend is absent
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def make_target(device: torch.device | str | None = None) -> SdpaTarget:
    from harness.model import platform_info
    device = torch.device(device) if device is not None else platform_info.device()
    have, notes = [], {}
    for backend in BACKENDS:
        why = _probe(backend, device)
        if why is None:
            have.append(backend)
        else:
            notes[backend] = why
    return SdpaTarget(device=device, backends=tuple(have), probe_notes=notes)


# ------------------------------------------------------------------ standalone scripts
#
# The same calls as SdpaTarget.run, written out for `harness repro CASE --standalone`: the
# script needs torch alone, so whoever reads it reads exactly what SDPA was handed.

_STANDALONE_LSE_OPS = {_lse_cpu_flash: "cpu_flash", _lse_cuda_flash: "cuda_flash",
                       _lse_efficient: "efficient", _lse_cudnn: "cudnn"}


def standalone_call_source(case, device) -> str:
    """`def call(inputs) -> dict` for this case, as SdpaTarget.run makes its calls."""
    import pprint
    from harness.model.problem import normalize
    p = normalize(case.params)
    hq, hkv = p["num_qo_heads"], p["num_kv_heads"]
    lse_op = _lse_op(case.backend, torch.device(device)) if p["return_lse"] else None
    cfg = {"op": case.op, "backend": case.backend, "layout": case.params.get("layout", "NHD"),
           "strided": case.params.get("strided"), "causal": p["causal"],
           "window_left": p["window_left"], "sm_scale": case.params.get("sm_scale"),
           "return_lse": p["return_lse"],
           # The LSE comes from the backend's own op only where the harness asks it for one.
           "lse_op": (_STANDALONE_LSE_OPS.get(lse_op)
                      if lse_op is not None and hkv > 0 and hq % hkv == 0
                      and case.expect != "refuse" else None)}
    if case.params.get("alibi_slopes") not in (None, False):
        from harness.model.problem import build_problem
        prob = build_problem(case.params, case.seed, "cpu")
        alibi_bias(prob, None, False)      # its Skip (a dtype it cannot carry) here, not there
        cfg["alibi"] = {"slopes": [float(x) for x in prob.alibi_slopes],   # fp32, exact
                        "qo_lens": prob.qo_lens, "kv_lens": prob.kv_lens,
                        "dtype_name": prob.dtype_name}
    else:
        cfg["alibi"] = None
    text = pprint.pformat(cfg, width=96, compact=True)
    # The adapter's own helpers, verbatim: the mask, the SDPA call (its refusal carries the
    # reasons torch warned, as the row's message does) and the LSE ops.
    shared = "\n\n\n".join(inspect.getsource(f).rstrip() for f in _STANDALONE_SHARED)
    ops = "{" + ", ".join(f"{name!r}: {f.__name__}" for f, name in _STANDALONE_LSE_OPS.items()) + "}"
    return (f"import re\nimport warnings\n\nimport torch.nn.functional as F\n\n"
            f"CFG = {text}\nBACKENDS = {BACKENDS!r}\n_TRIGGERED = re.compile({_TRIGGERED.pattern!r})\n\n\n"
            f"class Skip(Exception):\n    \"\"\"The harness's 'this route cannot express the case'.\"\"\"\n\n\n"
            f"{shared}\n\n\nLSE_OPS = {ops}\n\n{_STANDALONE_CALL}")


_STANDALONE_SHARED = (_backend_enum, _reasons, _call_sdpa, bottom_right_mask, _additive, _bias4d,
                      _heads_of, _lse_cpu_flash, _lse_cuda_flash, _lse_efficient, _lse_cudnn,
                      _lse_rows, alibi_bias)


_STANDALONE_CALL = '''
class AlibiProblem:
    """The fields of the harness's Problem that alibi_bias reads."""

    def __init__(self, q):
        self.dtype, self.device = q.dtype, q.device
        self.dtype_name = CFG["alibi"]["dtype_name"]
        self.qo_lens, self.kv_lens = CFG["alibi"]["qo_lens"], CFG["alibi"]["kv_lens"]
        self.alibi_slopes = torch.tensor(CFG["alibi"]["slopes"], dtype=torch.float32)


def _passed(name, t):
    """The tensor as the case hands it over: a view whose hidden slots hold NaN."""
    if CFG["strided"] == name:                        # stride(-1) == 2
        view = torch.full((*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype,
                          device=t.device)[..., ::2]
        view.copy_(t)
        return view
    if CFG["strided"] == name + "_heads":             # [rows, H, D] cut from [rows, H + 1, D]
        t3 = t if t.dim() == 3 else t.unsqueeze(1)
        view = torch.full((t3.shape[0], t3.shape[1] + 1, t3.shape[2]), float("nan"),
                          dtype=t.dtype, device=t.device)[:, :t3.shape[1]]
        view.copy_(t3)
        return view if t.dim() == 3 else view.squeeze(1)
    return t


def _layout(t):
    return t.contiguous() if CFG["layout"] == "NHD" else t.transpose(0, 1).contiguous()


def call(inputs):
    """SDPA under one backend; outputs in the logical layout [rows, heads, dim]."""
    qs, ks, vs = inputs["q"], inputs["k"], inputs["v"]
    if CFG["op"] == "single_decode":
        q = _passed("q", qs[0][0].contiguous()).unsqueeze(1)          # [Hq, 1, D]
    else:
        q = _passed("q", qs[0].contiguous()).transpose(0, 1)          # [Hq, L, D]
    k, v = _passed("k", _layout(ks[0])), _passed("v", _layout(vs[0]))
    if CFG["layout"] == "NHD":
        k, v = k.transpose(0, 1), v.transpose(0, 1)                   # [Hkv, S, D]
    q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    qo_len, kv_len = q.shape[2], k.shape[2]
    mask = bottom_right_mask(qo_len, kv_len, CFG["causal"], CFG["window_left"], q.device)
    is_causal = mask is not None and qo_len == kv_len and CFG["window_left"] < 0
    if is_causal:
        mask = None
    if CFG["alibi"]:
        mask, is_causal = alibi_bias(AlibiProblem(q), mask, is_causal), False
    scale = None if CFG["sm_scale"] is None else float(CFG["sm_scale"])
    o = _call_sdpa(CFG["backend"], q, k, v, mask, is_causal, scale, q.shape[1] != k.shape[1])
    result = {"o": o[0].transpose(0, 1)}
    if CFG["lse_op"]:
        lse = LSE_OPS[CFG["lse_op"]](q, k, v, mask, is_causal, scale)
        result["lse"] = _lse_rows(lse, qo_len, q.shape[1])
    return result
'''
