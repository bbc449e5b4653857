"""`check`'s options, declared once.

`harness check` (argparse, harness/tools/options.py) and the pytest session it starts (the
plugin's addoption, harness/engine/plugins/options.py) take the same options; both are made
from TABLE below, and so is the list `check` hands its pytest child. An option only one side
takes says so (cli=False: pytest's alone; pytest=False: the command line's alone). A
target's own options (its descriptor's OPTIONS) are made from the descriptors, not here.

The command line validates a value as it parses it (`type`: a bad one is one line and exit
2); where pytest's reading differs (`pytest_type`), the plugin judges the value itself before
the first case (plugins/options.py setup_errors), so a bad one is still one line.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable

from harness.model.routes import DEFAULT_TARGET

_SAME = object()   # pytest reads the value with the command line's type


# ---- argparse types: a bad value is one line naming it ----------------------------------

def absolute_path(text: str) -> str:
    """argparse type for paths a child process reads from another folder."""
    return os.path.abspath(os.path.expanduser(text))


def shard_spec(text: str) -> str:
    """argparse type for --shard: I/N, kept as its label."""
    from harness.model.shard import ShardError, parse
    try:
        return parse(text).label
    except ShardError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[-1]) from None


def positive_seconds(text: str) -> float:
    """argparse type for --case-timeout: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, got {text!r}")
    return value


def count(minimum: int):
    """argparse type: an int >= minimum, or one line naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value
    return parse


def workers(text: str) -> str:
    """argparse type for -n: auto, logical, or a whole number of xdist workers (0: none)."""
    if text in ("auto", "logical"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto, logical or a whole number of workers, "
                                         f"got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more workers, got {value}")
    return str(value)


# NVIDIA compute-sanitizer's tools `check --sanitizer` replays a row under
# (harness/tools/sanitizer.py).
SANITIZER_TOOLS = ("memcheck", "initcheck", "racecheck")


# ---- the table ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckOption:
    flag: str
    help: str
    default: Any = None
    type: Callable | None = None      # the command line's (it validates)
    pytest_type: Any = _SAME          # pytest's, where it differs (the plugin validates)
    choices: tuple | None = None
    action: str | None = None         # "store_true": a flag without a value
    metavar: str | None = None
    selection: bool = False           # selects cases: `harness list` takes it too
    cli: bool = True                  # `harness check` takes it
    pytest: bool = True               # the plugin declares it
    handed: bool = True               # check hands the parsed value to its pytest child

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def cli_kwargs(self) -> dict:
        return self._kwargs(self.type)

    def pytest_kwargs(self) -> dict:
        return self._kwargs(self.type if self.pytest_type is _SAME else self.pytest_type)

    def _kwargs(self, type_) -> dict:
        kw: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.action:
            kw["action"] = self.action
            return kw
        kw["default"] = self.default
        for key, value in (("type", type_), ("choices", self.choices),
                           ("metavar", self.metavar)):
            if value is not None:
                kw[key] = value
        return kw

    def as_child_arg(self, value) -> str | None:
        """The pytest child's argument for a parsed value; None when there is none to pass."""
        if self.action == "store_true":
            return self.flag if value else None
        # One token, option=value: a value that starts with "-" must not read as an option.
        return None if value is None else f"{self.flag}={value}"


