"""The results row's columns, declared once.

Everything that names a row's columns is made from ROW below: the table's column order,
its type checks and the columns a reader may meet besides them (harness/results/table.py),
the fields copied from a CaseResult (harness/engine/row.py, checked against the dataclass in
harness/engine/execute.py), the run's description in the summary JSON
(harness/results/summary_json.py), the JUnit properties (harness/results/junit.py) and the
report's columns (reports/). Adding a column is one Column here; its `kind` picks the type
check, the other fields say where else it appears.

Order matters: COLUMNS is ROW's written columns in order, and a table's JSON lines keep it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from harness.model.classify import OUTCOMES
from harness.model.compare import PER_OUTPUT

# Names that reach file names, ids and attributes: arch and target.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,80}$")
ISOLATION = ("", "culprit", "victim", "alone")

# The columns the in-tree targets' options are recorded in (each descriptor's OPTIONS,
# harness/targets/descriptors/: results cannot import targets, so this is the one place
# their names pass through; tests/test_target_options.py checks the two agree). A reader
# asks repro_command.options_of for the options a row ran with.
OPTION_COLUMNS = ("disable_guards",)


@dataclass(frozen=True)
class Column:
    name: str
    kind: str            # a key of KINDS: the values a table may hold in it
    doc: str
    written: bool = True  # every run writes it (COLUMNS); False: only read (older tools wrote it)
    empty: Any = None     # what a null is written as (None: written as null)
    result: str = ""      # the CaseResult field a case's row copies it from
    run: int = 0          # it describes the run, not the case: its place (1, 2, ...) among the
                          # run's descriptions (JUnit properties, the summary JSON)
    label: str = ""       # the report's heading for a run column (its name when unset)
    summary: str = ""     # the summary JSON's key for a run column ("": not there by itself)
    required: bool = False  # the summary JSON schema requires that key


# ---- the type of each kind (a reader treats a table as hostile input) --------------------

def _is_num(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _is_int(v) -> bool:
    # NaN is how pandas writes a missing count.
    return v is None or (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, float) and (v.is_integer() or math.isnan(v)))


def _is_str(v) -> bool:
    return v is None or isinstance(v, str)


def _is_safe(v) -> bool:
    return v is None or v == "" or (isinstance(v, str) and bool(SAFE_NAME.match(v)))


def _is_json_value(v, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, list):
        return all(_is_json_value(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_json_value(x, depth + 1) for k, x in v.items())
    return False


def _is_index(v) -> bool:
    return v is None or isinstance(v, (int, str)) and not isinstance(v, bool) or (
        isinstance(v, list) and all(isinstance(x, (int, str)) and not isinstance(x, bool)
                                    for x in v))


def _is_attempts(v) -> bool:
    return v is None or isinstance(v, str) or (
        isinstance(v, list) and all(isinstance(a, dict) and _is_json_value(a) for a in v))


def _is_option(v) -> bool:   # a comma list, or a list of its values (older tables)
    return v is None or isinstance(v, str) or (
        isinstance(v, list) and all(isinstance(x, str) for x in v))


def _is_object(v) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, dict) and _is_json_value(v))


# kind -> (check, what a value must be)
KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (_is_str, "a string or null"),
    "id": (_is_str, "a string or null"),   # an id, commit or hash: a report shows it as code
    "safe": (_is_safe, f"a name matching {SAFE_NAME.pattern}, or null"),
    "case_id": (lambda v: isinstance(v, str) and 0 < len(v) <= 1000, "a non-empty string"),
    "outcome": (lambda v: v in OUTCOMES, f"one of {', '.join(OUTCOMES)}"),
    "bool": (lambda v: isinstance(v, bool), "a JSON boolean (true or false)"),
    "isolation": (lambda v: v is None or v in ISOLATION, f"one of {ISOLATION}, or null"),
    # NaN and inf are numbers here (a max |diff| may be either): a reader keeps them
    "num": (_is_num, "a number or null"),
    "int": (_is_int, "a whole number or null"),
    "index": (_is_index, "a list of indices, an index or null"),
    "params": (_is_object, "a JSON object, its JSON text, or null"),
    "attempts": (_is_attempts, "a list of attempt objects, its JSON text, or null"),
    "option": (_is_option, "a string, a list of strings, or null"),
    "object": (_is_object, "an object, its JSON text, or null"),
    "flag": (lambda v: v is None or isinstance(v, (bool, str)), "a boolean, a string or null"),
}

_PER_OUTPUT_DOC = {"max_abs_diff": "{o}'s own max |diff| (null when {o} was not compared)",
                   "tolerance": "{o}'s own tolerance",
                   "error_ratio": "{o}'s max |diff| / its own tolerance"}
PER_OUTPUT_COLUMNS = tuple(f"{o}_{what}" for o in PER_OUTPUT for what in _PER_OUTPUT_DOC)

ROW: tuple[Column, ...] = (
    Column("run_id", "id", "the run that wrote the row", run=7, label="run"),
    Column("timestamp", "str", "when the case finished (UTC, ISO 8601, milliseconds)"),
    Column("arch", "safe", "the device's architecture", run=3, summary="arch", required=True),
    Column("platform", "str", "the platform the target ran on, as it names it", run=4,
           summary="platform"),
    Column("target", "safe", "the library under test", run=1, summary="target",
           required=True),
    Column("target_version", "str", "the library's version", run=2, label="version"),
    Column("library_commit", "id", "the library's commit (the table's name carries it)",
           run=5, label="library commit", summary="commit", required=True),
    Column("build_hash", "id", "the library's build", run=6, label="build",
           summary="build_hash"),
    Column("route", "str", "the library entry point the case ran through"),
    Column("family", "str", "the case's family"),
    Column("case_id", "case_id", "the case"),
    Column("params", "params", "the case's params, as JSON text"),
    Column("expect", "str", "the case's contract: match, match_or_refuse or refuse"),
    Column("outcome", "outcome", "what happened (docs/rows.md)", result="outcome"),
    Column("pass", "bool", "whether the outcome meets the contract", result="passed"),
    Column("max_abs_diff", "num", "the max |diff| over every output compared",
           result="max_abs_diff"),
    Column("n_wrong", "int", "elements out of tolerance", result="n_wrong"),
    Column("n_total", "int", "elements compared", result="n_total"),
    Column("first_bad_index", "index", "the first element out of tolerance",
           result="first_bad_index"),
    Column("message", "str", "the refusal's or failure's words", empty="", result="message"),
    Column("error_type", "str", "the refusal's exception type, or a death's cause", empty="",
           result="error_type"),
    Column("stage", "str", "the stage the case reached", empty="", result="stage"),
    Column("duration_s", "num", "seconds the case took", result="duration_s"),
    Column("severity", "str", "a failing row's severity (docs/rows.md)", empty=""),
    Column("tolerance", "num", "the absolute tolerance o was judged with", result="tolerance"),
    Column("baseline_error", "num", "max |baseline - reference|, when a baseline set the "
           "tolerance", result="baseline_error"),
    Column("rel_error", "num", "||got - ref|| / ||ref|| over the finite reference",
           result="rel_error"),
    Column("error_ratio", "num", "max |diff| / tolerance: above 1 is wrong",
           result="error_ratio"),
    Column("attempts", "attempts", "every attempt's outcome and numbers"),
    Column("repeat", "int", "how many times the case ran in its worker (--repeat)"),
    Column("profile", "str", "the case profile the run selected"),
    Column("reruns", "int", "reruns of a failing case (--reruns)", empty=0),
    Column("isolation", "isolation", "a case that took its worker down: culprit, victim or "
           "alone", empty=""),
    Column("worker", "str", "the worker that ran it", empty=""),
    *(Column(name, "option", "the target's option of that name, as its flag takes it",
             empty="", run=8, summary=name) for name in OPTION_COLUMNS),
    Column("sanitizer", "object", "compute-sanitizer's first report from `check --sanitizer` "
           "(harness/tools/sanitizer.py), or null"),
    # tables written before them lack them; max_abs_diff is the max of both
    *(Column(f"{o}_{what}", "num", doc.format(o=o), result=f"{o}_{what}")
      for o in PER_OUTPUT for what, doc in _PER_OUTPUT_DOC.items()),
    Column("harness_commit", "id", "the harness's own commit (the table's name carries the "
           "library's: harness/engine/identity.py)"),
    Column("shard", "str", "\"I/N\" for a row of shard I of a run split N ways (`check "
           "--shard`), else empty"),
    # Read, never written by a run: reports read them; older tools wrote them.
    Column("ledger", "str", "the known-failures ledger's reason", written=False),
    Column("case_json", "str", "a shrunk case's file", written=False),
    Column("flaky", "flag", "a rerun's flakiness", written=False),
)


def names(columns=ROW, written: bool | None = True) -> tuple[str, ...]:
    """The names, in order: the written ones (COLUMNS), the read-only ones (False) or all (None)."""
    return tuple(c.name for c in columns if written is None or c.written == written)


def of_kind(kind: str, columns=ROW) -> tuple[str, ...]:
    return tuple(c.name for c in columns if c.kind == kind)


def checks(columns=ROW) -> dict[str, tuple[Callable[[Any], bool], str]]:
    """column -> (check, what it must be): every column a table may hold."""
    return {c.name: KINDS[c.kind] for c in columns}


def run_columns(columns=ROW) -> tuple[Column, ...]:
    """The columns that describe the run, in the order the run is described in."""
    return tuple(sorted((c for c in columns if c.run), key=lambda c: c.run))


def from_result(columns=ROW) -> tuple[Column, ...]:
    return tuple(c for c in columns if c.result)


def _check(columns) -> None:
    seen: set[str] = set()
    for c in columns:
        if c.name in seen or c.kind not in KINDS:
            raise ValueError(f"column {c.name!r}: a second column of that name, or kind "
                             f"{c.kind!r} is not one of {', '.join(KINDS)}")
        seen.add(c.name)


_check(ROW)

COLUMNS = names()
EXTRA_COLUMNS = names(written=False)
