"""`harness explore`: property-based search that shrinks failures to case files.

Hypothesis draws cases from harness/tools/strategies.py (the families' params, valid and
adversarial) and the property is "the row passes". Each failing class of rows is
shrunk by Hypothesis to a minimal case and saved under --out as a case file (a JSON
list of one case) that `repro CASE_ID --case-json FILE` and `check --cases-file FILE`
replay.

A failure class is (family, outcome) for an adversarial family: the input is the
suspect, whatever route shows it. For a valid input the route is the suspect, so a
class is (valid, route, outcome). Once a class is found, the search goes on with that
class counted as passing, until the budget runs out.

Every example runs in a child process forked from this one, which has imported the
harness and the target but never ran a kernel or touched a device: a case that kills
its process (SIGFPE, SIGSEGV with guards off) is a `crash` row, one past its timeout a
`hang` row, and nothing one case does to its process reaches the next. A found case is
then replayed by `repro --json` in a fresh interpreter (harness/tools/shrink.py's
subprocess_step); a class whose replay disagrees is reported as such, never dropped.

Search rounds take turns between the families; round r of seed S draws from
Random("S/r"), so a seed repeats its search as far as the budget lets it get. Under a
fixed seed Hypothesis keeps no example database; the case files play that part: a
search first re-runs those already in --out (--no-saved skips them), and a class one
still shows is found at the cost of one run. Examples a round would run after the
budget, or after its shrink allowance, count as passing without running: they only
stop the search, and no verdict rests on them. The budget bounds the search; the
fresh-process replay of the class found last may end a few seconds after it.

Exit: 0 no failure found, 1 failures found, 2 bad options (or no case ran at all),
130 interrupted (what was found so far is printed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.model.case import Case
from harness.model.routes import DEFAULT_TARGET
from harness.model.target_options import given
from harness.tools.options import add_target_options, options_said, target_options

EXIT_PASS, EXIT_FOUND, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
ROUND_EXAMPLES = 40        # examples a search round generates before the next family's turn
SHRINK_SHARE = 0.2         # of the budget, at most, that shrinking one class may take
MIN_SHRINK_S = 10.0


# ---- options --------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_budget(text: str) -> float:
    """Seconds in "90s", "2m", "1.5h" or "120"; ValueError naming the value otherwise."""
    m = _DURATION.match(text or "")
    if not m:
        raise ValueError(f"--budget: expected a duration like 90s, 2m or 1h, got {text!r}")
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"--budget: must be above 0, got {text!r}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Values are read as text and checked in main, so a bad one is one line naming it.
    parser.add_argument("--target", default=DEFAULT_TARGET, help="library under test [bundled]")
    parser.add_argument("--route", default=None, help="routes, comma-separated [all the target's]")
    parser.add_argument("--family", default=None,
                        help="families whose space to search, comma-separated "
                             "(valid, strided, misplanned, gqa) [all]")
    parser.add_argument("--budget", default="2m", help="wall-clock search budget: 90s, 10m, 1h [2m]")
    parser.add_argument("--seed", default="0", help="search seed [0]")
    parser.add_argument("--examples", default=None,
                        help="stop after this many cases run, whatever the budget left "
                             "[the budget alone]")
    add_target_options(parser)
    parser.add_argument("--out", default=str(Path("results") / "explore"),
                        help="folder for shrunk case files [results/explore]")
    parser.add_argument("--case-timeout", default=None,
                        help="seconds before a case is a hang (plus a per-element allowance) "
                             "[the check default]")
    parser.add_argument("--no-saved", action="store_true",
                        help="do not re-run the case files already in --out first")


@dataclass
class Options:
    target: str
    routes: list[str]
    families: list[str]
    budget_s: float
    seed: int
    out: Path
    case_timeout: float | None
    saved: bool
    # Cases drawn before the search stops, whatever the clock says: a search bounded by
    # a count gives the same result on a loaded machine as on a quiet one.
    max_examples: int | None = None
    options: dict = field(default_factory=dict)    # the target's {name: value}


def _init(self, *args, options=None, **kw):   # Options(..., <option name>=value) adds one
    named = {k: kw.pop(k) for k in list(kw) if k not in Options.__dataclass_fields__}
    _fields_init(self, *args, options=given({**(options or {}), **named}), **kw)


_fields_init, Options.__init__ = Options.__init__, _init


def read_options(args) -> Options:
    """Options from parsed args; ValueError (one line naming the option) on a bad one."""
    from harness.engine.session import csv_list
    from harness.tools.strategies import FAMILIES, routes_for
    from harness.targets import load_target

    budget = parse_budget(args.budget)
    try:
        seed = int(args.seed)
    except (TypeError, ValueError):
        raise ValueError(f"--seed: must be a whole number, got {args.seed!r}") from None
    timeout = None
    if args.case_timeout is not None:
        try:
            timeout = float(args.case_timeout)
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise ValueError(f"--case-timeout: must be a number of seconds above 0, "
                             f"got {args.case_timeout!r}")
    families = csv_list(args.family) or list(FAMILIES)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"--family: unknown {unknown}; explore searches {list(FAMILIES)}")
    target = load_target(args.target)       # ValueError naming an unknown target
    target.validate_options(target_options(args))   # ValueError: the target's own words
    routes = list(target.routes)
    wanted = csv_list(args.route)
    if wanted:
        missing = [r for r in wanted if r not in routes]
        if missing:
            raise ValueError(f"--route: {args.target} has no route {missing}; its routes: {routes}")
        routes = [r for r in routes if r in wanted]
    fields = getattr(target.capabilities, "metadata", None)
    families = [f for f in families if routes_for(f, routes, fields)]
    if not families:
        raise ValueError(f"--family: none of {csv_list(args.family) or list(FAMILIES)} "
                         f"covers the routes {routes}")
    examples = None
    if args.examples is not None:
        try:
            examples = int(args.examples)
        except ValueError:
            examples = 0
        if examples < 1:
            raise ValueError(f"--examples: must be a whole number above 0, got {args.examples!r}")
    return Options(args.target, routes, families, budget, seed,
                   Path(args.out), timeout, not args.no_saved, examples,
                   options=target_options(args))


# ---- running one case in a forked child -----------------------------------------------------

class ForkRunner:
    """Runs each case in a child forked from this process, which stays clean: it imports
    what a case needs (so children start warm) but never runs a kernel, so no device
    context is copied into a child half-made.

    Children run single-threaded. A target may compute while it loads (torch-sdpa probes
    its backends), which starts OpenMP's thread pool in this process, and a forked child
    entering a parallel region would wait forever for pool threads it does not have
    (torch and the bundled kernels share one libgomp). One thread is also the faster
    choice for the small cases drawn here: 100 drawn valid cases took 5.5 s against
    13-18 s with the default threads on a loaded 2-core host.
    """

    def __init__(self, target_name: str, options: dict | None = None):
        self.target_name, self.options = target_name, dict(options or {})
        import torch
        from harness.engine import execute, perform  # noqa: F401  (warm for the children)
        from harness.model import reference
        from harness.engine.session import load_runner
        self.target = load_runner(target_name, self.options)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # A child forked after CUDA is up cannot use it, and its errors would read as
            # the library refusing: say so instead of exploring.
            raise RuntimeError(f"--target: loading {target_name} initialized CUDA in this "
                               f"process, so its forked children could not run cases")
        self.context = {"target": self.target.name, **self.target.options_in_effect()}

    def run(self, case: Case, timeout_s: float, cut_s: float) -> dict | None:
        """The case's row, from a child forked through the one child runner
        (harness/engine/child.py). A child still running after timeout_s is a `hang` row;
        one still running at cut_s (< timeout_s: the caller's budget ends first) is killed
        and None returned, since nothing is known about it."""
        from harness.engine import child
        from harness.engine.session import resolve_repeat
        spec = child.Spec(target=self.target_name, cases=[case], repeat=resolve_repeat(None),
                          case_timeout=timeout_s, options=self.options)
        budget = min(timeout_s, cut_s) + 1.0
        if threading.active_count() > 1:
            # Other threads (a test runner's, a library's) may hold locks a forked child
            # would wait on forever: a clean fork server forks the child instead.
            from harness.engine import forkserver
            out = forkserver.run_spec(spec, budget)
        else:
            out = child.run(spec, budget_s=budget, fork_from=self.target)
        if out.killed and cut_s < timeout_s:
            return None
        if not out.rows:
            from harness.model.classify import harness_error_verdict
            from harness.engine.row import from_verdict
            return from_verdict(case, harness_error_verdict(
                "the explorer's child could not report its row"), **self.context)
        return out.rows[-1]


# ---- failure classes ------------------------------------------------------------------------

def class_of(case: Case, row: dict) -> tuple:
    family = case.variant.split(".", 1)[0]
    if family == "valid":
        return (family, case.route, row["outcome"])
    return (family, row["outcome"])


def class_label(key: tuple) -> str:
    return "/".join(key)


@dataclass
class Finding:
    key: tuple
    case: Case
    row: dict
    found_after: int               # cases run when the class was first seen
    shrink_runs: int               # cases run while shrinking it
    shrink_s: float
    path: Path | None = None
    replay: tuple | None = None    # (outcome, passed) in a fresh process; None: no row
    saved: bool = False            # shown by a case file an earlier search saved
    shrunk: bool = True            # False: seen while shrinking another class, kept as seen


@dataclass
class Stats:
    ran: int = 0
    skipped: int = 0
    cut: int = 0                   # killed when the budget or a shrink allowance ran out
    rounds: int = 0
    search_s: float = 0.0
    replay_s: float = 0.0
    notes: list = field(default_factory=list)


# ---- the search -----------------------------------------------------------------------------

class Explorer:
    def __init__(self, opts: Options, run: Callable[[Case, float, float], dict | None],
                 log: Callable[[str], None] = lambda s: None, fields=None):
        self.opts, self._run, self.log = opts, run, log
        # The metadata fields the target's signature reaches: misplanned draws only those.
        self.fields = None if fields is None else frozenset(fields)
        self.found: dict[tuple, Finding] = {}
        # Classes seen only while shrinking another: a later round may find them again;
        # those it does not are reported as first seen, unshrunk, never dropped.
        self.pending: dict[tuple, tuple[Case, dict]] = {}
        self.cache: dict[str, dict | None] = {}
        self.stats = Stats()
        self.start = time.monotonic()
        self.deadline = self.start + opts.budget_s
        self.shrink_allowance = max(MIN_SHRINK_S, SHRINK_SHARE * opts.budget_s)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def shrink_spent(self, ran_at_find: int) -> bool:
        """A count-bounded search gives each shrink its share of the examples, as a
        clock-bounded one gives it its share of the time."""
        n = self.opts.max_examples
        return n is not None and self.stats.ran - ran_at_find >= max(1, int(SHRINK_SHARE * n))

    def spent(self) -> bool:
        """The example count, when one bounds the search, is used up."""
        return self.opts.max_examples is not None and self.stats.ran >= self.opts.max_examples

    def result(self, case: Case, stop_at: float) -> dict | None:
        """The case's row (run once, then remembered), or None when it cannot run before
        stop_at."""
        key = json.dumps(case.to_json(), sort_keys=True)
        if key in self.cache:
            return self.cache[key]
        now = time.monotonic()
        if now >= stop_at or self.spent():
            return None
        from harness.engine.isolation import case_timeout
        timeout = case_timeout(dict(case.params), self.opts.case_timeout)
        row = self._run(case, timeout, stop_at - now)
        if row is None:
            self.stats.cut += 1
            return None
        self.stats.ran += 1
        self.stats.skipped += row["outcome"] == "skipped"
        self.cache[key] = row
        return row

    def search(self) -> None:
        """Saved cases first, then search rounds until the budget runs out."""
        try:
            if self.opts.saved:
                self.replay_saved()
            while self.left() > 0 and not self.spent():
                self.search_round()
            for key, (case, row) in list(self.pending.items()):
                if key not in self.found:
                    self.log(f"explore: {class_label(key)} was seen only while shrinking "
                             f"another class: kept as seen ({case.id})")
                    finding = Finding(key, case, row, self.stats.ran, 0, 0.0, shrunk=False)
                    finding.path = write_case(case, row["outcome"], self.opts.out)
                    self.confirm(finding)
                    del self.pending[key]
        finally:
            self.stats.search_s = time.monotonic() - self.start

    def replay_saved(self) -> None:
        """Re-run the case files an earlier search left in --out: a class one of them
        still shows is found without spending the search on it again."""
        from harness.tools.strategies import FAMILY
        for path in sorted(self.opts.out.glob("*.json")):
            try:
                saved = [Case.from_json(d) for d in json.loads(path.read_text())]
            except (ValueError, TypeError, KeyError, OSError):
                continue       # not a case file
            for case in saved:
                family = case.variant.split(".", 1)[0]
                if case.family != FAMILY or family not in self.opts.families \
                        or case.route not in self.opts.routes:
                    continue
                row = self.result(case, self.deadline)
                if row is None or row["pass"] or class_of(case, row) in self.found:
                    continue
                finding = Finding(class_of(case, row), case, row, self.stats.ran, 0, 0.0,
                                  path=path, saved=True)
                self.log(f"explore: {class_label(finding.key)} still shown by {path}")
                self.confirm(finding)

    def search_round(self) -> None:
        """One family's turn: Hypothesis draws until a class not found yet fails, then
        shrinks it while it fails in that class."""
        from hypothesis import Phase, Verbosity, find, settings
        from hypothesis.errors import Flaky, NoSuchExample, Unsatisfiable

        from harness.tools.strategies import cases
        r = self.stats.rounds
        family = self.opts.families[r % len(self.opts.families)]
        self.stats.rounds += 1
        state = {"key": None, "t0": 0.0, "ran0": 0}

        def condition(case: Case) -> bool:
            stop = self.deadline
            if state["key"] is not None:
                stop = min(stop, state["t0"] + self.shrink_allowance)
                known = json.dumps(case.to_json(), sort_keys=True) in self.cache
                if not known and self.shrink_spent(state["ran0"]):
                    return False   # the class is kept as shrunk so far
            row = self.result(case, stop)
            if row is None or row["pass"]:
                return False
            key = class_of(case, row)
            if key in self.found:
                return False
            if state["key"] is None:
                self.pending.pop(key, None)
                state.update(key=key, t0=time.monotonic(), ran0=self.stats.ran)
                self.log(f"explore: {class_label(key)} after {self.stats.ran} case(s) "
                         f"({case.id}: {row['message'][:200]}); shrinking")
            if key != state["key"]:
                self.pending.setdefault(key, (case, row))
            return key == state["key"]

        # A seeded search: Hypothesis keeps no example database under a fixed seed (the
        # saved case files play that part), so the phases are generate and shrink.
        config = settings(max_examples=ROUND_EXAMPLES, deadline=None,
                          phases=[Phase.generate, Phase.shrink], verbosity=Verbosity.quiet)
        try:
            small = find(cases(self.opts.routes, family, self.fields), condition,
                         settings=config,
                         random=random.Random(f"{self.opts.seed}/{r}"))
        except NoSuchExample:
            return
        except Unsatisfiable as why:
            self.stats.notes.append(f"round {r} ({family}): {why}")
            return
        except Flaky as why:
            # A case whose verdict changed between two runs of it (the budget or the
            # shrink share ran out between them): the round ends, and what it found is kept.
            self.stats.notes.append(f"round {r} ({family}): {type(why).__name__}")
            return
        row = self.cache[json.dumps(small.to_json(), sort_keys=True)]
        finding = Finding(class_of(small, row), small, row, state["ran0"],
                          self.stats.ran - state["ran0"], time.monotonic() - state["t0"])
        self.log(f"explore: {class_label(finding.key)} shrunk to {small.id} in "
                 f"{finding.shrink_runs} case(s), {finding.shrink_s:.1f} s")
        finding.path = write_case(small, row["outcome"], self.opts.out)
        self.confirm(finding)

    def confirm(self, finding: "Finding") -> None:
        """Record a finding after replaying its case by `repro --json` in a fresh process
        (harness/tools/shrink.py's trial step): what a person re-running it will see."""
        from harness.engine.isolation import case_timeout
        from harness.tools.shrink import subprocess_step
        start = time.monotonic()
        step = subprocess_step(self.opts.target, self.opts.options,
                               timeout=case_timeout(dict(finding.case.params),
                                                    self.opts.case_timeout))
        finding.replay = step(finding.case)
        self.stats.replay_s += time.monotonic() - start
        self.found[finding.key] = finding


def write_case(case: Case, outcome: str, out: Path) -> Path:
    """The case as a one-element JSON list (what --cases-file and --case-json read)."""
    digest = hashlib.sha256(case.id.encode()).hexdigest()[:10]
    family = case.variant.split(".", 1)[0]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{outcome}-{family}-{case.op}-{digest}.json"
    path.write_text(json.dumps([case.to_json()], indent=2) + "\n")
    return path


# ---- CLI ------------------------------------------------------------------------------------

def report_lines(explorer: Explorer) -> list[str]:
    """One line per class (outcome, case id, file), then what the search did."""
    lines = []
    for f in explorer.found.values():
        line = f"{f.row['outcome']:<18} {f.case.id}  {f.path}"
        if f.saved:
            line += "  [saved earlier]"
        if not f.shrunk:
            line += "  [not shrunk: seen while shrinking another class]"
        if f.replay is None:
            line += "  [fresh-process replay gave no row]"
        elif f.replay != (f.row["outcome"], bool(f.row["pass"])):
            line += f"  [fresh-process replay: {f.replay[0]}]"
        lines.append(line)
    s, o = explorer.stats, explorer.opts
    differ = sum(f.replay != (f.row["outcome"], bool(f.row["pass"]))
                 for f in explorer.found.values())
    tail = (f"explore: {s.ran} cases run ({s.skipped} skipped by the target"
            + (f", {s.cut} more stopped unfinished when their time ran out" if s.cut else "")
            + f") in {s.rounds} rounds, {s.search_s:.1f} s ({s.replay_s:.1f} s of it "
              f"replaying found cases in fresh processes); seed {o.seed}, target {o.target}"
              + (f", {said}" if (said := options_said(o.options)) else "")
            + f"; {len(explorer.found)} failure class(es)")
    if differ:
        tail += f", {differ} of them not the same in a fresh process"
    lines.append(tail)
    return lines


def main(args: argparse.Namespace) -> int:
    try:
        opts = read_options(args)
    except (ValueError, ImportError, RuntimeError) as why:
        print(f"explore: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        runner = ForkRunner(opts.target, opts.options)
    except RuntimeError as why:
        print(f"explore: {why}", file=sys.stderr)
        return EXIT_USAGE
    fields = getattr(getattr(runner.target, "capabilities", None), "metadata", None)
    explorer = Explorer(opts, runner.run, log=lambda s: print(s, file=sys.stderr, flush=True),
                        fields=fields)
    try:
        explorer.search()
    except KeyboardInterrupt:
        for line in report_lines(explorer):
            print(line)
        print(f"explore: interrupted; {len(explorer.pending)} class(es) seen while shrinking "
              f"another were not saved", file=sys.stderr)
        return EXIT_INTERRUPTED
    for line in report_lines(explorer):
        print(line)
    for note in explorer.stats.notes:
        print(f"explore: note: {note}", file=sys.stderr)
    if explorer.found:
        return EXIT_FOUND
    if explorer.stats.ran == explorer.stats.skipped:
        print("explore: no case ran to a verdict, so nothing was tested", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PASS


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="harness explore")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