TABLE: tuple[CheckOption, ...] = (
    CheckOption("--target", "library under test: a name, package.module:factory or "
                "path/to/file.py [bundled]", default=DEFAULT_TARGET, selection=True),
    CheckOption("--family", "case families, comma-separated [all]", selection=True),
    CheckOption("--route", "routes, comma-separated [all the target's]", selection=True),
    CheckOption("--case-id", "only cases whose id contains this substring", selection=True),
    CheckOption("--cases-file", "run the cases in this JSON file (Case.to_json list) instead "
                "of families", type=absolute_path, pytest_type=None, selection=True),
    # The child's share comes as HARNESS_SHARD (harness/model/shard.py), not as an option.
    CheckOption("--shard", "this machine's share of the selection: shard I of N, balanced "
                "by estimated cost, the same on every machine (docs/ci.md)", type=shard_spec,
                metavar="I/N", selection=True, pytest=False, handed=False),
    CheckOption("--profile", "how many cases: ci (minutes on 2 cores) or full (thousands, "
                "for a GPU) [full with a GPU, else ci]", choices=("ci", "full"),
                selection=True),
    CheckOption("--resume", "continue a run: skip cases that already have a row in the "
                "table, and keep its run id", action="store_true"),
    CheckOption("--repeat", "run each case N times in its worker and compare the answers "
                "bitwise [1 on the host, 2 with a GPU]", type=count(1), pytest_type=int),
    # check names the child's table itself (--results, else under --results-dir).
    CheckOption("--results", "table path [results/<target>-<arch>-<commit>.jsonl under "
                "--results-dir, else ./results]", handed=False),
    CheckOption("--case-timeout", "seconds per case before it is a hang (plus a per-element "
                "allowance)", type=positive_seconds, pytest_type=float),
    CheckOption("--run-id", "run id recorded on every row"),
    CheckOption("--max-case-bytes", "a case whose inputs and reference are estimated past "
                "this many bytes is a skipped row [half of MemAvailable]", type=count(1),
                pytest_type=int),
    CheckOption("--no-replay", "skip culprit replay of crashes (rows get isolation '' unless "
                "alone)", action="store_true", cli=False),
    # `harness check`'s alone: what it settles itself (pytest's own -n and --reruns it
    # hands to the child in harness/tools/check.py pytest_command), or what it does
    # with the table after the run.
    CheckOption("-n", "xdist workers: auto, logical or a number [auto]; 0 runs in the one "
                "pytest process", default="auto", type=workers, pytest=False),
    CheckOption("--reruns", "reruns of a failing case [0]; every attempt is kept and a "
                "failing attempt fails the row", default=0, type=count(0), pytest=False),
    CheckOption("--strict", "capability and clarity findings fail the run for every target",
                action="store_true", pytest=False),
    CheckOption("--results-dir", "folder for tables [./results]", type=absolute_path,
                pytest=False),
    CheckOption("--html", "render this run's HTML report here", pytest=False),
    CheckOption("--markdown", "render this run's Markdown summary here", pytest=False),
    CheckOption("--ledger", "known-failures ledger [cases/known_failures.json]", pytest=False),
    CheckOption("--sanitizer", "after the run, replay each failing row under NVIDIA "
                "compute-sanitizer with this tool and keep its first report in the row (GPU "
                "only)", choices=SANITIZER_TOOLS, pytest=False),
    CheckOption("--sanitizer-all", "with --sanitizer: replay every row, not only the failing "
                "ones", action="store_true", pytest=False),
    CheckOption("--junitxml", "also write the rows as JUnit XML here (docs/ci.md)",
                metavar="FILE", pytest=False),
    CheckOption("--summary-json", "also write the run's summary JSON here (schema: docs/ci.md)",
                metavar="FILE", pytest=False),
)


def selection() -> tuple[CheckOption, ...]:
    """The options that select cases, as `harness list` and `harness check` take them."""
    return tuple(o for o in TABLE if o.cli and o.selection)


def run_options() -> tuple[CheckOption, ...]:
    """`harness check`'s other options: those its pytest child takes too, and its own."""
    return tuple(o for o in TABLE if o.cli and not o.selection)


def plugin_options() -> tuple[CheckOption, ...]:
    return tuple(o for o in TABLE if o.pytest)


def handed() -> tuple[CheckOption, ...]:
    """What `check` passes its pytest child: every option both take, but what check
    settles itself."""
    return tuple(o for o in TABLE if o.cli and o.pytest and o.handed)


def child_args(args) -> list[str]:
    """The pytest child's arguments for the handed options `args` holds."""
    out = []
    for opt in handed():
        arg = opt.as_child_arg(getattr(args, opt.dest, None))
        if arg is not None:
            out.append(arg)
    return out
