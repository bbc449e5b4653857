"""Do the standalone scripts reproduce their rows? One case (the example) of every failure
class of a table, written as `harness repro CASE --standalone` writes it, run in a fresh
interpreter where the harness cannot be imported, its outcome compared with the row's.

    .venv/bin/python -m benchmarks.repro_agreement --results TABLE [--limit N]

The script's outcome, read from what it printed and how it ended:
  VERDICT <word>...  its one verdict line; <word> is match, wrong, silent, refused or
                     unexpected_refusal; exit 0 when the contract allows it, 1 on the defect
  died of SIGxxx     a negative exit status: the library killed the interpreter
  exit N, no verdict the interpreter ended some other way (a traceback: an error outside
                     the library call, the script's own bug)
  hung               no end within --timeout seconds

Agreement with the row (its outcome, its pass, its message):
  match / wrong / silent / unexpected_refusal / refused / corrupt
                     the same verdict word, and exit 0 exactly when the row passed (a
                     refusal that does not name its field fails on both)
  crash              the script died of the signal the row names (or exited with its code)
  heap-dependent     (not agreement) a silent or wrong row whose script died of SIGSEGV or
                     SIGBUS: an access past a buffer whose effect depends on the process's
                     memory map, which the harness's worker and a fresh script do not share;
                     or a crash row of one heap-overrun end (SIGSEGV, SIGBUS, SIGABRT) whose
                     script had another or hung (a corrupted allocator spinning)
Rows whose outcome no single run of the script can show are never counted as agreeing;
they are listed with a named reason:
  hang               a script that never returns cannot be told from a slow one
  nondeterministic   decided over repeated attempts; a script runs the case once
  corrupt            (only where the target's script carries no canary bands and input
                     fingerprints: its call() defines no corruption(); the bundled
                     target's does, so its corrupt rows must agree like any other)
  harness_error      the harness's own bug, which a script of the library's calls cannot show
  unavailable: ...   the adapter cannot write this case as a script (the reason it gives)
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.tools.standalone import (assert_harness_hidden, isolated_command, isolated_env,
                                      run_isolated)

REPO = Path(__file__).resolve().parents[1]
__all__ = ["assert_harness_hidden", "isolated_command", "isolated_env", "run_script",
           "agreement", "measure"]

VERDICT = re.compile(r"^VERDICT ([a-z_]+)", re.MULTILINE)
_SIGNAL = re.compile(r"\b(SIG[A-Z0-9]+)\b")
_EXIT = re.compile(r"\bexit(?: code| status)? (-?\d+)\b")

# Outcomes a single run of the script cannot show, and why (never counted as agreement).
NOT_REPRODUCIBLE = {
    "hang": "hang: a script that never returns cannot be told from a slow one",
    "nondeterministic": "nondeterministic: decided over repeated attempts; the script runs once",
    "harness_error": "harness_error: the harness's own bug, not the library's",
}


# A corrupt row whose target's script cannot see corruption (its call() defines no
# corruption(): no canary bands, no input fingerprints), never counted as agreement.
NO_CANARIES = ("corrupt: this target's script carries no canary bands or input fingerprints "
               "(its call() defines no corruption()), so no run of it can show the row")


def has_corruption_check(script: str) -> bool:
    """Whether a standalone script checks canaries and inputs (the verdict tail calls the
    call()'s corruption() when the adapter's source defines one)."""
    return re.search(r"^def corruption\(", script, re.MULTILINE) is not None


# A script that dies of a memory fault where the row ran on (silent, wrong): the library
# reads or writes past a buffer, and whether that faults depends on what the process has
# mapped around it, which differs between the harness's worker and a fresh script.
HEAP_DEPENDENT = "heap-dependent"
# The ends a heap overrun can have: a fault, glibc's abort on a corrupted chunk, or (a free
# list overwritten into a cycle) no end at all. A crash row with one and a script with
# another is the same overrun, not agreement.
HEAP_SIGNALS = ("died SIGSEGV", "died SIGBUS", "died SIGABRT")
_REPLAYED = re.compile(r"replay: [^\]]*\((SIG[A-Z0-9]+)\)")


@dataclass
class ScriptResult:
    outcome: str          # a verdict word, "died SIGxxx", "exit N", "hung"
    returncode: int | None
    tail: str             # the last lines it printed, for a disagreement


def run_script(path: Path, workdir: Path, timeout: float = 300,
               python: str = sys.executable) -> ScriptResult:
    """The script in a fresh interpreter (isolated_command) from workdir, outside the repo."""
    try:
        done = run_isolated(path, workdir, timeout, python)
    except subprocess.TimeoutExpired:
        return ScriptResult("hung", None, f"no end after {timeout:g} s")
    text = (done.stdout + done.stderr).strip().splitlines()
    tail = " | ".join(text[-4:])[-600:]
    found = VERDICT.findall(done.stdout)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return ScriptResult(f"died {name}", done.returncode, tail)
    if len(found) == 1 and done.returncode in (0, 1):
        return ScriptResult(found[0], done.returncode, tail)
    return ScriptResult(f"exit {done.returncode}", done.returncode, tail)


def expected_crash(message: str) -> str | None:
    """What a crash row's script must end with: "died SIGxxx" or "exit N"."""
    m = _SIGNAL.search(message or "")
    if m:
        return f"died {m.group(1)}"
    m = _EXIT.search(message or "")
    return f"exit {m.group(1)}" if m else None


