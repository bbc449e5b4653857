"""A cases file checked against what a run can do with it, before its first case.

budget.load_cases_data checks the file's shape and sizes; this checks each case's fields
for what they mean: a route the target has, features the harness knows, words and
features as lists of strings (a string is not read letter by letter), an expectation
from the list, whole-number seeds, one id per case. A cases file that fails any of these
would otherwise become skipped rows (an unknown route or feature: a run that tested
nothing and passed) or pytest's INTERNALERROR (refuse_words: 5).

Every error is one line naming the file, the case (index and id where it has one), the
field and the value.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Iterable

from harness.model.capabilities import FEATURES, METADATA_FIELDS
from harness.model.case import EXPECTS, Case


class CasesFileError(ValueError):
    """One line: the file, the case, the field, the value and what it must be."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load_file(path: str, source: str, routes: Iterable[str] | None = None,
              target_name: str = "the target") -> list[Case]:
    """The cases of a file read as `check --cases-file` reads one: a JSON list of cases, or
    one case object (as `repro --case-json` takes), shape and sizes checked by budget, then
    each case by check_records. CasesFileError in one line, before any case runs; a file
    that cannot be read is the OSError."""
    from harness.model import budget
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CasesFileError(f"{source}: not UTF-8 text") from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise CasesFileError(f"{source}: not a JSON list of cases ({e})") from None
    data = [data] if isinstance(data, dict) else data
    try:
        budget.check_cases(data, source)
    except budget.CasesFileError as e:    # one error type for this loader's callers
        raise CasesFileError(str(e)) from None
    return check_records(data, source, routes, target_name)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _near(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _strings(record: dict, key: str, where: str) -> list[str]:
    value = record.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CasesFileError(f"{where}: {key!r} must be a list of strings, got {_show(value)}")
    return value


def check_records(data: list, source: str, routes: Iterable[str] | None = None,
                  target_name: str = "the target") -> list[Case]:
    """The cases of a cases file's records (already shape-checked by budget), or
    CasesFileError. `routes`: the target's routes (None: any route)."""
    routes = None if routes is None else set(routes)
    cases, seen = [], {}
    for i, record in enumerate(data):
        where = f"{source}: case {i}"
        route = record.get("route")
        if routes is not None and route not in routes:
            raise CasesFileError(f"{where}: route {_show(route)} is not a route of "
                                 f"{target_name}{_near(str(route), routes)}; its routes: "
                                 f"{', '.join(sorted(routes))}")
        _strings(record, "refuse_words", where)
        # A case needs features and the metadata fields it bends ("metadata.kv_lens"), as
        # the families write them (Capabilities.lacks reads both).
        needs = FEATURES | {f"metadata.{f}" for f in METADATA_FIELDS}
        for feature in _strings(record, "requires", where):
            if feature not in needs:
                raise CasesFileError(f"{where}: 'requires' names {feature!r}, not a feature"
                                     f"{_near(feature, needs)}; features: "
                                     f"{', '.join(sorted(FEATURES))}")
        if record.get("expect", "match") not in EXPECTS:
            raise CasesFileError(f"{where}: 'expect' must be one of {', '.join(EXPECTS)}, got "
                                 f"{_show(record.get('expect'))}")
        seed = record.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise CasesFileError(f"{where}: 'seed' must be a whole number or null, got "
                                 f"{_show(seed)}")
        if not isinstance(record.get("tag", ""), str):
            raise CasesFileError(f"{where}: 'tag' must be a string, got {_show(record['tag'])}")
        try:
            case = Case.from_json(record)
        except (ValueError, TypeError, KeyError) as e:
            raise CasesFileError(f"{where}: {' '.join(str(e).split())}") from None
        if case.id in seen:
            raise CasesFileError(f"{where}: id {case.id!r} is also case {seen[case.id]}'s; a "
                                 f"run has one row per case, so each id appears once")
        seen[case.id] = i
        cases.append(case)
    return cases
