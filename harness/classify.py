"""One outcome per case, from what happened when it ran.

Precedence, first rule that applies:
  skipped            the adapter cannot express the case (passes)
  corrupt            a canary band or an input changed, whatever else happened
  refused            the library raised; `unexpected_refusal` when the case
                     does not allow a refusal. A refusal whose message lacks
                     one of case.refuse_words keeps the outcome but fails.
  silent             the case must be refused, the library ran, and its answer
                     cannot be judged: there is no reference, or the case marks
                     its answer undefined (params["undefined_answer"]: run()
                     tensors that disagree with plan() have no right answer)
  wrong              an output differs from the reference beyond tolerance
                     (a must-refuse input with a defined answer, such as a
                     strided view, is judged by its values too: a quiet wrong
                     answer is the worst finding there is)
  match              a must-refuse input computed right still fails its row,
                     with a message saying so
crash and hang are decided outside the worker (it died or stopped
answering); crash_verdict and hang_verdict build those rows.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Iterable

from harness.case import Case
from harness.compare import Comparison, summarize

OUTCOMES = ("match", "refused", "wrong", "silent", "corrupt", "crash", "hang",
            "unexpected_refusal", "skipped")

_MAX_ERROR_TEXT = 300


@dataclass(frozen=True)
class Verdict:
    outcome: str
    passed: bool
    message: str


def _named(comparisons) -> list[tuple[str, Comparison]]:
    """Accept a mapping, (name, Comparison) pairs, or bare Comparisons."""
    if isinstance(comparisons, dict):
        return list(comparisons.items())
    out = []
    for i, item in enumerate(comparisons):
        if isinstance(item, Comparison):
            out.append(("o" if i == 0 else f"out{i}", item))
        else:
            out.append(tuple(item))
    return out


def error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT - 3] + "..."


def _verdict(case: Case, outcome: str, message: str) -> Verdict:
    return Verdict(outcome, outcome in case.allowed(), message)


def classify(case: Case, *, error: BaseException | None = None,
             comparisons: Iterable = (), corruption: Iterable[str] = (),
             skip_reason: str | None = None) -> Verdict:
    if skip_reason is not None:
        return Verdict("skipped", True, skip_reason)
    corruption = list(corruption)
    if corruption:
        return _verdict(case, "corrupt", "; ".join(corruption))
    if error is not None:
        text = error_text(error)
        if "refused" not in case.allowed():
            return _verdict(case, "unexpected_refusal", text)
        said = str(error).lower()
        missing = [w for w in case.refuse_words if w.lower() not in said]
        if missing:
            return Verdict("refused", False,
                           f"refusal does not name {', '.join(repr(w) for w in missing)}: {text}")
        return _verdict(case, "refused", text)
    summary = summarize(_named(comparisons))
    if case.expect == "refuse" and (summary.n_total is None or case.params.get("undefined_answer")):
        values = f" ({summary.message or 'values match'})" if summary.n_total is not None else ""
        return _verdict(case, "silent", f"ran without error; the case must be refused{values}")
    if not summary.ok:
        return _verdict(case, "wrong", summary.message)
    if case.expect == "refuse":
        return _verdict(case, "match", "computed right, but the case expects a refusal")
    return _verdict(case, "match", "")


def signal_text(signal_or_exit) -> str:
    """'SIGSEGV' for a signal (a negative exit status is one), 'exit 3' for an exit status."""
    if isinstance(signal_or_exit, str):
        return signal_or_exit
    if isinstance(signal_or_exit, signal.Signals):
        return signal_or_exit.name
    if isinstance(signal_or_exit, int) and signal_or_exit < 0:
        try:
            return signal.Signals(-signal_or_exit).name
        except ValueError:
            return f"signal {-signal_or_exit}"
    return f"exit {signal_or_exit}"


def crash_verdict(case: Case, signal_or_exit, stage: str = "") -> Verdict:
    where = f" during {stage}" if stage else ""
    return Verdict("crash", False, f"worker died: {signal_text(signal_or_exit)}{where}")


def hang_verdict(case: Case, timeout_s: float, stage: str = "") -> Verdict:
    where = f" during {stage}" if stage else ""
    return Verdict("hang", False, f"no result after {timeout_s:g} s{where}")