def agreement(row: dict, result: ScriptResult) -> tuple[bool, str]:
    """(agrees, why not) of a script's result with the row it was written for."""
    outcome = str(row.get("outcome"))
    if outcome == "crash":
        want = expected_crash(str(row.get("message") or ""))
        if want is None:
            return False, f"the crash row names no signal or exit status: {row.get('message')!r}"
        if result.outcome == want:
            return True, ""
        if want in HEAP_SIGNALS and (result.outcome in HEAP_SIGNALS or result.outcome == "hung"):
            replayed = _REPLAYED.search(str(row.get("message") or ""))
            return False, (f"{HEAP_DEPENDENT}: the row died of {want.split()[1]} and the script "
                           f"{'hung' if result.outcome == 'hung' else 'died of ' + result.outcome.split()[1]}"
                           ": a write past a heap buffer, whose end (glibc's abort, a fault, a "
                           "corrupted allocator spinning) depends on the process's heap"
                           + (f"; the harness's own replay ended {replayed.group(1)}"
                              if replayed and f"({replayed.group(1)})" != f"({want.split()[1]})"
                              else ""))
        return False, f"the row died of {want.split(' ', 1)[1]}, the script: {result.outcome}"
    passed = bool(row.get("pass"))
    if result.outcome in ("died SIGSEGV", "died SIGBUS") and outcome in ("silent", "wrong"):
        return False, (f"{HEAP_DEPENDENT}: the row's run read past its buffers into memory it "
                       f"could read; the script's {result.outcome.split()[1]} is the same "
                       "access landing elsewhere")
    if result.outcome != outcome:
        return False, f"the script says {result.outcome}: {result.tail}"
    if result.returncode != (0 if passed else 1):
        return False, (f"same outcome, but the row {'passed' if passed else 'failed'} and the "
                       f"script exited {result.returncode}")
    return True, ""


def table_rows(path) -> list[dict]:
    from harness.results.table import load_table
    return load_table(path).to_dict("records")


def measure(results, limit: int | None = None, timeout: float = 300,
            out_dir: Path | None = None, echo=print) -> list[dict]:
    """One line a class: {class, case_id, row, script, agree, reason}."""
    import pandas as pd
    from harness.engine.session import all_cases
    from harness.results.failure_classes import failure_classes
    from harness.targets import load_target
    from harness.tools.standalone import Unavailable, plain_row, row_settings, write_standalone
    rows = table_rows(results)
    df = pd.DataFrame(rows)
    classes = failure_classes(df)[:limit] if limit else failure_classes(df)
    work = Path(tempfile.mkdtemp(prefix="repro-agreement-")) if out_dir is None else out_dir
    work.mkdir(parents=True, exist_ok=True)
    assert not str(work.resolve()).startswith(str(REPO)), "the scripts must run outside the repo"
    assert_harness_hidden(work)
    targets, cases = {}, {}
    out = []
    for cls in classes:
        row = plain_row(cls.rows.iloc[0].to_dict())
        line = {"class": cls.slug, "case_id": cls.example, "row": row.get("outcome"),
                "script": "-", "agree": False, "reason": ""}
        out.append(line)
        if row.get("outcome") in NOT_REPRODUCIBLE:
            line["reason"] = NOT_REPRODUCIBLE[row["outcome"]]
            continue
        try:
            spec, guards = row_settings(row)
        except ValueError as why:
            line["reason"] = f"unavailable: {why}"
            continue
        if spec not in targets:
            targets[spec] = load_target(spec)
            cases[spec] = {c.id: c for c in all_cases(targets[spec])}
        case = cases[spec].get(cls.example)
        if case is None:
            line["reason"] = "unavailable: the case is not in this checkout's cases"
            continue
        path = work / f"{cls.slug}.py"
        try:
            write_standalone(case, targets[spec], row, path, guards)
        except Unavailable as why:
            line["reason"] = f"unavailable: {why}"
            continue
        if row.get("outcome") == "corrupt" and not has_corruption_check(path.read_text()):
            line["reason"] = NO_CANARIES
            continue
        result = run_script(path, work, timeout)
        line["script"] = result.outcome
        line["agree"], line["reason"] = agreement(row, result)
        if echo:
            echo(f"  {cls.slug}: row {row.get('outcome')}, script {result.outcome}"
                 f"{'' if line['agree'] else '  <- ' + line['reason']}", file=sys.stderr)
    return out


def table_text(lines: list[dict]) -> str:
    head = ("class", "case id", "row", "script", "agree")
    cells = [(ln["class"], ln["case_id"], str(ln["row"]), ln["script"],
              "yes" if ln["agree"] else "no") for ln in lines]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    text = [fmt.format(*head)] + [fmt.format(*c) + (f"  ({ln['reason']})" if ln["reason"] else "")
                                  for c, ln in zip(cells, lines)]
    n, agree = len(lines), sum(ln["agree"] for ln in lines)
    named = {}
    for ln in lines:
        if not ln["agree"]:
            key = ln["reason"].split(":", 1)[0] if (ln["script"] == "-" or ln["reason"].startswith(
                HEAP_DEPENDENT)) else "disagree"
            named[key] = named.get(key, 0) + 1
    text.append(f"{n} classes, {agree} agree, {n - agree} do not"
                + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(named.items()))})" if named else ""))
    return "\n".join(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="repro_agreement", description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="a results table (JSON lines or CSV)")
    ap.add_argument("--limit", type=int, default=None, help="the first N classes, worst first")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a script may run [300]")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="write the scripts here (outside the repository) instead of a temp dir")
    args = ap.parse_args(argv)
    lines = measure(args.results, args.limit, args.timeout,
                    Path(args.keep).resolve() if args.keep else None)
    print(table_text(lines))
    disagree = [ln for ln in lines if not ln["agree"] and ln["script"] != "-"
                and not ln["reason"].startswith(HEAP_DEPENDENT)]
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
