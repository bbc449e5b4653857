"""Target descriptors are torch-free (harness/targets/descriptors/): importing every in-tree
descriptor, and `harness list` of a target whose descriptor selects its cases, import no
torch in a fresh interpreter; and the cases a descriptor selects are its runner's."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_importing_every_descriptor_imports_no_torch():
    done = _fresh(
        "import importlib, pkgutil, sys\n"
        "import harness.targets.descriptors as d\n"
        "names = [m.name for m in pkgutil.iter_modules(d.__path__)]\n"
        "for name in names: importlib.import_module(f'{d.__name__}.{name}')\n"
        "d.declared_options()\n"
        "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    assert done.returncode == 0, done.stderr
    count, loaded = done.stdout.split(" ", 1)
    assert int(count) >= len(__import__("harness.targets.descriptors",
                                        fromlist=["NAMES"]).NAMES)
    assert loaded.strip() == "[]"


def test_harness_list_imports_no_torch():
    done = _fresh(
        "import sys\n"
        "from harness import cli\n"
        "rc = cli.main(['list', '--target', 'bundled', '--family', 'valid', '--profile', 'ci'])\n"
        "print('RC', rc, 'torch' in sys.modules, file=sys.stderr)\n")
    assert done.stderr.strip().splitlines()[-1] == "RC 0 False", done.stderr
    assert done.stdout.count("\n") > 10   # it did list the cases


@pytest.mark.parametrize("profile", ["ci", "full"])
def test_a_descriptor_selects_the_cases_its_runner_does(profile):
    from harness.targets import load_target
    from harness.targets.descriptors import NAMES, described
    selecting = [name for name in NAMES if described(name) is not None]
    assert "bundled" in selecting
    for name in selecting:
        by_descriptor = [c.id for c in described(name).cases(None, profile)]
        assert by_descriptor == [c.id for c in load_target(name).cases(None, profile)]
        assert described(name).routes == load_target(name).routes
