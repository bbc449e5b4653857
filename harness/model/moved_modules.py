"""Modules of an older layout, still importable by their old names.

An adapter written against an older contract imported its names from flat modules
(`from harness.capabilities import Capabilities`, `from harness.problem import Problem`);
they moved into layers (model/, engine/, results/, tools/). Each old name loads the module
that holds those names now, so such an adapter keeps loading; a DeprecationWarning names
the public module to import from instead (harness.targets: Target, Skip, Capabilities, Arg,
Signature, ROLES, ENCODINGS). A name that has no successor is not here: importing it fails
as any missing module does, and load_target reports it in one line.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

PUBLIC = "harness.targets"

# old module -> the module that holds its names now
MOVED = {
    **{f"harness.{m}": f"harness.model.{m}" for m in (
        "builders", "capabilities", "case", "classify", "compare", "draws", "params",
        "platform_info", "problem", "reference", "routes", "signals", "tolerance")},
    **{f"harness.{m}": f"harness.engine.{m}" for m in (
        "attempts", "controller", "device_memory", "execute", "fast_exit", "isolation",
        "row", "session")},
    **{f"harness.{m}": f"harness.results.{m}" for m in ("failure_classes", "ledger", "table")},
    **{f"harness.{m}": f"harness.tools.{m}" for m in (
        "bisect", "explore", "sanitizer", "shrink", "strategies")},
    "harness.repro_command": "harness.results.repro_command",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module):
        pass                        # the successor is already loaded


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds an old module name and hands back its successor module."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new}; an adapter imports its names from "
                      f"{PUBLIC}", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
