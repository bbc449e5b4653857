"""A run's summary as one JSON document, for CI: the verdict, counts, failure classes and
what ran where. The schema is SCHEMA below (JSON Schema, the subset validate() checks),
documented field by field in docs/ci.md; `schema_version` changes when a field's meaning
does.

GitHub annotations (one `::error` line per failure class that fails the run, `::warning`
for a class that does not) come from the same classes, so the check's annotations, its
summary and its JUnit XML never disagree.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Mapping

from harness.model.classify import OUTCOMES, SEVERITIES
from harness.results.columns import ROW, run_columns

# 2: a failure class is one cause (harness/results/failure_classes.py): `variant` is the
# variants' shape (`<tensor>_stride<n>`), and a class lists its variants, tensors, stage,
# wrong outputs, message pattern and slug.
SCHEMA_VERSION = 2

_STRINGS = {"type": "array", "items": {"type": "string"}}
_CLASS = {
    "type": "object",
    "required": ["label", "family", "variant", "outcome", "severity", "gating", "rows",
                 "routes", "example", "message", "repro", "variants", "tensors", "stage",
                 "differs", "pattern", "slug"],
    "properties": {
        "label": {"type": "string"}, "family": {"type": "string"},
        "variant": {"type": "string"}, "outcome": {"enum": list(OUTCOMES)},
        "severity": {"type": "string"}, "gating": {"type": "boolean"},
        "rows": {"type": "integer", "minimum": 1},
        "routes": _STRINGS, "variants": _STRINGS, "tensors": _STRINGS, "call_forms": _STRINGS,
        "stage": {"type": "string"},
        "differs": {"enum": ["", "o", "lse", "o+lse"]},
        "pattern": {"type": "string"}, "slug": {"type": "string"},
        "example": {"type": "string"}, "message": {"type": "string"},
        "repro": {"type": "string"},
    },
}


def _run_fields(columns=ROW) -> dict:
    """The run's description, from the row's run columns that name a summary key
    (harness/results/columns.py), in the run's order: {key: column}. The run ids and the
    target's version have their own fields (run_ids, versions.target)."""
    return {c.summary: c for c in run_columns(columns) if c.summary}


def _nullable(column) -> bool:
    return column.kind == "option"   # a target option the run did not set is null


def summary_schema(columns=ROW) -> dict:
    """The summary's JSON Schema; its run fields come from the row's columns."""
    run = _run_fields(columns)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "attention-harness run summary",
        "type": "object",
        "required": ["schema_version", "verdict", "verdict_line", "exit_code", "rows", "failing",
                     "gating", "counts", "failure_classes", "table",
                     *(key for key, c in run.items() if c.required), "versions"],
        "properties": {
            "schema_version": {"enum": [SCHEMA_VERSION]},
            "verdict": {"enum": ["pass", "fail"]},
            "verdict_line": {"type": "string"},
            "exit_code": {"type": ["integer", "null"]},
            "rows": {"type": "integer", "minimum": 0},
            "failing": {"type": "integer", "minimum": 0},
            "gating": {"type": "integer", "minimum": 0},
            # rows the known-failures ledger excused: not failing, not passes either
            "known": {"type": "integer", "minimum": 0},
            "counts": {
                "type": "object", "required": ["by_outcome", "by_severity"],
                "properties": {
                    "by_outcome": {"type": "object", "required": list(OUTCOMES),
                                   "additionalProperties": {"type": "integer", "minimum": 0}},
                    "by_severity": {"type": "object", "required": list(SEVERITIES),
                                    "additionalProperties": {"type": "integer", "minimum": 0}},
                },
            },
            "failure_classes": {"type": "array", "items": _CLASS},
            "table": {"type": ["string", "null"]},
            **{key: {"type": ["string", "null"] if _nullable(c) else "string"}
               for key, c in run.items()},
            "run_ids": {"type": "array", "items": {"type": "string"}},
            "versions": {"type": "object", "required": ["target"],
                         "additionalProperties": {"type": "string"}},
        },
    }


SCHEMA = summary_schema()


# ---- the document ------------------------------------------------------------------------

def _text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _first(df, column: str) -> str:
    if column not in df.columns or not len(df):
        return ""
    values = [_text(v) for v in df[column] if _text(v)]
    return values[0] if values else ""


