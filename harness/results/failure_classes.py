"""Failing rows grouped into failure classes: one defect, however many routes show it.

A class is keyed by the defect's signature, which no route, tensor or number enters:

- outcome and severity;
- stage: where the row failed (the `stage` column: build inputs, plan, run, compare, ...);
- what differs: whether o is wrong (with or without the LSE: one defect of o seen through
  the call forms that ask for the LSE and those that do not) or the LSE alone, from the
  per-output columns (o_max_abs_diff / o_tolerance, lse_...), or in a table from before them
  from first_bad_index and the message; empty for an outcome that compared no values, and
  for `silent` (its cause is the refusal that did not happen, whatever the values were);
- the family (`strided`, `gqa`, ...);
- the cause the variant names (cause_variant): the part of the case id after `<family>.`
  and before the next `/`, its tensor names (TENSORS) and numbers replaced by placeholders,
  so `strided.q_stride2`, `strided.k_cache_stride2` and `strided.out_stride2` are all
  `strided.<tensor>_stride<n>`; a feature's scenarios are one cause (`softcap.cap2_basic0`
  and `softcap.cap50_large_logits` are `softcap.*`), except in a must-refuse case, whose
  variant is the check it is about;
- the message's shape: numbers, hex addresses, tensor shapes, quoted values, tensor names
  and the row's own route replaced by placeholders, and the harness's "lse not compared"
  note left out (a row that could not compare an output joins the class of the rows that
  compared only the other).

So the same wrong kernel seen through nine routes, three dtypes, twenty tensors, every
scenario of a feature and every call form (out= given or returned, the LSE asked for or
not) is one class, and each class lists where it appears: its routes, variants, call forms
and tensors. Two defects stay two classes: o wrong vs the LSE alone wrong, SIGSEGV vs SIGFPE
(the signal is a word of the message), a crash in plan vs in run, two families, two
features, two missing checks.

Each part of the signature is computed by harness/results/cause.py (a row's cause, which the
ledger names too); here rows are grouped by it and the classes written out. Pure pandas:
the console summary and the reports both read it.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.results.cause import (  # noqa: F401  (the cause's names, re-exported)
    OUTPUTS, TENSOR, TENSORS, call_form, cell_text, cause_labels, cause_variant, differs_key,
    differs_of, form_rank, label_of, message_key, message_shape, named_by_family,
    normalize_message, signal_of, tensors_of, variant_of, variant_shape)

# Worst first; a row without a severity (tables written before the column) is
# "unrated", and a harness error is the harness's own bug, never the library's.
GROUPS = ("correctness", "capability", "clarity", "unrated", "harness")
OUTCOME_ORDER = ("crash", "corrupt", "hang", "wrong", "nondeterministic", "silent",
                 "unexpected_refusal", "refused", "harness_error", "skipped", "match")

@dataclass
class FailureClass:
    family: str
    variant: str                      # the variants' shape (variant_shape)
    outcome: str
    severity: str
    message: str                      # the messages' shape (message_shape)
    routes: list[str]
    targets: list[str]
    rows: pd.DataFrame = field(repr=False)
    stage: str = ""
    differs: str = ""                 # which outputs are wrong: o, lse, o+lse or ''
    variants: list[str] = field(default_factory=list)   # the variants it appears in
    tensors: list[str] = field(default_factory=list)    # the tensors its rows name
    call_forms: list[str] = field(default_factory=list)  # out+lse, out, lib+lse, lib

    @property
    def label(self) -> str:
        """`strided.q_stride2` for a class of one variant, else its shape:
        `strided.<tensor>_stride<n>`."""
        variant = self.variants[0] if len(self.variants) == 1 else self.variant
        return f"{self.family}.{variant}" if self.family else variant

    @property
    def key(self) -> tuple:
        """What makes two failing rows one class (failure_classes groups by it): the defect's
        signature, with no route, tensor, number or call form in it."""
        return (self.outcome, self.severity, self.stage, differs_key(self.differs),
                self.family, self.variant, self.message)

    @property
    def slug(self) -> str:
        """A file-name-safe name, stable for the same key: `report --repros` names the
        class's script `<slug>.py` and the HTML report links to it by that name."""
        shape = self.variant.replace(TENSOR, "T").replace("<n>", "N")
        name = f"{self.family}.{shape}" if self.family else shape
        head = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.outcome}-{name}").strip("-.")[:60]
        digest = hashlib.sha1(repr(self.key).encode()).hexdigest()[:8]
        return f"{head or 'class'}-{digest}"

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def example(self) -> str:
        """One case id that shows the class (`harness repro` takes it)."""
        return str(self.rows["case_id"].iloc[0])

    @property
    def example_message(self) -> str:
        return cell_text(self.rows["message"].iloc[0])

    @property
    def group(self) -> str:
        return group_of(self.outcome, self.severity)


