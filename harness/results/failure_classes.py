"""Failing rows grouped into failure classes: one defect, however many routes show it.

A class is the failing rows that share (family, variant, outcome, severity,
normalized message). The variant is the part of the case id after
`<family>.` and before the next `/` (`strided.out_stride2` in
`fa2.single_prefill/strided.out_stride2/bf16-d128-h4x2-nhd`); the
normalized message has its numbers, hex addresses, tensor shapes and quoted
values replaced by placeholders, so the same wrong kernel seen through nine
routes and three dtypes is one class with nine routes, not nine findings.

Pure pandas: the console summary and the reports both read it.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import pandas as pd

# Worst first; a row without a severity (tables written before the column) is
# "unrated", and a harness error is the harness's own bug, never the library's.
GROUPS = ("correctness", "capability", "clarity", "unrated", "harness")
OUTCOME_ORDER = ("crash", "corrupt", "hang", "wrong", "nondeterministic", "silent",
                 "unexpected_refusal", "refused", "harness_error", "skipped", "match")

_RULES = (
    # The controller's isolation note says where a row failed, not what failed.
    (re.compile(r"\s*\[replay:.*\]\s*$"), ""),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"(?<![\w'\"])(['\"])(?:(?!\1).){0,200}?\1(?!\w)"), "<q>"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "<shape>"),
    (re.compile(r"[(\[]\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*[)\]]|[(\[]\s*-?\d+\s*,\s*[)\]]"),
     "<shape>"),
    (re.compile(r"\b\d+(?:x\d+)+\b"), "<shape>"),
    (re.compile(r"(?<![\w.])-?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w]|\.\d)"), "<n>"),
    (re.compile(r"(?<![\w.])-?(?:inf|infinity|nan)\b", re.IGNORECASE), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalize_message(text) -> str:
    """The message with what varies between routes and shapes replaced by placeholders."""
    text = _text(text)
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text.strip()


def variant_of(case_id: str, family: str) -> str:
    """`out_stride2` for `<route>/strided.out_stride2/<tag>` and family `strided`."""
    parts = str(case_id).split("/")
    middle = parts[1] if len(parts) > 1 else parts[0]
    prefix = f"{family}."
    return middle[len(prefix):] if family and middle.startswith(prefix) else middle


@dataclass
class FailureClass:
    family: str
    variant: str
    outcome: str
    severity: str
    message: str                      # normalized
    routes: list[str]
    targets: list[str]
    rows: pd.DataFrame = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.family}.{self.variant}" if self.family else self.variant

    @property
    def key(self) -> tuple:
        """What makes two failing rows one class (failure_classes groups by it)."""
        return (self.family, self.variant, self.outcome, self.severity, self.message)

    @property
    def slug(self) -> str:
        """A file-name-safe name, stable for the same key: `report --repros` names the
        class's script `<slug>.py` and the HTML report links to it by that name."""
        head = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.outcome}-{self.label}").strip("-.")[:60]
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
        return _text(self.rows["message"].iloc[0])

    @property
    def group(self) -> str:
        return group_of(self.outcome, self.severity)


def group_of(outcome: str, severity: str) -> str:
    """The severity heading a failing row sits under (GROUPS)."""
    if outcome == "harness_error":
        return "harness"
    return severity if severity in GROUPS else "unrated"


def _text(value) -> str:
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    return str(value)


def _rank(order, value) -> int:
    return order.index(value) if value in order else len(order)


def failure_classes(df: pd.DataFrame) -> list[FailureClass]:
    """The failing rows of `df` as classes, worst first.

    Order: severity group (GROUPS), outcome (OUTCOME_ORDER), most rows, label.
    Each class's rows are sorted by route and case id; its first row is the
    example.
    """
    if not len(df):
        return []
    failing = df[~df["pass"].astype(bool)].copy()
    if not len(failing):
        return []
    for col in ("family", "outcome", "severity", "message", "route", "target"):
        values = failing[col] if col in failing.columns else pd.Series("", index=failing.index)
        failing[col] = [_text(v) for v in values]
    failing["_variant"] = [variant_of(c, f) for c, f in zip(failing["case_id"], failing["family"])]
    failing["_message"] = [normalize_message(m) for m in failing["message"]]
    key = ["family", "_variant", "outcome", "severity", "_message"]
    classes = []
    for (family, variant, outcome, severity, message), part in failing.groupby(key, sort=False):
        part = part.sort_values(["route", "case_id"], kind="stable")
        classes.append(FailureClass(
            family, variant, outcome, severity, message,
            routes=sorted(set(part["route"]) - {""}), targets=sorted(set(part["target"]) - {""}),
            rows=part.drop(columns=["_variant", "_message"])))
    classes.sort(key=lambda c: (_rank(GROUPS, c.group), _rank(OUTCOME_ORDER, c.outcome),
                                -c.n_rows, c.label, c.message))
    return classes


def verdict(df: pd.DataFrame, classes: list[FailureClass] | None = None) -> str:
    """One line: `FAIL: 12 correctness, 3 clarity classes across 198 failing rows (of 615)`."""
    classes = failure_classes(df) if classes is None else classes
    if not classes:
        return f"PASS: {len(df)} rows, 0 failing"
    counts = {g: sum(c.group == g for c in classes) for g in GROUPS}
    named = [f"{n} {g}" for g, n in counts.items() if n and g != "harness"]
    text = ", ".join(named) + (" classes" if named else "")
    if counts["harness"]:
        text += (", " if named else "") + f"{counts['harness']} harness error class" + \
            ("es" if counts["harness"] > 1 else "")
    n_failing = sum(c.n_rows for c in classes)
    return f"FAIL: {text} across {n_failing} failing rows (of {len(df)})"


def _routes_text(routes: list[str], shown: int = 3) -> str:
    head = ", ".join(routes[:shown])
    more = f", … (+{len(routes) - shown})" if len(routes) > shown else ""
    return f"{len(routes)} route{'s' if len(routes) != 1 else ''}: {head}{more}"


def classes_text(classes: list[FailureClass], max_classes: int = 60,
                 max_message: int = 140) -> str:
    """The classes for a console, one line each, worst first; a message is printed once.

    `strided.out_stride2  wrong  correctness  9 routes: fa2.single_prefill, …  — max|diff| inf, …`
    A class whose normalized message an earlier line already printed says
    `same message as <that class>` instead of repeating it.
    """
    if not classes:
        return ""
    shown = classes[:max_classes]
    cells = [(c.label, c.outcome, c.severity or "-",
              _routes_text(c.routes) + (f" ({c.n_rows} rows)" if c.n_rows != len(c.routes) else ""))
             for c in shown]
    widths = [max(len(cell[i]) for cell in cells) for i in range(3)]
    seen: dict[str, str] = {}
    lines = [f"{len(classes)} failure class{'es' if len(classes) != 1 else ''}, worst first:"]
    for c, cell in zip(shown, cells):
        line = "  " + "  ".join(text.ljust(w) for text, w in zip(cell, widths)) + "  " + cell[3]
        if c.message in seen:
            line += f"  — same message as {seen[c.message]}"
        elif c.example_message:
            msg = " ".join(c.example_message.split())
            line += "  — " + (msg if len(msg) <= max_message else msg[:max_message - 1] + "…")
            seen[c.message] = c.label
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
