"""Several attempts of one case, as one verdict that never launders a failure.

Attempts come from `--repeat N` (the same case N times in one worker, fresh
buffers, the same inputs) and from reruns of a failing case. Every attempt is
recorded on the row. The row passes only when every attempt passes; attempts
whose outcomes differ, or whose answers differ in a single bit, make the row
`nondeterministic` (a correctness failure), naming what differed.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch


def attempt_record(outcome: str, passed: bool, max_abs_diff=None) -> dict:
    return {"outcome": outcome, "pass": bool(passed), "max_abs_diff": max_abs_diff}


def _fmt(record: dict) -> str:
    diff = record.get("max_abs_diff")
    tail = f" (max|diff| {diff:.3g})" if isinstance(diff, (int, float)) and diff == diff else ""
    return f"{record['outcome']}{tail}"


# An attempt the harness itself failed (its allocation ran out of memory, its set-up raised)
# never made the library's call, so attempts that disagree because of it say nothing about the
# library: the row is ours, never the library's `nondeterministic`.
OURS = "harness_error"


def ours(records: Sequence[dict]) -> int | None:
    """The index of the first attempt the harness failed itself, or None."""
    return next((i for i, r in enumerate(records) if r.get("outcome") == OURS), None)


def disagreement(records: Sequence[dict]) -> str | None:
    """The first pair of attempts whose outcomes differ, in words; None when they agree."""
    first = records[0]
    for i, other in enumerate(records[1:], 2):
        if other["outcome"] != first["outcome"]:
            return f"attempts disagree: attempt 1 {_fmt(first)}, attempt {i} {_fmt(other)}"
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    import torch
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype.itemsize else t


def answers_differ(a: dict, b: dict) -> str | None:
    """How two attempts' returned tensors differ bitwise; None when identical."""
    import torch   # here: the controller combines rows only, and never loads torch for it
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            return f"{name} returned by one attempt only"
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{name} is {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}"
        if not torch.equal(_bits(x), _bits(y)):
            d = (x.double() - y.double()).abs()
            both_nan = torch.isnan(x.double()) & torch.isnan(y.double())
            d = torch.where(both_nan, 0.0, torch.nan_to_num(d, nan=float("inf")))
            n = int((_bits(x).view(-1, x.element_size()) != _bits(y).view(-1, y.element_size()))
                    .any(dim=1).sum())
            return (f"{name} differs bitwise between attempts: {n}/{x.numel()} elements, "
                    f"max |diff| {float(d.max()):.3g}")
    return None


def combine_results(results: Sequence):
    """One CaseResult from N repeats of execute_case (harness/engine/execute.py)."""
    first = results[0]
    records = [attempt_record(r.outcome, r.passed, r.max_abs_diff) for r in results]
    mine = ours(records)
    if mine is not None and len(records) > 1:
        theirs = [r for r in results if r.outcome != OURS]
        if theirs and not all(r.passed for r in theirs):
            # The library's own attempts failed: that is its verdict, judged among them.
            row, _ = combine_results(theirs)
            return replace(row, message=f"{row.message}; {len(results) - len(theirs)} other "
                                        f"attempt(s) were the harness's own failure"), records
        bad = results[mine]
        return replace(bad, passed=False, message=(
            f"attempt {mine + 1} of {len(records)} was the harness's own failure (the case "
            f"was not fully performed): {bad.message}")), records
    why = disagreement(records)
    if why is None:
        for i, other in enumerate(results[1:], 2):
            differ = answers_differ(first.outputs, other.outputs)
            if differ:
                why = f"attempt 1 and attempt {i} both {first.outcome}, but {differ}"
                break
    if why is None:
        return replace(first, passed=all(r.passed for r in results)), records
    return replace(first, outcome="nondeterministic", passed=False,
                   message=f"{why}" + (f"; attempt 1: {first.message}" if first.message else "")
                   ), records


def combine_rows(prior: Sequence[dict], final: dict) -> dict:
    """The final row of a case that was rerun, judged over every attempt.

    prior: the rows of earlier attempts (each with its own `attempts`). Any
    failing attempt fails the row; different outcomes make it nondeterministic.
    """
    records = [rec for row in prior for rec in (row.get("attempts") or [
        attempt_record(row.get("outcome", "?"), row.get("pass", False), row.get("max_abs_diff"))])]
    records += final.get("attempts") or [
        attempt_record(final["outcome"], final.get("pass", False), final.get("max_abs_diff"))]
    row = dict(final, attempts=records)
    row["pass"] = bool(final.get("pass")) and all(r["pass"] for r in records)
    mine = ours(records)
    if mine is not None and final.get("outcome") != OURS:
        theirs = [r for r in records if r.get("outcome") != OURS]
        if all(r["pass"] for r in theirs):
            # Every attempt the library made passed, but one was never made: not a pass.
            row["outcome"], row["pass"] = OURS, False
            row["message"] = (f"attempt {mine + 1} of {len(records)} was the harness's own "
                              f"failure (the case was not fully performed)"
                              + (f"; last attempt: {final['message']}" if final.get("message") else ""))
            return row
        records = theirs   # the library's failing attempts are judged among themselves
    why = disagreement(records)
    if why is not None and final.get("outcome") != "nondeterministic":
        row["outcome"] = "nondeterministic"
        row["message"] = why + (f"; last attempt: {final['message']}" if final.get("message") else "")
        row["pass"] = False
    return row