def _versions(df) -> dict:
    import platform
    from importlib import metadata
    out = {"target": _first(df, "target_version"), "python": platform.python_version()}
    for package in ("torch", "numpy"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return out


def summary(df, *, table: str | None = None, gating_ids: set | None = None,
            exit_code: int | None = None, repro: Callable[[Mapping], str] | None = None) -> dict:
    """The summary document of a loaded table (after the ledger). gating_ids: the failing
    rows that fail the run (None: every failing row)."""
    from harness.results.failure_classes import failure_classes, known_count, verdict
    from harness.results.junit import default_repro
    repro = repro or default_repro
    n = len(df)
    passed = df["pass"].astype(bool) if n else []
    failing_ids = set(df.loc[~passed, "case_id"]) if n else set()
    gating = failing_ids if gating_ids is None else set(gating_ids) & failing_ids
    by_outcome = {o: 0 for o in OUTCOMES}
    by_severity = {s: 0 for s in SEVERITIES}
    if n:
        for value, count in df["outcome"].value_counts().items():
            by_outcome[str(value)] = int(count)
        if "severity" in df.columns:
            for value, count in df.loc[~passed, "severity"].value_counts().items():
                if _text(value):
                    by_severity[str(value)] = int(count)
    classes = []
    for cls in failure_classes(df) if n else []:
        example_row = cls.rows.iloc[0].to_dict()
        classes.append({
            "label": cls.label, "family": cls.family, "variant": cls.variant,
            "outcome": cls.outcome, "severity": cls.severity,
            "gating": bool(set(cls.rows["case_id"]) & gating), "rows": cls.n_rows,
            "routes": list(cls.routes), "variants": list(cls.variants),
            "tensors": list(cls.tensors), "call_forms": list(cls.call_forms),
            "stage": cls.stage, "differs": cls.differs,
            "pattern": cls.message, "slug": cls.slug, "example": cls.example,
            "message": cls.example_message, "repro": repro(example_row),
        })
    failed = bool(gating) if exit_code is None else exit_code != 0
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": "fail" if failed else "pass",
        "verdict_line": verdict(df) if n else "PASS: 0 rows",
        "exit_code": exit_code,
        "rows": n, "failing": len(failing_ids), "gating": len(gating),
        "known": known_count(df),
        "counts": {"by_outcome": by_outcome, "by_severity": by_severity},
        "failure_classes": classes,
        "table": str(table) if table is not None else None,
        **{key: _first(df, c.name) or (None if _nullable(c) else "")
           for key, c in _run_fields().items()},
        "run_ids": sorted({_text(v) for v in df["run_id"] if _text(v)}) if "run_id" in df.columns else [],
        "versions": _versions(df),
    }


def write_summary(doc: dict, path) -> Path:
    errors = validate(doc)
    if errors:   # ours to fix: never hand CI a document the schema rejects
        raise ValueError("summary does not match its schema: " + "; ".join(errors[:5]))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return path


# ---- the validator -----------------------------------------------------------------------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def validate(doc, schema: Mapping = SCHEMA, where: str = "$") -> list[str]:
    """The ways `doc` breaks `schema` ([] when it conforms). Checks the keywords SCHEMA
    uses: type, enum, required, properties, additionalProperties, items, minimum."""
    errors: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(doc, k) for k in kinds):
            return [f"{where}: expected {' or '.join(kinds)}, got {type(doc).__name__}"]
    if "enum" in schema and doc not in schema["enum"]:
        errors.append(f"{where}: {doc!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(doc, "number") and doc < schema["minimum"]:
        errors.append(f"{where}: {doc} < {schema['minimum']}")
    if isinstance(doc, dict):
        for key in schema.get("required", ()):
            if key not in doc:
                errors.append(f"{where}: missing {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in doc.items():
            if key in props:
                errors += validate(value, props[key], f"{where}.{key}")
            elif isinstance(extra, Mapping):
                errors += validate(value, extra, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}: unexpected key {key!r}")
    if isinstance(doc, list) and "items" in schema:
        for i, value in enumerate(doc):
            errors += validate(value, schema["items"], f"{where}[{i}]")
    return errors


# ---- GitHub annotations ------------------------------------------------------------------

def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotations(doc: Mapping) -> list[str]:
    """One workflow command per failure class: `::error` when it fails the run, else
    `::warning`; the title names the class, the text its example and repro command."""
    lines = []
    for cls in doc.get("failure_classes", ()):
        level = "error" if cls["gating"] else "warning"
        title = (f"{cls['label']}: {cls['outcome']} ({cls['severity'] or 'unrated'}), "
                 f"{cls['rows']} row{'s' if cls['rows'] != 1 else ''}")
        text = f"{cls['example']}: {cls['message'] or cls['outcome']}\nrepro: {cls['repro']}"
        lines.append(f"::{level} title={_escape_property(title)}::{_escape_data(text)}")
    return lines


def step_summary(doc: Mapping, max_classes: int = 30) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: the verdict, the counts, the classes."""
    out = [f"### {doc['target']} on {doc['arch']}: {doc['verdict_line']}", ""]
    counts = {k: v for k, v in doc["counts"]["by_outcome"].items() if v}
    out.append(" | ".join(f"{k} {v}" for k, v in counts.items()) or "no rows")
    if doc["failure_classes"]:
        out += ["", "| class | outcome | severity | rows | example |", "| --- | --- | --- | --- | --- |"]
        for cls in doc["failure_classes"][:max_classes]:
            cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            out.append(f"| {cell(cls['label'])} | {cls['outcome']} | {cls['severity']} | "
                       f"{cls['rows']} | `{cell(cls['repro'])}` |")
        if len(doc["failure_classes"]) > max_classes:
            out.append(f"| … {len(doc['failure_classes']) - max_classes} more | | | | |")
    out += ["", f"table: `{doc['table']}`; commit `{doc['commit']}`; "
            + ", ".join(f"{k} {v}" for k, v in doc["versions"].items() if v)]
    return "\n".join(out) + "\n"

