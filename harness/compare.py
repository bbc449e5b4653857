"""Elementwise comparison of a library's output against the reference.

An element is wrong when |got - exp| > atol + rtol * |exp|, when got is NaN
or inf where exp is finite, or when exp is -inf (the LSE of a fully masked
row) and got is not.

Tolerances. Both sides start from the same rounded inputs, so input rounding
cancels; what is left is the library's own rounding and accumulation. With u
the unit roundoff, one ulp of x is at most 2u|x|, so any rtol >= 2u accepts a
correctly rounded output that lands one ulp off.
- bf16: u = 2^-8 ~ 3.9e-3. FA2-style kernels round the softmax weights P to
  bf16 before P @ V, one more relative error u per term, and round the
  output once more: ~2.5u ~ 1e-2. atol 1e-2 covers outputs near 0, which
  are sums of terms of either sign whose relative error is unbounded. A
  real defect (wrong mask, wrong head, skipped loop) moves outputs by ~0.1
  to 1 with N(0, 1) values.
- fp16: u = 2^-11 ~ 4.9e-4: the same argument gives ~2u ~ 1e-3.
- fp32: u = 2^-24 ~ 6e-8, but the error of a length-n float32 sum grows
  like n*u in the worst case and sqrt(n)*u typically, plus a few ulp from
  fast exp/exp2 in the kernels: 1e-4 covers n*u up to n ~ 1600 and
  sqrt(n)*u for any practical kv length, and is still 100x below the
  smallest defect we look for (a silent bf16 round trip is ~4e-3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

TOLERANCES = {
    "fp32": (1e-4, 1e-4),
    "fp16": (1e-3, 1e-3),
    "bf16": (1e-2, 1e-2),
}


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    n_wrong: int
    n_total: int
    first_bad_index: tuple[int, ...] | None
    message: str = ""


def compare(got: torch.Tensor, expected: torch.Tensor, dtype_name: str) -> Comparison:
    if dtype_name not in TOLERANCES:
        raise ValueError(f"compare: dtype_name {dtype_name!r} is not one of {sorted(TOLERANCES)}")
    rtol, atol = TOLERANCES[dtype_name]
    n_total = expected.numel()
    if tuple(got.shape) != tuple(expected.shape):
        return Comparison(False, float("inf"), n_total, n_total, None,
                          f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}")
    exp = expected.detach().to(torch.float64)
    g = got.detach().to(device=exp.device, dtype=torch.float64)
    exp_finite = torch.isfinite(exp)
    diff = (g - exp).abs()
    wrong_finite = exp_finite & ~(diff <= atol + rtol * exp.abs())   # NaN diff is wrong
    # Non-finite expectations (-inf LSE of a masked row) must be met exactly.
    wrong_other = ~exp_finite & ~((g == exp) | (torch.isnan(g) & torch.isnan(exp)))
    wrong = wrong_finite | wrong_other
    n_wrong = int(wrong.sum())
    # Over pairs where exp is finite, a NaN/inf got counts as inf; a non-finite
    # exp contributes 0 when met and inf when not.
    d = torch.where(exp_finite, torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf")),
                    torch.where(wrong_other, float("inf"), 0.0))
    max_abs = float(d.max()) if n_total else 0.0
    first = None
    if n_wrong:
        flat = int(wrong.flatten().nonzero()[0])
        first = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(exp.shape)))
    return Comparison(n_wrong == 0, max_abs, n_wrong, n_total, first)


def missing(name: str, expected: torch.Tensor) -> Comparison:
    """The comparison of an output the library should have returned and did not."""
    n = expected.numel()
    return Comparison(False, float("inf"), n, n, None, f"{name} was not returned")


@dataclass(frozen=True)
class Summary:
    ok: bool
    max_abs_diff: float | None
    n_wrong: int | None
    n_total: int | None
    first_bad_index: tuple | None     # ("o", 3, 1, 7): the output's name, then the index
    message: str


def summarize(comparisons: Iterable[tuple[str, Comparison]]) -> Summary:
    """Several named comparisons (o, lse) as one: summed counts, max diff, first failure."""
    pairs = list(comparisons)
    if not pairs:
        return Summary(True, None, None, None, None, "")
    max_abs = max(c.max_abs_diff for _, c in pairs)
    n_wrong = sum(c.n_wrong for _, c in pairs)
    n_total = sum(c.n_total for _, c in pairs)
    bad = [(name, c) for name, c in pairs if not c.ok]
    first, message = None, ""
    if bad:
        name, c = bad[0]
        first = (name, *c.first_bad_index) if c.first_bad_index is not None else (name,)
        where = f"{name}({', '.join(str(i) for i in first[1:])})" if len(first) > 1 else name
        message = f"max|diff| {max_abs:.3g}, {n_wrong}/{n_total} wrong, first at {where}"
        notes = "; ".join(f"{n}: {c.message}" for n, c in bad if c.message)
        if notes:
            message += f" ({notes})"
    return Summary(not bad, max_abs, n_wrong, n_total, first, message)
