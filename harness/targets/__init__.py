"""Targets: one adapter module per library under test.

A target maps the harness's routes onto a library's API. Cases never import a
library; the adapter builds the library's tensors from the logical problem,
calls the library, and hands back logical outputs.
"""
from __future__ import annotations

import importlib

from .base import Target, Skip  # noqa: F401

TARGETS = {
    "bundled": "harness.targets.bundled",
    "torch-sdpa": "harness.targets.torch_sdpa",
    "flashinfer": "harness.targets.flashinfer",
    "flaggems": "harness.targets.flaggems",
    "faults": "harness.targets.faults",  # test-only: injected crashes and hangs
}


def load_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"--target: unknown target {name!r}; known: {sorted(TARGETS)}")
    return importlib.import_module(TARGETS[name]).make_target()
