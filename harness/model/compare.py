"""Elementwise comparison of a library's output against the reference.

An element is wrong when |got - exp| > tol, when got is NaN or inf where exp
is finite, or when exp is -inf (the LSE of a fully masked row) and got is
not. The tolerance comes from harness/model/tolerance.py (one place for the model);
this module only applies it and measures: max |diff|, wrong/total, the first
bad index and the whole-tensor relative error ||got - exp|| / ||exp||.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch
# torch is imported by the functions that compute: Comparison, Summary and summarize serve
# the table's readers too (classify, the reports), which never load it.


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_diff: float
    n_wrong: int
    n_total: int
    first_bad_index: tuple[int, ...] | None
    message: str = ""
    tolerance: float | None = None       # the absolute tolerance it was judged with
    rel_error: float | None = None       # ||got - exp|| / ||exp|| over finite exp
    baseline_error: float | None = None  # max |baseline - exp|, when a baseline was used

    @property
    def error_ratio(self) -> float | None:
        """max |diff| / tolerance: above 1 is wrong, near 1 is a near miss."""
        if self.tolerance is None or self.tolerance <= 0:
            return None
        return self.max_abs_diff / self.tolerance


def compare(got: torch.Tensor, expected: torch.Tensor, tol: float,
            baseline_error: float | None = None) -> Comparison:
    import torch
    if not tol >= 0:
        raise ValueError(f"compare: tol must be a number >= 0, got {tol!r}")
    n_total = expected.numel()
    if tuple(got.shape) != tuple(expected.shape):
        return Comparison(False, float("inf"), n_total, n_total, None,
                          f"shape {tuple(got.shape)} != expected {tuple(expected.shape)}",
                          tolerance=tol, baseline_error=baseline_error)
    exp = expected.detach().to(torch.float64)
    g = got.detach().to(device=exp.device, dtype=torch.float64)
    exp_finite = torch.isfinite(exp)
    diff = (g - exp).abs()
    wrong_finite = exp_finite & ~(diff <= tol)   # a NaN diff is wrong
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
        # nonzero() lists indices in row-major order: its first is the first wrong element
        # (torch.unravel_index would import sympy, ~0.8 CPU-s, in every process it runs in).
        first = tuple(int(i) for i in wrong.nonzero()[0])
    return Comparison(n_wrong == 0, max_abs, n_wrong, n_total, first, tolerance=tol,
                      rel_error=_rel_error(d, exp, exp_finite), baseline_error=baseline_error)


def _rel_error(d: torch.Tensor, exp: torch.Tensor, finite: torch.Tensor) -> float | None:
    import torch
    if not bool(finite.any()):
        return None
    num = float(torch.linalg.vector_norm(torch.where(finite, d, 0.0)))
    den = float(torch.linalg.vector_norm(torch.where(finite, exp, 0.0)))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


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
    tolerance: float | None = None    # the first output's (o's) tolerance
    baseline_error: float | None = None
    rel_error: float | None = None    # the first output's relative error
    error_ratio: float | None = None  # the worst max|diff| / tolerance over the outputs
    # Each output's own numbers (None when that output was not compared): o's diff is never
    # judged by lse's tolerance, nor the other way round.
    o_max_abs_diff: float | None = None
    o_tolerance: float | None = None
    o_error_ratio: float | None = None
    lse_max_abs_diff: float | None = None
    lse_tolerance: float | None = None
    lse_error_ratio: float | None = None


# The outputs that get their own columns on a row (harness/results/table.py).
PER_OUTPUT = ("o", "lse")


def per_output(pairs) -> dict:
    """{o_max_abs_diff, o_tolerance, o_error_ratio, lse_...}: each named output's own numbers,
    None for an output that was not compared."""
    out = {f"{name}_{what}": None for name in PER_OUTPUT
           for what in ("max_abs_diff", "tolerance", "error_ratio")}
    for name, c in pairs:
        if name in PER_OUTPUT and out[f"{name}_max_abs_diff"] is None:
            out[f"{name}_max_abs_diff"] = c.max_abs_diff
            out[f"{name}_tolerance"] = c.tolerance
            out[f"{name}_error_ratio"] = c.error_ratio
    return out


def summarize(comparisons: Iterable[tuple[str, Comparison]]) -> Summary:
    """Several named comparisons (o, lse) as one: summed counts, max diff, first failure,
    and each of o's and lse's own max |diff|, tolerance and ratio (per_output)."""
    pairs = list(comparisons)
    if not pairs:
        return Summary(True, None, None, None, None, "")
    max_abs = max(c.max_abs_diff for _, c in pairs)
    n_wrong = sum(c.n_wrong for _, c in pairs)
    n_total = sum(c.n_total for _, c in pairs)
    ratios = [c.error_ratio for _, c in pairs if c.error_ratio is not None]
    bad = [(name, c) for name, c in pairs if not c.ok]
    first, message = None, ""
    if bad:
        name, c = bad[0]
        first = (name, *c.first_bad_index) if c.first_bad_index is not None else (name,)
        where = f"{name}({', '.join(str(i) for i in first[1:])})" if len(first) > 1 else name
        tol = f" > tol {c.tolerance:.3g}" if c.tolerance is not None else ""
        message = f"{name} max|diff| {c.max_abs_diff:.3g}{tol}, {n_wrong}/{n_total} wrong, first at {where}"
        notes = "; ".join(f"{n}: {c.message}" for n, c in bad if c.message)
        if notes:
            message += f" ({notes})"
    head = pairs[0][1]
    return Summary(not bad, max_abs, n_wrong, n_total, first, message, tolerance=head.tolerance,
                   baseline_error=head.baseline_error, rel_error=head.rel_error,
                   error_ratio=max(ratios) if ratios else None, **per_output(pairs))


def judge(result: dict, expected: dict, baseline: dict | None, problem,
          skip: set = frozenset()) -> list:
    """(name, Comparison) for o, and for lse when the case asks for it (and the adapter
    did not declare it cannot return it: `skip`, which the row then names): what
    harness/engine/execute.py judges a case's outputs by.

    o is judged against the tolerance model's bound from the baseline;
    lse by its own natural-log tolerance (harness/model/tolerance.py).
    """
    from harness.model.tolerance import lse_tolerance, output_tolerance
    names = ["o"]
    if problem.return_lse and "lse" in expected and "lse" not in skip:
        names.append("lse")
    comparisons = []
    for name in names:
        got, exp = result.get(name), expected[name]
        if got is None:
            comparisons.append((name, missing(name, exp)))
            continue
        if name == "lse":
            comparisons.append((name, compare(got, exp, lse_tolerance(exp))))
            continue
        base = baseline.get(name) if baseline else None
        tol, base_err = output_tolerance(exp, base, problem.dtype_name, expected.get("lse"),
                                         problem.head_dim)
        comparisons.append((name, compare(got, exp, tol, base_err)))
    return comparisons
