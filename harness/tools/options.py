"""What every subcommand shares: exit codes, argument types, the case selection options."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from harness.engine.child import child_env  # noqa: F401  (one environment for every child)

from harness.model.routes import DEFAULT_TARGET  # noqa: E402,F401
ROOT = Path(__file__).resolve().parents[2]
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_UNKNOWN_CASE, EXIT_BUILD = 0, 1, 2, 4, 5
# check: every selected case was skipped (nothing tested); the selection is empty.
EXIT_NOT_TESTED, EXIT_EMPTY = 3, 4
EXIT_INTERRUPTED, EXIT_PIPE = 130, 141   # the shell's codes for SIGINT and SIGPIPE


def input_errors() -> tuple:
    """What reading the options raises on bad input: an unknown name (ValueError,
    pytest.UsageError) or a missing or unreadable file (OSError). Caught only
    around that reading, so a harness bug elsewhere keeps its traceback."""
    import pytest
    return (ValueError, OSError, pytest.UsageError)


def selection_errors() -> tuple:
    """input_errors(), plus a target whose library is missing or cannot run here
    (the flashinfer target without FlashInfer or a GPU): its message says what to install."""
    return (RuntimeError, ImportError, *input_errors())


def absolute_path(text: str) -> str:
    """argparse type for paths a child process reads from another folder."""
    return os.path.abspath(os.path.expanduser(text))


def add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="library under test: a name, package.module:factory or path/to/file.py "
                        "[bundled]")
    p.add_argument("--family", default=None, help="families, comma-separated [all]")
    p.add_argument("--route", default=None, help="routes, comma-separated [all]")
    p.add_argument("--case-id", default=None, help="only ids containing this substring")
    p.add_argument("--cases-file", default=None, type=absolute_path,
                   help="a JSON list of cases instead of families")
    p.add_argument("--shard", default=None, type=shard_spec, metavar="I/N",
                   help="this machine's share of the selection: shard I of N, balanced by "
                        "estimated cost, the same on every machine (docs/ci.md)")
    p.add_argument("--profile", default=None, choices=("ci", "full"),
                   help="how many cases: ci (minutes on 2 cores) or full (thousands, for a GPU) "
                        "[full with a GPU, else ci]")


def add_target_options(p: argparse.ArgumentParser) -> None:
    """Each in-tree target's options (its descriptor's OPTIONS), as flags: a target's option
    is declared once, where the target is described."""
    from harness.engine.session import declared_options
    for opt in declared_options():
        p.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar,
                       help=opt.help)


def target_options(args) -> dict:
    """The target options given on the command line ({name: value}, the set ones)."""
    from harness.engine.session import declared_options
    from harness.model.target_options import given
    return given({o.name: getattr(args, o.name, None) for o in declared_options()})


def options_said(options) -> str:
    """Target options {name: value}, as a run's summary says them ('' for none)."""
    from harness.engine.session import declared_options
    from harness.model.target_options import given
    options = given(options)
    return "; ".join(o.said(options[o.name]) for o in declared_options() if o.name in options)


def check_target_options(args) -> None:
    """The target judges its options: ValueError naming the option and the value."""
    from harness.engine.session import check_target_options as check
    check(target_options(args), args.target)


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


def select(args):
    from harness.engine.session import csv_list, select_cases
    return select_cases(args.target, csv_list(args.family), csv_list(args.route), args.case_id,
                        args.cases_file, getattr(args, "profile", None),
                        getattr(args, "shard", None))
