"""Target descriptors: each in-tree target's name, routes, capabilities and call signature
as pure data (no torch, no library), so the engine can select and describe cases without
loading a runner. Each adapter module (harness/targets/<name>.py) imports its descriptor.

NAMES maps a registry name to its descriptor module. A descriptor's OPTIONS (optional) are
the options its target takes (harness/model/target_options.py): every command that runs
cases offers their flags, made from declared_options() below. A descriptor whose cases are
the families' on its ROUTES whatever the machine says so (CASES_FROM_DESCRIPTOR): its cases
are then selected from it alone (described() below), so `harness list` loads no runner.
"""
from __future__ import annotations

import importlib

from harness.model.target_options import TargetOption, merged

NAMES = {
    "bundled": "harness.targets.descriptors.bundled",
    "torch-sdpa": "harness.targets.descriptors.torch_sdpa",
    "flashinfer": "harness.targets.descriptors.flashinfer",
    "flaggems": "harness.targets.descriptors.flaggems",
}


def declared_options() -> tuple[TargetOption, ...]:
    """Every in-tree target's options, each name once (torch-free: descriptors only)."""
    return merged(opt for module in NAMES.values()
                  for opt in getattr(importlib.import_module(module), "OPTIONS", ()))


class Described:
    """An in-tree target as its descriptor has it: what selecting its cases reads (name,
    routes, capabilities, cases()), without its runner, torch or the library."""

    def __init__(self, module):
        self.name, self.routes, self.capabilities = module.NAME, module.ROUTES, module.CAPABILITIES

    def cases(self, families=None, profile: str = "ci") -> list:
        from harness.targets.base import Target
        return Target.cases(self, families, profile)   # the families', as the runner's


def described(spec: str) -> Described | None:
    """The registry name's descriptor, where it selects the target's cases on its own."""
    if spec not in NAMES:
        return None
    module = importlib.import_module(NAMES[spec])
    return Described(module) if getattr(module, "CASES_FROM_DESCRIPTOR", False) else None
