"""A Markdown summary for a PR comment: regressions and failures first, under the comment limit."""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from harness.results.cause import shown
from harness.results.failure_classes import causes_text, failure_classes, label_of, verdict
from harness.results.ledger import known_mask
from harness.results.sanitizer_report import report_of, where_text

from . import (OUTCOMES, diffs_text, fmt_wrong, prepare, repro_command,
               sort_failures_first)
from .classes import repro_link
from .compare import arches, by_arch, compare, head_side, summary
from .header import conditions

LIMIT = 65_000
# Room kept for the "left out" notes and the closing lines.
_RESERVE = 1_500


def _flat(text) -> str:
    """One line, every control, bidi or zero-width character written as its escape (a PR
    comment or a terminal shows the text as it is, never reordered or recoloured)."""
    text = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    return shown(" ".join(text.split()))


def _cut(text: str) -> str:
    return text if len(text) <= 160 else text[:157] + "..."


# What a table's text could use to become markup, a link or image, a mention, a code span
# or a new table cell: each is shown as the character, never acted on.
_MD_ESCAPES = str.maketrans({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "`": "\\`", "|": "\\|",
    "[": "\\[", "]": "\\]",
    "@": "@\u200b",   # GitHub links @name; a zero-width space after the @ breaks the name
})


def _cell(text) -> str:
    """Plain text for a table cell or a line: nothing in it is Markdown or HTML."""
    text = _cut(_flat(text)).translate(_MD_ESCAPES)
    # Bare addresses autolink (http://…, www.…): broken the same way.
    return text.replace("://", ":\u200b//").replace("www.", "www\u200b.")


def _code(text) -> str:
    """A code span holding the text as it is: fenced by more backticks than any run inside
    it (Markdown reads nothing else in a code span), its pipes escaped for the table."""
    text = _cut(_flat(text))
    if not text:
        return ""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or longest else ""
    body = text.replace("|", "\\|")
    return f"{fence}{pad}{body}{pad}{fence}"


def _sanitizer_cell(value) -> str:
    """`memcheck` in `kernel`: what it reported, where; '' for a row without a report."""
    report = report_of(value)
    if report is None:
        return ""
    where = where_text(report)
    text = _cell(report.get("tool", "")) + (f" in {_code(report['kernel'])}" if report.get("kernel") else "")
    return text + f": {_cell(report.get('kind'))}" + (f"; {_cell(where)}" if where else "")


def _is_known(row) -> bool:
    return bool(row.get("pass")) and bool(_flat(row.get("ledger")))


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


class _Budget:
    def __init__(self, limit: int):
        self.limit = limit
        self.lines: list[str] = []
        self.size = 0
        self.left_out: list[str] = []

    def add(self, line: str = "") -> bool:
        if self.size + len(line) + 1 > self.limit - _RESERVE:
            return False
        self.lines.append(line)
        self.size += len(line) + 1
        return True

    def table(self, what: str, header: list[str], rows: list[list[str]],
              share: float = 1.0) -> None:
        """A table, cut where the budget (or its `share` of the limit) ends, saying how many
        rows were left out."""
        if not rows:
            return
        stop = self.size + int(self.limit * share)
        if not (self.add(_row(header)) and self.add(_row(["---"] * len(header)))):
            self.left_out.append(f"{what}: all {len(rows)} rows")
            return
        for i, cells in enumerate(rows):
            line = _row(cells)
            if self.size + len(line) > stop or not self.add(line):
                left = len(rows) - i
                note = f"*{left} of {len(rows)} rows left out to stay under {self.limit:,} characters.*"
                self.lines.append("")
                self.lines.append(note)
                self.size += len(note) + 2
                self.left_out.append(f"{what}: {left} of {len(rows)} rows")
                break
        self.add("")


class _Lazy:
    """A table's rows, each made only when the budget reads it: a 20,000-row table shows a
    few hundred rows, and says how many it left out (its length is known up front)."""

    def __init__(self, items, make, n: int):
        self.items, self.make, self.n = items, make, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return (self.make(item) for item in self.items)


def _frame_rows(df: pd.DataFrame, make) -> _Lazy:
    """make(row) for each row of df, as plain dicts a chunk at a time (iterrows builds a
    Series a row)."""
    def records():
        for start in range(0, len(df), 256):
            yield from df.iloc[start:start + 256].to_dict("records")
    return _Lazy(records(), make, len(df))


