"""The check's options as pytest declares them, and the set-up checks made before any case.

Everything here is ours (an option, an environment variable, a cases file): a bad one is one
line before the first case, never a row that blames the library."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone

import pytest

from harness.engine import run_plan
from harness.engine.check_options import plugin_options
from harness.engine.session import (check_target_options, declared_options, given_options,
                                    run_shard)
from harness.model import target_options

KERNEL_PLATFORMS = run_plan.KERNEL_PLATFORMS


def pytest_addoption(parser):
    """The run's options (harness/engine/check_options.py, the table `harness check`'s are
    made from too) and each in-tree target's own (its descriptor's OPTIONS)."""
    g = parser.getgroup("harness", "attention harness")
    for opt in plugin_options():
        g.addoption(opt.flag, **opt.pytest_kwargs())
    for opt in declared_options():
        g.addoption(opt.flag, dest=opt.name, default=None, metavar=opt.metavar, help=opt.help)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def selection_of(config) -> str:
    return run_plan.selection_of(config.getoption, run_shard())


def run_options(config) -> dict:
    """The target options this run was given ({name: value}, the set ones)."""
    return given_options(config.getoption)


def check_options(config) -> None:
    """The target judges the options it was given, as pytest's usage error."""
    try:
        check_target_options(run_options(config), config.getoption("target"))
    except ValueError as why:
        raise pytest.UsageError(str(why)) from None


def hand_down(config) -> None:
    """The options, for every process of the run (the workers, culprit replays) to apply."""
    os.environ[target_options.ENV] = target_options.to_env(run_options(config))


def setup_errors(config) -> str | None:
    """Why this machine's set-up cannot make a run, in one line; None when it can."""
    return run_plan.setup_errors(config.getoption)
