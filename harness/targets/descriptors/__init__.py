"""Target descriptors: each in-tree target's name, routes, capabilities and call signature
as pure data (no torch, no library), so the engine can select and describe cases without
loading a runner. Each adapter module (harness/targets/<name>.py) imports its descriptor.

NAMES maps a registry name to its descriptor module.
"""
NAMES = {
    "bundled": "harness.targets.descriptors.bundled",
    "torch-sdpa": "harness.targets.descriptors.torch_sdpa",
    "flashinfer": "harness.targets.descriptors.flashinfer",
    "flaggems": "harness.targets.descriptors.flaggems",
}
