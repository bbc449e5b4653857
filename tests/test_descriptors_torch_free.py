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


@pytest.mark.parametrize("profile", [["--profile", "ci"], []])
def test_harness_list_imports_no_torch(profile):
    done = _fresh(
        "import sys\n"
        "from harness import cli\n"
        f"rc = cli.main(['list', '--target', 'bundled', '--family', 'valid', *{profile!r}])\n"
        "print('RC', rc, 'torch' in sys.modules, file=sys.stderr)\n")
    assert done.stderr.strip().splitlines()[-1] == "RC 0 False", done.stderr
    assert done.stdout.count("\n") > 10   # it did list the cases


def test_the_default_profile_is_what_torch_sees():
    # The torch-free answer agrees with torch's own on this machine.
    import torch

    from harness.model.platform_info import gpu_visible
    assert gpu_visible() == torch.cuda.is_available()


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


@pytest.mark.parametrize("build, nodes, env, seen", [
    ("cuda: Optional[str] = '12.4'", ["nvidia0"], {}, True),
    ("cuda: Optional[str] = '12.4'", [], {}, False),                  # no device node
    ("cuda: Optional[str] = '12.4'", ["nvidia0"], {"CUDA_VISIBLE_DEVICES": ""}, False),
    ("cuda: Optional[str] = None", ["nvidia0"], {}, False),           # a CPU build of torch
    ("hip: Optional[str] = '6.2'", ["kfd"], {}, True),
    ("hip: Optional[str] = '6.2'", ["kfd"], {"HIP_VISIBLE_DEVICES": "-1"}, False),
])
def test_a_gpu_is_seen_from_the_build_the_nodes_and_the_environment(tmp_path, build, nodes,
                                                                     env, seen):
    from harness.model.platform_info import gpu_visible
    (tmp_path / "torch").mkdir()
    other = "hip = None" if build.startswith("cuda") else "cuda = None"
    (tmp_path / "torch" / "version.py").write_text(f"{other}\n{build}\n")
    (tmp_path / "dev").mkdir()
    for n in nodes:
        (tmp_path / "dev" / n).write_text("")
    assert gpu_visible(tmp_path / "torch", tmp_path / "dev", env) is seen