def group_of(outcome: str, severity: str) -> str:
    """The severity heading a failing row sits under (GROUPS)."""
    if outcome == "harness_error":
        return "harness"
    return severity if severity in GROUPS else "unrated"


def _rank(order, value) -> int:
    return order.index(value) if value in order else len(order)


def failure_classes(df: pd.DataFrame) -> list[FailureClass]:
    """The failing rows of `df` as classes (keyed by FailureClass.key), worst first.

    Order: severity group (GROUPS), outcome (OUTCOME_ORDER), most rows, label.
    Each class's rows are sorted by route and case id; its first row is the
    example.
    """
    if not len(df):
        return []
    failing = df[~df["pass"].astype(bool)].copy()
    if not len(failing):
        return []
    for col in ("family", "outcome", "severity", "message", "route", "target", "stage"):
        values = failing[col] if col in failing.columns else pd.Series("", index=failing.index)
        failing[col] = [cell_text(v) for v in values]
    records = failing.to_dict("records")
    failing["_variant"] = [variant_of(c, f) for c, f in zip(failing["case_id"], failing["family"])]
    # A harness error is our bug: its message is its cause, whatever case it hit.
    failing["_shape"] = [
        "*" if o == "harness_error" else
        cause_variant(v, cell_text(r.get("expect")), named_by_family(r.get("case_id"), f))
        for v, r, o, f in zip(failing["_variant"], records, failing["outcome"], failing["family"])]
    silent = failing["outcome"] == "silent"
    failing["_message"] = [message_key(m, r, c, s)
                           for m, r, c, s in zip(failing["message"], failing["route"],
                                                 failing["case_id"], silent)]
    failing["_outputs"] = ["" if s else differs_of(r) for r, s in zip(records, silent)]
    failing["_differs"] = [differs_key(d) for d in failing["_outputs"]]
    failing["_form"] = [call_form(r) for r in records]
    key = ["outcome", "severity", "stage", "_differs", "family", "_shape", "_message"]
    temp = ["_variant", "_shape", "_message", "_differs", "_outputs", "_form"]
    # Each class's rows by route and case id. One sort of the whole frame and one pass over
    # its positions, grouped in the groupby's own order (ngroup): a sort, a drop and a frame
    # per class were most of a 1,000-class report's time.
    order = pd.Series(range(len(failing)), index=failing.sort_values(
        ["route", "case_id"], kind="stable").index).reindex(failing.index).to_numpy()
    gid = failing.groupby(key, sort=False).ngroup().to_numpy()
    perm = np.lexsort((order, gid))
    rows_of = failing.drop(columns=temp)
    col = {c: failing[c].to_numpy() for c in key + ["route", "target", "message", "_form",
                                                     "_variant", "_outputs"]}
    classes = []
    for positions in np.split(perm, np.flatnonzero(np.diff(gid[perm])) + 1):
        if gid[positions[0]] < 0:
            continue   # a key groupby leaves out (never here: every key is text)
        outcome, severity, stage, _, family, shape, message = (col[k][positions[0]] for k in key)
        tensors: dict[str, None] = {}
        for variant, msg in zip(col["_variant"][positions], col["message"][positions]):
            tensors.update(dict.fromkeys(tensors_of(variant, msg)))
        # Which outputs differ anywhere in the class: o's defect seen with the LSE asked for
        # (o+lse) and without it (o) is one class whose outputs are o+lse.
        seen = {name for d in col["_outputs"][positions] for name in d.split("+") if name}
        classes.append(FailureClass(
            family, shape, outcome, severity, message,
            routes=sorted(set(col["route"][positions]) - {""}),
            targets=sorted(set(col["target"][positions]) - {""}),
            rows=rows_of.take(positions), stage=stage,
            differs="+".join(n for n in OUTPUTS if n in seen),
            variants=sorted(set(col["_variant"][positions])), tensors=sorted(tensors),
            call_forms=sorted(set(col["_form"][positions]) - {""}, key=form_rank)))
    classes.sort(key=lambda c: (_rank(GROUPS, c.group), _rank(OUTCOME_ORDER, c.outcome),
                                -c.n_rows, c.label, c.message))
    return classes


