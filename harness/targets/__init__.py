"""Targets: one adapter per library under test, and how a `--target` spec finds it.

A target maps the harness's ops onto a library's API. Cases never import a library; the
adapter builds the library's tensors from the logical problem, calls the library, and hands
back logical outputs (docs/targets.md is the whole contract).

A spec is any of, tried in this order:
  NAME                 the project's registry below, then HARNESS_TARGETS aliases, then an
                       installed package's entry point in the group `attention_harness.targets`
  package.module:func  a factory in an importable module (the user's PYTHONPATH is kept)
  path/to/file.py      a file in the user's own repo; its `make_target()` (or `:func`)

HARNESS_TARGETS="name=spec,name=spec" gives names to specs for this environment, which every
child process inherits; the project's own tests register their test-only `faults` target so.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from harness.model.capabilities import Capabilities  # noqa: F401  (re-exported for adapters)
from harness.model.routes import DEFAULT_TARGET
from harness.model.signature import ENCODINGS, ROLES, Arg, Signature  # noqa: F401  (public)
from harness.model.target_options import TargetOption  # noqa: F401  (public)
from harness.targets.base import Skip, Target  # noqa: F401  (re-exported for adapters)

# The names an adapter imports (docs/targets.md): stable across releases.
__all__ = ["Arg", "Capabilities", "DeclaredTarget", "ENCODINGS", "ROLES", "Signature", "Skip",
           "Target", "TargetOption", "load_target"]


def __getattr__(name):
    # DeclaredTarget's runner needs torch: loaded on first use, so a descriptor (and
    # `import harness.targets`) stays torch-free.
    if name == "DeclaredTarget":
        from harness.targets.block_table.declared import DeclaredTarget
        return DeclaredTarget
    raise AttributeError(f"module 'harness.targets' has no attribute {name!r}")

TARGETS = {
    "bundled": "harness.targets.bundled",
    "torch-sdpa": "harness.targets.torch_sdpa",
    "flashinfer": "harness.targets.flashinfer",
    "flaggems": "harness.targets.flaggems",
    "vllm-cpu": "harness.targets.vllm_cpu",
}
DEFAULT = DEFAULT_TARGET
ENTRY_POINT_GROUP = "attention_harness.targets"
ALIASES_ENV = "HARNESS_TARGETS"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class TargetLoadError(ValueError):
    """The spec names nothing loadable: ours (or the user's set-up), never the library's."""


def aliases() -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in os.environ.get(ALIASES_ENV, "").split(","))):
        name, sep, spec = item.partition("=")
        if not sep or not name.strip() or not spec.strip():
            raise TargetLoadError(f"{ALIASES_ENV}: {item!r} is not name=spec")
        out[name.strip()] = spec.strip()
    return out


def entry_points() -> dict:
    from importlib.metadata import entry_points as eps
    try:
        return {ep.name: ep for ep in eps(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken distribution's metadata must not hide the registry
        return {}


def known_names() -> list[str]:
    return sorted(set(TARGETS) | set(aliases()) | set(entry_points()))


def _is_path(spec: str) -> bool:
    return spec.split(":", 1)[0].endswith(".py") or os.sep in spec.split(":", 1)[0]


def label(spec: str) -> str:
    """A file-name-safe name for a spec: what tables and reports are named by."""
    if spec in TARGETS or spec in entry_points():
        return _SAFE.sub("_", spec)
    try:
        if spec in aliases():
            return _SAFE.sub("_", spec)
    except TargetLoadError:
        pass
    where, _, func = spec.partition(":")
    stem = Path(where).stem if _is_path(spec) else where.rsplit(".", 1)[-1]
    name = stem if not func or func == "make_target" else f"{stem}-{func}"
    return _SAFE.sub("_", name).strip("._-") or "target"


def _from_file(path: str) -> object:
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise TargetLoadError(f"--target: no file {path!r}")
    name = "harness_user_target_" + hashlib.sha1(str(p).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _factory(spec: str):
    """The callable that makes the target a spec names."""
    if spec in TARGETS:
        return importlib.import_module(TARGETS[spec]).make_target
    named = aliases()
    if spec in named:
        return _factory(named[spec])
    eps = entry_points()
    if spec in eps:
        obj = eps[spec].load()
        return obj if callable(obj) else getattr(obj, "make_target")
    where, _, func = spec.partition(":")
    if _is_path(spec):
        module = _from_file(where)
    elif ":" in spec:
        module = importlib.import_module(where)
    else:
        raise TargetLoadError(f"--target: unknown target {spec!r}; known: {known_names()} "
                              f"(or package.module:factory, or path/to/file.py)")
    func = func or "make_target"
    if not hasattr(module, func):
        raise TargetLoadError(f"--target {spec}: {where} has no {func}()")
    return getattr(module, func)


def load_target(spec: str) -> Target:
    """The target a spec names. Any failure to find, import or make it is a TargetLoadError
    naming the spec and the error, which callers report as a set-up error of ours."""
    try:
        target = _factory(spec)()
    except TargetLoadError:
        raise
    except Exception as e:
        raise TargetLoadError(f"--target {spec}: cannot load: {type(e).__name__}: {e}") from e
    if not isinstance(target, Target):
        raise TargetLoadError(f"--target {spec}: the factory returned {type(target).__name__}, "
                              f"not a harness.targets.Target")
    try:   # where the adapter came from: the library's commit is read there (engine/identity.py)
        target.harness_spec = spec
    except AttributeError:
        pass
    return target