def _groups_table(out: _Budget, groups: dict) -> None:
    out.add(f"### Runs side by side: {len(groups['columns'])} groups")
    out.add("")
    header = [""] + [" / ".join((_cell(c["target"]) or "—", _cell(c["guards"]),
                                  _code(c["commit"]) or "—")) for c in groups["columns"]]
    out.table("Runs side by side", header,
              [[_cell(r["label"])] + [str(n) for n in r["counts"]] for r in groups["rows"]])


def _diffs(row) -> str:
    """o's and lse's own max |diff|, each against its own tolerance (diffs_text)."""
    return _cell(diffs_text(row))


def _where(cls) -> str:
    """`2 variants; tensors: k, q`: where a class appears besides its routes."""
    parts = []
    if len(cls.variants) > 1:
        parts.append(f"{len(cls.variants)} variants")
    if len(cls.call_forms) > 1:
        parts.append("call forms: " + ", ".join(cls.call_forms))
    if cls.tensors:
        shown = ", ".join(cls.tensors[:6]) + (f", … (+{len(cls.tensors) - 6})"
                                             if len(cls.tensors) > 6 else "")
        parts.append("tensors: " + shown)
    return _cell("; ".join(parts))


def _script_cell(cls, repros, md_path) -> str:
    """A link to the class's `report --repros` script (relative to the Markdown file), or ''."""
    link = repro_link(cls, repros, md_path)
    return f"[{_cell(Path(link).name)}]({quote(link)})" if link else ""


def _known_table(out: _Budget, known: pd.DataFrame) -> None:
    """The rows the ledger excused, one line per reason: reviewed findings, still shown,
    counted apart from passes and from new failures."""
    if not len(known):
        return
    out.add(f"### Known failures (ledger): {len(known)} rows, {known['ledger'].nunique()} "
            f"reviewed cause{'s' if known['ledger'].nunique() != 1 else ''}")
    out.add("")
    rows = []
    for reason, part in known.groupby("ledger", sort=False):
        labels = sorted({label_of(r) for r in part.to_dict("records")})
        outcomes = ", ".join(f"{o} {n}" for o, n in part["outcome"].value_counts().items())
        rows.append([_cell(reason), str(len(part)), _cell(", ".join(labels)), _cell(outcomes),
                     _code(part["case_id"].iloc[0])])
    out.table("Known failures", ["reason", "rows", "classes", "outcomes", "example"], rows,
              share=0.15)


