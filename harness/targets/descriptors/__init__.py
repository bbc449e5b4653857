"""Target descriptors: each in-tree target's name, routes, capabilities and call signature
as pure data (no torch, no library), so the engine can select and describe cases without
loading a runner. Each adapter module (harness/targets/<name>.py) imports its descriptor.

NAMES maps a registry name to its descriptor module. A descriptor's OPTIONS (optional) are
the options its target takes (harness/model/target_options.py): every command that runs
cases offers their flags, made from declared_options() below.
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