def causes_text(n: int) -> str:
    """`1 distinct cause`, `12 distinct causes`: how the reports count failure classes."""
    return f"{n} distinct cause{'s' if n != 1 else ''}"


def verdict(df: pd.DataFrame, classes: list[FailureClass] | None = None) -> str:
    """One line: `FAIL: 15 distinct causes (12 correctness, 3 clarity) across 198 failing
    rows (of 615)`; a cause is a failure class."""
    classes = failure_classes(df) if classes is None else classes
    n_known = known_count(df)
    known = f", {n_known} known (ledger)" if n_known else ""
    if not classes:
        return f"PASS: {len(df)} rows, 0 failing{known}"
    counts = {g: sum(c.group == g for c in classes) for g in GROUPS}
    named = [f"{n} {g}" for g, n in counts.items() if n and g != "harness"]
    if counts["harness"]:
        named.append(f"{counts['harness']} harness error")
    n_failing = sum(c.n_rows for c in classes)
    return (f"FAIL: {causes_text(len(classes))} ({', '.join(named)}) across {n_failing} "
            f"failing rows (of {len(df)}){known}")


def known_count(df: pd.DataFrame) -> int:
    """Rows the known-failures ledger excused (a reason in `ledger`): counted apart from
    passes and from new failures."""
    if "ledger" not in df.columns or not len(df):
        return 0
    return int(sum(bool(cell_text(v)) and bool(p) for v, p in zip(df["ledger"], df["pass"])))


def _routes_text(routes: list[str], shown: int = 3) -> str:
    head = ", ".join(routes[:shown])
    more = f", … (+{len(routes) - shown})" if len(routes) > shown else ""
    return f"{len(routes)} route{'s' if len(routes) != 1 else ''}: {head}{more}"


def _some(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f", … (+{len(names) - shown})" if len(names) > shown else "")


def where_text(cls: FailureClass) -> str:
    """`; 8 variants; tensors: k, k_cache, … (+6)` for a class seen in several variants or
    naming tensors; '' for a class of one variant that names none."""
    text = f"; {len(cls.variants)} variants" if len(cls.variants) > 1 else ""
    if len(cls.call_forms) > 1:
        text += f"; call forms: {', '.join(cls.call_forms)}"
    if cls.tensors:
        text += f"; tensor{'s' if len(cls.tensors) != 1 else ''}: {_some(cls.tensors)}"
    return text


def classes_text(classes: list[FailureClass], max_classes: int = 60,
                 max_message: int = 140) -> str:
    """The classes for a console, one line each, worst first; a message is printed once.

    `strided.<tensor>_stride<n>  wrong(o)  correctness  9 routes: fa2.single_prefill, …;
    12 variants; tensors: k, k_cache, … (+10)  — o max|diff| inf, …`
    Each line prints its own class's example message; only a message that an earlier line
    printed word for word says `same message as <that class>`.
    """
    if not classes:
        return ""
    shown = classes[:max_classes]
    cells = [(c.label, c.outcome + (f"({c.differs})" if c.differs else ""), c.severity or "-",
              _routes_text(c.routes) + (f" ({c.n_rows} rows)" if c.n_rows != len(c.routes) else "")
              + where_text(c))
             for c in shown]
    widths = [max(len(cell[i]) for cell in cells) for i in range(3)]
    seen: dict[str, str] = {}
    lines = [f"{len(classes)} failure class{'es' if len(classes) != 1 else ''}, worst first:"]
    for c, cell in zip(shown, cells):
        line = "  " + "  ".join(text.ljust(w) for text, w in zip(cell, widths)) + "  " + cell[3]
        msg = " ".join(c.example_message.split())
        if msg in seen:
            line += f"  — same message as {seen[msg]}"
        elif msg:
            line += "  — " + (msg if len(msg) <= max_message else msg[:max_message - 1] + "…")
            seen[msg] = c.label
        lines.append(line)
    if len(classes) > max_classes:
        lines.append(f"  … and {len(classes) - max_classes} more classes")
    return "\n".join(lines)


def console_summary(df: pd.DataFrame, max_classes: int = 60) -> str:
    """The verdict line, then the failure classes: what `harness check` prints first."""
    classes = failure_classes(df)
    text = verdict(df, classes)
    if classes:
        text += "\n" + classes_text(classes, max_classes=max_classes)
    return text
