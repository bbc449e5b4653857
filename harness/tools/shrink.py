"""`harness shrink CASE_ID`: the smallest case that still fails the same way.

Greedy delta debugging over the params a failure rarely needs: requests in
the batch, qo/kv lengths, heads (keeping the GQA ratio) and head_dim (only
legal values). A trial is kept when it fails with the same outcome; every
trial runs in its own process, so a crashing or hanging trial is an outcome,
not the end of the shrink, and no params are tried twice (memoized by their JSON).

The result is a regression test: a new case whose derived fields (expect, the refusal
words and the values they name, variant, tag) are rebuilt from the shrunk params by the
family's own `rebuild(case, params)` (cases/gqa.py, strided.py, misplanned.py), with a
distinct id (variant suffix ".shrunk-<hash>"), written as a JSON case file that `repro`
and `check --cases-file` run. A GQA case shrunk to 3 q heads over 2 must then be refused
naming 3 and 2, not the 12 and 8 it started from, so the saved case fails on the library
before its fix and passes after it.
"""
from __future__ import annotations


import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Callable, Iterator

from harness.model.case import Case, dtype_tag
from harness.tools.options import (DEFAULT_TARGET, add_target_options, check_target_options,
                                   count, positive_seconds, target_options)
from harness.results.repro_command import repro_args, typed

LEGAL_HEAD_DIMS = (16, 32, 64, 128, 256)
# A step answers (outcome, passed) for a case, or None when the trial is not a valid case.
Step = Callable[[Case], "tuple[str, bool] | None"]


# ---- candidate params ------------------------------------------------------------------------

def _batch(params: dict) -> int:
    return len(params.get("qo_lens") or ())


def _keep_requests(params: dict, keep: list[int]) -> dict:
    """params with only the requests at `keep`; every per-request list is sliced in lockstep."""
    n = _batch(params)
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in keep]
    return out