def render_markdown(df: pd.DataFrame, base_df: pd.DataFrame | None = None,
                    title: str = "Attention correctness", limit: int = LIMIT,
                    groups: dict | None = None, repros=None, md_path=None) -> str:
    """`groups` (reports.groups.side_by_side): tables merged with --merge-different.
    `repros`: the folder of `report --repros` scripts; each class whose `<slug>.py` is there
    links to it, relative to `md_path` (where the Markdown goes)."""
    df = prepare(df)
    out = _Budget(limit)
    n_fail = int((~df["pass"]).sum())
    names = arches(df)
    out.add(f"## {_cell(title)}")
    out.add("")
    # Guards' values name themselves (`guards on`, `guards off: a, b`), so they go bare.
    out.add(" · ".join("; ".join(_cell(v) for v in values) or "guards: —" if name == "guards"
                       else f"{name}: " + (", ".join(_cell(v) for v in values) or "—")
                       for name, values in conditions(df)))
    out.add("")
    classes = failure_classes(df)
    out.add(f"**{_cell(verdict(df, classes))}**")
    out.add("")
    known = df[known_mask(df)]
    out.add(f"{len(df)} cases, {len(df) - n_fail - len(known)} pass, "
            + (f"{len(known)} known (ledger), " if len(known) else "") + f"{n_fail} fail"
            + (f" on {_cell(', '.join(names))}" if names else "") + ".")
    out.add("")
    if groups:
        _groups_table(out, groups)
    _known_table(out, known)
    if not n_fail:
        # A PR comment for a passing run says so and stops: its every-row table is noise
        # there, and the HTML report keeps it.
        if base_df is not None:
            counts = summary(compare(base_df, df))
            out.add("Base vs head: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".")
        return "\n".join(out.lines).rstrip() + "\n"
    if classes:
        out.add(f"### Failure classes: {causes_text(len(classes))}")
        out.add("")
        scripts = [_script_cell(c, repros, md_path) for c in classes] if repros else []
        with_scripts = any(scripts)
        out.table("Failure classes", ["severity", "class", "outcome", "rows", "routes", "where",
                                      "message", "example"] + (["script"] if with_scripts else []),
                  _Lazy(enumerate(classes), lambda ic: (
            [_cell(ic[1].group), _code(ic[1].label),
             f"**{_cell(ic[1].outcome)}**" + (f" ({_cell(ic[1].differs)})" if ic[1].differs else ""),
             str(ic[1].n_rows), _cell(", ".join(ic[1].routes)), _where(ic[1]),
             _cell(ic[1].example_message), _code(repro_command(ic[1].rows.iloc[0]))]
            + ([scripts[ic[0]]] if with_scripts else [])), len(classes)), share=0.25)

    if base_df is not None:
        changes = compare(base_df, df)
        counts = summary(changes)
        out.add("### Base vs head")
        out.add("")
        out.add(", ".join(f"{n} {k}" for k, n in counts.items()) + ".")
        out.add("")
        for kind, heading in (("regression", "Regressions (pass → fail)"),
                              ("fix", "Fixes (fail → pass)"), ("new", "New cases")):
            part = changes[changes["change"] == kind]
            if kind == "new":
                part = part[~part["head_pass"].fillna(True).astype(bool)]
                heading = "New failing cases"
            if not len(part):
                continue
            out.add(f"#### {heading}: {len(part)}")
            out.add("")
            arch_col = "arch" in part.columns
            header = ["route", "case"] + (["arch"] if arch_col else []) + [
                "before", "after", "max \\|diff\\| after"]
            out.table(heading, header, [
                [_cell(r["route"]), _code(r["case_id"])] + ([_cell(r["arch"])] if arch_col else [])
                + [_cell(r["base_outcome"]) or "—", _cell(r["head_outcome"]) or "—",
                   _diffs(head_side(r))]
                for _, r in part.iterrows()], share=0.2)

    failing = sort_failures_first(df[~df["pass"]])
    if len(failing):
        # Every failing row, one line each (what `check` once printed on the console).
        out.add(f"### Failures: {len(failing)}")
        out.add("")
        multi = len(names) > 1
        # A column only when `check --sanitizer` replayed a row, beside that row's message.
        sanitized = any(report_of(v) for v in failing["sanitizer"])
        header = ["route", "case"] + (["arch"] if multi else []) + [
            "outcome", "severity", "isolation", "max \\|diff\\|", "wrong/total", "message"] + (
            ["sanitizer"] if sanitized else []) + ["repro"]
        out.table("Failures", header, _frame_rows(failing, lambda r: (
            [_cell(r["route"]), _code(r["case_id"])] + ([_cell(r["arch"])] if multi else [])
            + [f"**{_cell(r['outcome'])}**", _cell(r["severity"]), _cell(r["isolation"]),
               _diffs(r), fmt_wrong(r), _cell(r["message"])]
            + ([_sanitizer_cell(r["sanitizer"])] if sanitized else [])
            + [_code(repro_command(r))])), share=0.4)

    out.add("### Route × outcome")
    out.add("")
    counts = pd.crosstab(df["route"], df["outcome"]) if len(df) else pd.DataFrame()
    present = [o for o in OUTCOMES if o in counts.columns]
    out.table("Route × outcome", ["route"] + present, [
        [_cell(route)] + [str(int(counts.loc[route, o])) or "" for o in present]
        for route in counts.index])

    out.add("### All cases")
    out.add("")
    if len(names) > 1:
        table = by_arch(df)
        out.table("All cases", ["route", "case"] + [_cell(a) for a in names] + ["max \\|diff\\|", "wrong/total"], [
            [_cell(r["route"]), _code(r["case_id"])]
            + [_cell(r[f"outcome:{a}"]) or "—" for a in names]
            + [" / ".join(_cell(r[f"diffs:{a}"]) or "—" for a in names),
               " / ".join(_cell(r[f"wrong:{a}"]) or "—" for a in names)]
            for _, r in table.iterrows()])
    else:
        rows = sort_failures_first(df)
        out.table("All cases", ["route", "case", "outcome", "max \\|diff\\|", "wrong/total"],
                  _frame_rows(rows, lambda r: [
                      _cell(r["route"]), _code(r["case_id"]),
                      _cell(r["outcome"]) + (" (known)" if _is_known(r) else ""),
                      _diffs(r), fmt_wrong(r)]))

    if out.left_out:
        out.lines.append("Left out: " + "; ".join(out.left_out) + ". The HTML report has every row.")
    text = "\n".join(out.lines).rstrip() + "\n"
    assert len(text) < limit, len(text)
    return text
