"""The tolerance model, in one place: how far an answer may be from the reference.

Output. A library's output is compared with the fp64 reference. Its error may
be at most K times the error of the *same computation done by PyTorch in the
input dtype* (reference.attention_baseline: q @ k^T, the softmax weights and
P @ V each rounded to the dtype, as an unfused kernel would), plus a floor:

    tolerance = K * max|baseline - reference|
                + (ULPS[dtype] * ulp(dtype) + LOGIT_ULPS * sqrt(D) * ulp(fp32) * max|LSE|)
                  * max|reference|
                + tiny(dtype)

so the bound grows with the problem's real difficulty (long contexts, large
logits, outliers) and with nothing else. K = 3: FlashAttention's tests take 2
for a fused kernel against an unfused baseline; 3 leaves room for a kernel
that rounds P before P @ V and for a baseline whose rounding happens to be
kind on one small tensor, and is still far below what a defect moves (a
dropped key, a causal off-by-one, a wrong head: tests/test_tolerance.py).
The floor is a few ulps of the tensor's largest entry plus the dtype's
smallest normal (outputs near underflow). In fp16 and bf16 one ulp: rounding
the output to the dtype dominates every kernel's error, and a correctly
rounded output may land an ulp away whatever the baseline did. In fp32 the
output rounding is negligible and what remains is accumulation order: a
fused kernel's online softmax rescales its running sums once per kv tile,
which an unfused baseline never does; measured on the host kernels at up to
5 ulps over 129 keys, so 16 ulps (2e-6 of the output's scale) -- still 2,000
times below a silent bf16 round trip, the smallest fp32 defect we look for.
The LSE term is the logits' own precision: every kernel computes q . k in
fp32, summing D products one after another, so a logit of magnitude |s| is
good to about sqrt(D) ulps of |s| (a blocked BLAS matmul, the baseline's,
does better), and each softmax weight moves by that much relative. It is
negligible at ordinary scales (|LSE| ~ 10, D 128: 3e-5 of the output's
scale) and dominates at large logits, where a right fp32 kernel on the H200
(D 256, |LSE| ~ 150) landed at 5-6x the baseline's error. An element is wrong when |got - ref| exceeds
the tolerance, or when got is NaN/inf where the reference is finite.

Features (reference.py). None adds a term of its own. A soft cap, ALiBi and sinks change
the logits and the denominator, and the baseline computes them as a kernel does (fp32
tanh, fp32 bias, the sink in the fp32 sum), so their rounding is in K x the baseline's
error; a large |LSE| from them is in the logit term. An fp8 KV cache's quantization is the
problem's, not the library's: the reference and the baseline both dequantize the exact
stored bytes (stored * scale, the baseline in fp32 as a kernel does), so what is left for
the library is the same fp32 accumulation and output rounding as for a 16-bit cache, and
the bound stays that tight: an answer computed from the values before quantization is
several bounds away (tests/test_features_model.py).

LSE. Every library returns it in fp32 whatever the output dtype, and it is
not rounded to the dtype, so it has its own absolute tolerance in
natural-log units: LSE_ATOL, plus a few fp32 ulps of its magnitude (an LSE of
200 is only representable to 1.5e-5). A row that attends to nothing has
LSE -inf, which must be met exactly.
"""
from __future__ import annotations

import math

import torch

K = 3.0
LOGIT_ULPS = 2.0
ULPS = {"fp32": 16.0, "fp16": 0.5, "bf16": 0.5}
LSE_ATOL = 1e-3
LSE_ULPS = 4.0

# Unit in the last place at 1.0 (2 x unit roundoff) and the smallest normal.
_ULP = {"fp32": 2.0 ** -23, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}
_TINY = {"fp32": torch.finfo(torch.float32).tiny, "fp16": torch.finfo(torch.float16).tiny,
         "bf16": torch.finfo(torch.bfloat16).tiny}
DTYPES = tuple(_ULP)


def _finite_max(t: torch.Tensor) -> float:
    t = t.detach().to(torch.float64)
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def baseline_error(baseline: torch.Tensor, reference: torch.Tensor) -> float:
    """max |baseline - reference| over entries where the reference is finite."""
    ref = reference.detach().to(torch.float64)
    base = baseline.detach().to(device=ref.device, dtype=torch.float64)
    finite = torch.isfinite(ref)
    if not bool(finite.any()):
        return 0.0
    diff = (base - ref)[finite].abs()
    # A baseline that overflows where the reference does not is as far off as it gets;
    # its error must not turn into a NaN that makes every answer pass or fail.
    diff = torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf"))
    return float(diff.max())


def output_tolerance(reference: torch.Tensor, baseline: torch.Tensor | None,
                     dtype_name: str, lse: torch.Tensor | None = None,
                     head_dim: int = 1) -> tuple[float, float | None]:
    """(absolute tolerance, baseline error) for an output of `dtype_name`.

    Without a baseline (an adapter that computed its own expected values and
    none in the dtype) only the floor applies: stricter, never looser.
    """
    if dtype_name not in _ULP:
        raise ValueError(f"tolerance: dtype_name {dtype_name!r} is not one of {list(DTYPES)}")
    logits = LOGIT_ULPS * math.sqrt(head_dim) * _ULP["fp32"] * (
        _finite_max(lse) if lse is not None else 0.0)
    floor = (ULPS[dtype_name] * _ULP[dtype_name] + logits) * _finite_max(reference) \
        + _TINY[dtype_name]
    if baseline is None:
        return floor, None
    base_err = baseline_error(baseline, reference)
    if base_err == float("inf"):
        # The dtype cannot represent this computation at all (its baseline
        # overflowed): judge by the floor, i.e. as if the library had to be exact
        # to an ulp; a library that computes it right in higher precision passes.
        return floor, base_err
    return K * base_err + floor, base_err


def lse_tolerance(reference: torch.Tensor) -> float:
    return LSE_ATOL + LSE_ULPS * 2.0 ** -23 * _finite_max(reference)
