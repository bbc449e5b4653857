"""What every subcommand shares: exit codes, argument types, the case selection options."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.engine import check_options
from harness.engine.check_options import (absolute_path, count,  # noqa: F401 (the CLI's types)
                                          positive_seconds, shard_spec, workers)
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


def add_selection(p: argparse.ArgumentParser) -> None:
    """The options that select cases (`list`, `check`): harness/engine/check_options.py."""
    for opt in check_options.selection():
        p.add_argument(opt.flag, **opt.cli_kwargs())


def add_run_options(p: argparse.ArgumentParser) -> None:
    """`check`'s other options (harness/engine/check_options.py)."""
    for opt in check_options.run_options():
        p.add_argument(opt.flag, **opt.cli_kwargs())


def add_target_options(p: argparse.ArgumentParser) -> None:
    """Each in-tree target's options (its descriptor's OPTIONS), as flags: a target's option
    is declared once, where the target is described."""
    from harness.engine.session import declared_options
    for opt in declared_options():
        p.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar,
                       help=opt.help)


def target_options(args) -> dict:
    """The target options given on the command line ({name: value}, the set ones)."""
    from harness.engine.session import given_options
    return given_options(lambda name: getattr(args, name, None))


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


def select(args):
    from harness.engine.session import csv_list, select_cases
    return select_cases(args.target, csv_list(args.family), csv_list(args.route), args.case_id,
                        args.cases_file, getattr(args, "profile", None),
                        getattr(args, "shard", None))
