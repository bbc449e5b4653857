"""What a run is, worked out before it starts: the selected case ids, each one's estimated
cost, the library's identity that names the table, the machine's arch and whether the target
owns its contract; or the one line that says why the options cannot make a run.

`harness check` works this out in its own process before it starts the pytest child, which
is handed the table's path; a plain `pytest` run works out the same from its own options. An
in-tree target with a descriptor that selects its cases alone (harness/targets/descriptors)
is planned without torch or the library; any other target loads its runner here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from harness.engine import isolation
from harness.model import budget

# The bundled library's platforms (kernels/build.py PLATFORMS), named here so the check
# needs no import of the library.
KERNEL_PLATFORMS = ("host", "nvidia", "amd")

Getter = Callable[[str], object]


def selection_of(get: Getter, shard: str | None = None) -> str:
    """What a partial run selected, as its table's name says it ("" for a full run): one
    rule for `harness check` and a plain pytest run, so both name one table alike."""
    from harness.results import table
    return table.selection_slug(get("family"), get("route"), get("case_id"),
                                get("cases_file"), get("profile"), shard)


def setup_errors(get: Getter) -> str | None:
    """Why this machine's set-up or the run's own options cannot make a run, in one line;
    None when they can. Everything here is ours, never a row that blames the library."""
    plat = os.environ.get("KERNELS_PLATFORM", "").strip()
    if plat and plat not in KERNEL_PLATFORMS:
        return f"KERNELS_PLATFORM is {plat!r}; expected one of {', '.join(KERNEL_PLATFORMS)} (or unset)"
    cache = os.environ.get("KERNELS_CACHE_DIR")
    if cache:
        why = _unwritable(Path(cache))
        if why:
            return f"KERNELS_CACHE_DIR {cache} cannot hold the kernels' build cache ({why})"
    timeout = get("case_timeout")
    ceiling = isolation.CASE_TIMEOUT_CEILING_S
    if timeout is not None and not 0 < timeout <= ceiling:
        return (f"--case-timeout {timeout:g}: must be above 0 and at most "
                f"{ceiling:g} s (the per-case ceiling)")
    limit = get("max_case_bytes")
    if limit is not None and limit <= 0:
        return f"--max-case-bytes {limit}: must be above 0"
    path = get("cases_file")
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


def planning_target(spec: str):
    """The target as far as planning needs it: its descriptor where that selects the cases
    alone (no torch, no library), else its runner. Never with the options in effect: they
    are judged here, and applied only in the processes that run cases."""
    from harness.targets.descriptors import described
    from harness.targets import load_target
    return described(spec) or load_target(spec)


def one_line(why) -> str:
    text = " ".join(str(why).split())
    return text if len(text) <= 500 else text[:497] + "..."


def plan(get: Getter, shard: str | None = None) -> dict:
    """The run the options `get` names (get(name) -> an option's value, as pytest's dest),
    as a dict: ids, costs, arch, owns_contract and the library's identity
    (engine/identity.py describe); or {"error": one line} when it cannot be made."""
    import pytest
    from harness.engine import identity
    from harness.engine.session import csv_list, given_options, select_cases
    from harness.model import platform_info
    from harness.model.shard import cost
    spec = str(get("target"))
    try:
        why = setup_errors(get)
        if why:
            return {"error": why}
        options = given_options(get)
        target = planning_target(spec)
        target.validate_options(options)
        # An option's variable set by hand, not by the option: one line now instead of
        # every case's harness_error row.
        why = target.environment_error(options)
        if why:
            return {"error": why}
        cases = select_cases(spec, csv_list(get("family")), csv_list(get("route")),
                             get("case_id"), get("cases_file"), get("profile"), shard)
    # An unknown name or file, or a target whose library is missing or cannot run here
    # (its message says what to install): one line, and nothing runs.
    except (pytest.UsageError, ValueError, OSError, RuntimeError, ImportError) as why:
        return {"error": one_line(why)}
    return {"ids": [c.id for c in cases], "arch": platform_info.arch_without_torch(),
            "owns_contract": bool(getattr(target, "owns_contract", False)),
            **identity.describe(target, spec),
            "costs": {c.id: cost(c) for c in cases}}
