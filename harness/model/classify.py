"""One outcome per case, from what happened when it ran, and its severity.

Contracts (Case.expect) are the same for every target:
  match            valid input: the reference answer is required
  match_or_refuse  a defined answer a library may legitimately not support:
                   the right answer or a clear refusal both pass
  refuse           no defined answer (run() off its plan, a GQA group that
                   does not divide, a replay past capacity): anything that
                   runs is `silent`

Precedence, first rule that applies:
  skipped            the adapter cannot express the case (passes)
  corrupt            a canary band or an input changed, whatever else happened
  refused            the library raised; `unexpected_refusal` when the case
                     does not allow a refusal. A refusal that does not name
                     each of case.refuse_words as a whole token keeps the
                     outcome but fails (severity `clarity`). Judged on the
                     library's reason only: the prefix a target declares
                     (Target.message_prefix) and an adapter's context
                     (CONTEXT_ATTR) are shown, never judged.
  silent             the case must be refused and the library ran (its
                     values, when there is a reference, go in the message)
  wrong              an output differs from the reference beyond tolerance
  match
crash and hang are decided outside the worker (it died or stopped
answering); crash_verdict and hang_verdict build those rows.
nondeterministic is decided over attempts (harness/engine/attempts.py), and
harness_error is a bug in the harness or an adapter, never the library's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from harness.model.case import Case
from harness.model.compare import Comparison, summarize
from harness.model.signals import signal_text  # noqa: F401  (re-exported)

OUTCOMES = ("match", "refused", "wrong", "silent", "corrupt", "crash", "hang",
            "nondeterministic", "unexpected_refusal", "harness_error", "skipped")

# What a failing row says about the library. `harness` rows are ours to fix.
SEVERITIES = ("correctness", "capability", "clarity", "harness")


def severity(outcome: str, passed: bool) -> str:
    """'' for a passing row; else what kind of failure it is.

    correctness: a wrong, silent, corrupt, crashing, hanging or unstable answer
    (and a must-refuse input computed right: it ran where it must not);
    capability: a valid input refused; clarity: a refusal that does not name
    the field; harness: a bug in the harness or an adapter.
    """
    if passed:
        return ""
    if outcome == "unexpected_refusal":
        return "capability"
    if outcome == "refused":
        return "clarity"
    if outcome == "harness_error":
        return "harness"
    return "correctness"


def names_word(message: str, word: str) -> bool:
    """Whether `word` occurs in `message` as a whole token, case-insensitively.

    Tokens are bounded by anything that is not a letter, digit or underscore,
    so `q` matches "q has stride 2" but not "q_stride" or "seq", and `4` matches
    "planned 4" but not "64". A word may list the names one field goes by,
    separated by `|` ("kv_cache|k_cache|paged_kv_cache"): any one of them names it.
    """
    return any(re.search(r"(?<![A-Za-z0-9_])" + re.escape(alt) + r"(?![A-Za-z0-9_])",
                         message, re.IGNORECASE) is not None
               for alt in word.split("|") if alt)

# A refusal's whole text is kept (the table bounds it generously): a library whose first few
# hundred characters are a status prefix and a C++ signature states its reason after them,
# and the row, the reports and `repro -v` must show that reason.
_MAX_ERROR_TEXT = 4000
# An adapter's own context for a library error (a bare assert's quoted source line and its
# place): shown beside the message, never judged as the library's words.
CONTEXT_ATTR = "adapter_context"


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


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT - 3] + "..."


def error_text(error: BaseException) -> str:
    """`Type: message`, then the adapter's context beside it when it has one."""
    text = f"{type(error).__name__}: {error}"
    context = adapter_context(error)
    if context:
        text += f" [adapter context, not the library's words: {context}]"
    return _bounded(text)


def adapter_context(error: BaseException) -> str:
    """What the adapter added to explain a library error (CONTEXT_ATTR), or ''."""
    context = getattr(error, CONTEXT_ATTR, "")
    return context.strip() if isinstance(context, str) else ""


