"""The check's options as pytest declares them, and the set-up checks made before any case.

Everything here is ours (an option, an environment variable, a cases file): a bad one is one
line before the first case, never a row that blames the library."""
from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harness.engine import isolation
from harness.engine.check_options import plugin_options
from harness.engine.session import check_target_options, declared_options
from harness.model import budget, target_options
from harness.results import table

# The bundled library's platforms (kernels/build.py PLATFORMS), named here so the check
# needs no import of the library.
KERNEL_PLATFORMS = ("host", "nvidia", "amd")


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
    return table.selection_slug(*(config.getoption(o) for o in
                                  ("family", "route", "case_id", "cases_file", "profile")))


def one_line(why) -> str:
    text = " ".join(str(why).split())
    return text if len(text) <= 500 else text[:497] + "..."


def run_options(config) -> dict:
    """The target options this run was given ({name: value}, the set ones)."""
    return target_options.given({o.name: config.getoption(o.name) for o in declared_options()})


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
    plat = os.environ.get("KERNELS_PLATFORM", "").strip()
    if plat and plat not in KERNEL_PLATFORMS:
        return f"KERNELS_PLATFORM is {plat!r}; expected one of {', '.join(KERNEL_PLATFORMS)} (or unset)"
    cache = os.environ.get("KERNELS_CACHE_DIR")
    if cache:
        why = _unwritable(Path(cache))
        if why:
            return f"KERNELS_CACHE_DIR {cache} cannot hold the kernels' build cache ({why})"
    timeout = config.getoption("case_timeout")
    if timeout is not None and not 0 < timeout <= isolation_ceiling():
        return (f"--case-timeout {timeout:g}: must be above 0 and at most "
                f"{isolation_ceiling():g} s (the per-case ceiling)")
    limit = config.getoption("max_case_bytes")
    if limit is not None and limit <= 0:
        return f"--max-case-bytes {limit}: must be above 0"
    path = config.getoption("cases_file")
    if path:
        try:
            budget.load_cases_data(Path(path).read_text(encoding="utf-8"), str(path))
        except OSError as e:
            return f"--cases-file {path}: {e.strerror or e}"
        except UnicodeDecodeError:
            return f"--cases-file {path}: not UTF-8 text"
        except budget.CasesFileError as e:
            return f"--cases-file {e}"
    return None


def isolation_ceiling() -> float:
    return isolation.CASE_TIMEOUT_CEILING_S


def _unwritable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return e.strerror or str(e)
    if not folder.is_dir():
        return "not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    return None