def _smaller_ints(n: int, floor: int) -> list[int]:
    """Values below n to try, smallest first: floor, n/2, n-1."""
    return sorted({v for v in (floor, n // 2, n - 1) if floor <= v < n})


def candidates(params: dict) -> Iterator[dict]:
    """Smaller variants of params, the biggest cuts first."""
    n = _batch(params)
    if n > 1:
        yield _keep_requests(params, [0])
        yield _keep_requests(params, list(range(n // 2)))
        yield _keep_requests(params, list(range(n // 2, n)))
        for i in range(n):
            yield _keep_requests(params, [j for j in range(n) if j != i])
    for key in ("kv_lens", "qo_lens"):
        lens = params.get(key)
        if not isinstance(lens, list):
            continue
        if len(set(lens)) > 1 or lens and lens[0] > 1:
            for v in _smaller_ints(max(lens), 1):
                yield {**params, key: [min(x, v) for x in lens]}
        for i, x in enumerate(lens):
            for v in _smaller_ints(x, 1):
                yield {**params, key: lens[:i] + [v] + lens[i + 1:]}
    qo, kv = params.get("num_qo_heads"), params.get("num_kv_heads")
    if isinstance(qo, int) and isinstance(kv, int) and kv > 0:
        # Divide both counts by a common factor: 32 over 8 -> 4 over 1, 12 over 8 -> 3 over 2.
        g = math.gcd(qo, kv)
        for d in sorted((d for d in range(2, g + 1) if g % d == 0), reverse=True):
            yield {**params, "num_qo_heads": qo // d, "num_kv_heads": kv // d}
    elif isinstance(qo, int) and kv is None and qo > 1:
        for v in _smaller_ints(qo, 1):
            yield {**params, "num_qo_heads": v}
    d = params.get("head_dim")
    if isinstance(d, int):
        tied = params.get("head_dim_vo") in (None, d)
        for v in (x for x in LEGAL_HEAD_DIMS if x < d):
            new = {**params, "head_dim": v}
            if tied and "head_dim_vo" in params:
                new["head_dim_vo"] = v
            yield new


def size(params: dict) -> tuple:
    """What shrinking lowers: total work first, then each knob."""
    lens = sum(params.get("qo_lens") or ()) + sum(params.get("kv_lens") or ())
    heads = (params.get("num_qo_heads") or 0) + (params.get("num_kv_heads") or 0)
    return (_batch(params), lens, heads, params.get("head_dim") or 0)


# ---- the shrink loop -------------------------------------------------------------------------

def _family_rebuild(family: str):
    """The family's `rebuild(case, params) -> Case`, or None where it has none."""
    try:
        import cases as families
        return getattr(families.load_family(family), "rebuild", None)
    except (ImportError, ValueError):    # a family of a case file this checkout lacks
        return None


def shrunk_case(case: Case, params: dict) -> Case:
    """The case the family would write for the new params (its refusal words and their
    values, expect, variant and tag rebuilt by the family's own rebuild()), with a distinct
    id (variant suffix ".shrunk-<hash>": never one of the generated ids) and the
    original seed. A family without rebuild() renames the tag's dtype-head summary; its
    expect and words follow the new params by the families' one contract where the case
    followed it, else stay (cases/_expect.py follow)."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    original = case
    if ".shrunk-" in case.variant:
        original = Case(**{**case.to_json(), "variant": case.variant.split(".shrunk-")[0],
                           "refuse_words": case.refuse_words, "requires": case.requires})
    rebuild = _family_rebuild(case.family)
    if rebuild is not None:
        made = rebuild(original, dict(params))
        return Case(route=made.route, family=made.family,
                    variant=f"{made.variant}.shrunk-{digest}", params=made.params,
                    expect=made.expect, refuse_words=made.refuse_words, seed=case.seed,
                    tag=made.tag, requires=made.requires)
    from cases._expect import follow
    must, words = follow(case, params)
    tag = case.tag
    old, new = dtype_tag(case.params), dtype_tag(params)
    if old and old in tag:
        tag = tag.replace(old, new)
    return Case(route=case.route, family=case.family, variant=f"{original.variant}.shrunk-{digest}",
                params=params, expect=must, refuse_words=words,
                seed=case.seed, tag=tag, requires=case.requires)


def memoized(step: Step) -> Step:
    """`step` run once per distinct params: a candidate met again (shrinking revisits the
    same params from different sides) answers from the first trial."""
    seen: dict[str, "tuple[str, bool] | None"] = {}

    def once(case: Case):
        key = json.dumps(dict(case.params), sort_keys=True)
        if key not in seen:
            seen[key] = step(case)
        return seen[key]
    once.seen = seen
    return once


def shrink(case: Case, step: Step, outcome: str | None = None, max_trials: int = 200,
           log: Callable[[str], None] = lambda s: None) -> tuple[Case, str, int]:
    """(smallest failing case, its outcome, trials run). `case` must fail.

    `outcome` is the failure to keep; when None the first step learns it.
    """
    step = memoized(step)
    trials = 0
    if outcome is None:
        first = step(case)
        trials += 1
        log(f"trial {trials}: the case as given -> "
            f"{'invalid' if first is None else first[0] + (' (passes)' if first[1] else '')}")
        if first is None or first[1]:
            raise ValueError(f"{case.id}: the case does not fail ({first}); nothing to shrink")
        outcome = first[0]
    best = dict(case.params)
    progress = True
    while progress and trials < max_trials:
        progress = False
        for params in candidates(best):
            if size(params) >= size(best):
                continue
            if trials >= max_trials:
                break
            if json.dumps(params, sort_keys=True) in step.seen:
                continue     # tried before, and not kept then: the answer is the same
            trials += 1
            try:
                trial = shrunk_case(case, params)
            except ValueError:   # params the case model refuses: not a valid case
                trial = None
            result = step(trial) if trial is not None else None
            same = result is not None and result[0] == outcome and not result[1]
            log(f"trial {trials}: {_diff(best, params)} -> "
                f"{'invalid' if result is None else result[0]}{' (kept)' if same else ''}")
            if same:
                best = params
                progress = True
                break
    final = shrunk_case(case, best) if best != dict(case.params) else case
    return final, outcome, trials


def _diff(old: dict, new: dict) -> str:
    return ", ".join(f"{k}={new[k]}" for k in new if old.get(k) != new[k]) or "(same)"


# ---- trials in a subprocess ------------------------------------------------------------------

def trial_command(case_id: str, case_file: Path, target: str = DEFAULT_TARGET,
                  options: dict | None = None, python: str = "python") -> list[str]:
    """`repro` on a JSON case file: the same command a person re-runs by hand."""
    return [python, "-m", "harness", *repro_args(case_id, target, options, case_file)]


def subprocess_step(target: str = DEFAULT_TARGET, options: dict | None = None,
                    timeout: float = 300.0, python: str | None = None,
                    workdir: str | None = None) -> Step:
    """A step running each trial in the one child runner (harness/engine/child.py): one
    fresh interpreter per trial, the user's environment kept; `options` are the target's.

    A death is the row `check` would write (crash, or hang past the timeout). A trial whose
    row is a harness_error (params the harness refuses, a target that cannot load) is
    invalid: it says nothing about the library.
    """
    from harness.engine import child

    def step(case: Case):
        out = child.run(child.Spec(target=target, cases=[case], options=options or {},
                                   case_timeout=timeout), budget_s=timeout + 60)
        if not out.rows:
            return None
        row = out.rows[-1]
        if row.get("outcome") == "harness_error":
            return None
        return row["outcome"], bool(row["pass"])
    return step


# ---- CLI -------------------------------------------------------------------------------------

def find_case(case_id: str, target: str = DEFAULT_TARGET) -> Case:
    """The case with this id in any profile, as `repro` finds it."""
    from harness.engine.session import all_cases
    from harness.targets import load_target
    for case in all_cases(load_target(target)):
        if case.id == case_id:
            return case
    raise KeyError(case_id)


def write_case_file(case: Case, out_dir: Path) -> Path:
    """The case as a one-element JSON list, the format `--cases-file` reads."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (case.variant.rsplit(".shrunk-", 1)[-1] + ".json")
    path.write_text(json.dumps([case.to_json()], indent=2) + "\n")
    return path


def repro_command(case: Case, case_file: Path, target: str = DEFAULT_TARGET,
                  options: dict | None = None) -> str:
    """The trial's command as a person types it: the `harness` console script."""
    return typed(repro_args(case.id, target, options, case_file))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case_id", metavar="CASE_ID")
    parser.add_argument("--case-json", default=None, metavar="PATH",
                        help="read the case from this JSON file (a case or a one-case list) "
                             "instead of the families")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    add_target_options(parser)
    parser.add_argument("--timeout", type=positive_seconds, default=300.0,
                        help="seconds per trial (then: hang)")
    parser.add_argument("--max-trials", type=count(1), default=200)
    parser.add_argument("--out-dir", default=str(Path("results") / "shrunk"),
                        help="where the shrunk case's JSON file goes [results/shrunk under "
                             "the current folder, as check's tables]")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="kept for old scripts: every trial is printed anyway")


def load_case_json(path: str, target: str | None = None) -> Case:
    """The one case of a case file, checked as a cases file is (its shape and sizes, and,
    with `target`, its route against that target's): ValueError in one line."""
    from harness.model import budget, cases_file
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        if len(data) != 1:
            raise ValueError(f"{path}: expected one case, found {len(data)}")
        data = data[0]
    budget.check_cases([data], str(path))
    routes, name = None, "the target"
    if target is not None:
        from harness.targets import load_target
        loaded = load_target(target)
        routes, name = loaded.routes, f"target {loaded.name!r}"
    return cases_file.check_records([data], str(path), routes, name)[0]


def main(args: argparse.Namespace) -> int:
    try:
        check_target_options(args)
        case = load_case_json(args.case_json, args.target) if args.case_json \
            else find_case(args.case_id, args.target)
    except KeyError:
        print(f"shrink: unknown case id {args.case_id!r}", file=sys.stderr)
        return 4
    except (ValueError, OSError) as why:   # an unknown target, a missing or bad case file
        print(f"shrink: {why}", file=sys.stderr)
        return 2
    step = subprocess_step(args.target, target_options(args), args.timeout)
    # One line per trial as it ends: a shrink runs a process per trial, minutes in all, and
    # a silent one reads as a hang.
    print(f"shrink: {case.id}: up to {args.max_trials} trials, one process each "
          f"(timeout {args.timeout:g} s)", file=sys.stderr, flush=True)

    def log(line: str) -> None:
        print(f"shrink: {line}", file=sys.stderr, flush=True)
    try:
        small, outcome, trials = shrink(case, step, max_trials=args.max_trials, log=log)
    except ValueError as e:
        print(f"shrink: {e}", file=sys.stderr)
        return 1
    case_file = write_case_file(small, Path(args.out_dir)) if small is not case else None
    print(json.dumps({
        "case_id": small.id, "from": case.id, "outcome": outcome, "trials": trials,
        "params": small.params, "case_json": str(case_file) if case_file else None,
        "repro": repro_command(small, case_file, args.target, target_options(args))
        if case_file else None,
    }, indent=2))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="harness shrink")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