def reason_of(error: BaseException, message_prefix=None) -> str:
    """The library's reason: its message with the prefix the target declares its messages
    carry (a status code, a source path: Target.message_prefix, a regex matched at the start)
    taken off. Only this text is judged: a value counts only where the reason states it."""
    text = str(error)
    if message_prefix:
        pattern = re.compile(message_prefix) if isinstance(message_prefix, str) else message_prefix
        match = pattern.match(text)
        if match:
            text = text[match.end():]
    return text


def _verdict(case: Case, outcome: str, message: str) -> Verdict:
    return Verdict(outcome, outcome in case.allowed(), message)


def in_their_words(word: str, vocabulary: Mapping | None) -> str:
    """A refusal word with the library's own names for it added as alternatives."""
    if not vocabulary:
        return word
    alts = word.split("|")
    extra = [t for a in alts for t in vocabulary.get(a, ())]
    return "|".join(alts + [t for t in extra if t not in alts])


def classify(case: Case, *, error: BaseException | None = None,
             comparisons: Iterable = (), corruption: Iterable[str] = (),
             skip_reason: str | None = None, vocabulary: Mapping | None = None,
             message_prefix=None) -> Verdict:
    if skip_reason is not None:
        return Verdict("skipped", True, skip_reason)
    corruption = list(corruption)
    if corruption:
        return _verdict(case, "corrupt", "; ".join(corruption))
    if error is not None:
        text = error_text(error)
        if "refused" not in case.allowed():
            return _verdict(case, "unexpected_refusal", text)
        reason = reason_of(error, message_prefix)
        missing = [w for w in case.refuse_words
                   if not names_word(reason, in_their_words(w, vocabulary))]
        if missing:
            where = " in its reason" if reason != str(error) else ""
            return Verdict("refused", False, f"refusal does not name "
                           f"{', '.join(repr(w) for w in missing)} as a word{where}: {text}")
        return _verdict(case, "refused", text)
    summary = summarize(_named(comparisons))
    if case.expect == "refuse":
        # No defined answer: running at all is the finding. The values, when a
        # reference exists, say how far off the run was.
        values = f" ({summary.message or 'values match the reference'})" \
            if summary.n_total is not None else ""
        return _verdict(case, "silent", f"ran without error; the case must be refused{values}")
    if not summary.ok:
        return _verdict(case, "wrong", summary.message)
    return _verdict(case, "match", "")


def harness_error_verdict(what: str) -> Verdict:
    return Verdict("harness_error", False, what)


def adapter_bug_verdict(error: BaseException, stage: str = "") -> Verdict:
    """An adapter's own error (AttributeError, KeyError, ...: engine/execute.py
    HARNESS_ERRORS) in one line: what it raised, where (the innermost frame), and that it
    is no refusal of the library's."""
    import traceback
    from pathlib import Path
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    during = f" during {stage}" if stage else ""
    return harness_error_verdict(
        f"the adapter raised {error_text(error)[:300]}{where}{during}: "
        f"a bug in the adapter (or the case), not the library's refusal")


def crash_verdict(case: Case, signal_or_exit, stage: str = "") -> Verdict:
    where = f" during {stage}" if stage else ""
    return Verdict("crash", False, f"worker died: {signal_text(signal_or_exit)}{where}"
                   + shared_gpu_note())


def shared_gpu_note() -> str:
    """Under NVIDIA MPS a fatal fault reaches every client on the GPU, not only the one whose
    kernel caused it: a crash row then cannot say it was this case's own."""
    from harness.model.platform_info import mps_pipe
    pipe = mps_pipe()
    if pipe is None:
        return ""
    return (f"; the GPU was shared through NVIDIA MPS ({pipe}), where one worker's fault ends "
            "every worker's case: run this case again without MPS to know it is its own")


def hang_verdict(case: Case, timeout_s: float, stage: str = "") -> Verdict:
    where = f" during {stage}" if stage else ""
    return Verdict("hang", False, f"no result after {timeout_s:g} s{where}")
