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
from harness.targets.base import Target

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


class Described(Target):
    """An in-tree target as its descriptor has it: what selecting and planning its cases
    reads (name, routes, capabilities, cases(), its options and their judge, whether it owns
    its contract, its version and commit), without its runner, torch or the library."""

    def __init__(self, module):
        self.module = module
        self.name, self.routes, self.capabilities = module.NAME, module.ROUTES, module.CAPABILITIES
        self.options = tuple(getattr(module, "OPTIONS", ()))
        self.owns_contract = bool(getattr(module, "OWNS_CONTRACT", False))

    def check_option(self, name: str, value: str) -> None:
        judge = getattr(self.module, "check_option", None)
        if judge is not None:
            judge(name, value)

    def version(self) -> str:
        return self.module.version()

    def commit(self) -> str:
        return self.module.commit()


def described(spec: str) -> Described | None:
    """The registry name's descriptor, where it selects the target's cases on its own."""
    if spec not in NAMES:
        return None
    module = importlib.import_module(NAMES[spec])
    return Described(module) if getattr(module, "CASES_FROM_DESCRIPTOR", False) else None
