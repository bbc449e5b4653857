"""The build: keyed cache, one build under concurrency, clear missing-compiler errors, the GPU
compile checks, and the library's own fp16/bf16 conversions against torch."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import _lib, build

REPO = Path(__file__).resolve().parent.parent


def test_build_info_names_platform_arch_hash_path():
    info = build.build_info()
    assert set(info) == {"platform", "arch", "build_hash", "path"}
    assert os.path.exists(info["path"]) and len(info["build_hash"]) == 64
    assert _lib.platform() == info["platform"]


def test_key_depends_on_platform_and_arch():
    keys = {build.build_hash("host", "native"), build.build_hash("nvidia", "sm_90"), build.build_hash("nvidia", "sm_80")}
    assert len(keys) == 3


def test_concurrent_builds_build_once(tmp_path):
    env = {**os.environ, "KERNELS_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "kernels.build", "--platform", "host"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    paths = {line for out in outs for line in out.splitlines() if line.startswith("path:")}
    assert len(paths) == 1
    assert len(list(tmp_path.rglob("*.so"))) == 1 and not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("platform,arch,words", [
    ("host", "native", "g++"), ("nvidia", "sm_90", "nvcc"), ("amd", "gfx942", "apt install hipcc")])
def test_missing_compiler_is_one_clear_error(monkeypatch, platform, arch, words):
    monkeypatch.setattr(build, "_find", lambda *a: None)
    with pytest.raises(build.BuildError, match="install") as e:
        build.command(platform, arch, Path("x.so"))
    assert words in str(e.value)


def test_gpu_compile_only_nvidia():
    if build._find("nvcc", "/usr/local/cuda/bin/nvcc") is None:
        pytest.skip("nvcc not installed")
    proc = subprocess.run([sys.executable, "-m", "kernels.build", "--platform", "nvidia", "--arch", "sm_90",
                           "--compile-only"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "platform: nvidia" in proc.stdout


AMD_ARCHS = ["gfx90a", "gfx940", "gfx942", "gfx950"]


def _make_amd_archs() -> list[str]:
    """The archs `make amd-build-check` checks, read from the Makefile: the list must not shrink."""
    proc = subprocess.run(["make", "-n", "amd-build-check"], cwd=REPO, capture_output=True, text=True)
    line = next(ln for ln in proc.stdout.splitlines() if "kernels.build" in ln and "--platform amd" in ln)
    return line.split("--arch", 1)[1].split()[0].split(",")


def test_amd_build_check_covers_every_arch():
    assert _make_amd_archs() == AMD_ARCHS


def test_amd_arch_nothing_accepts_fails_naming_it(monkeypatch):
    monkeypatch.setattr(build, "_amd_toolchains", lambda: [build.Toolchain("hipcc", "/x/hipcc", False)])
    monkeypatch.setattr(build, "_accepts", lambda tc, a: a != "gfx950")
    assert [a for _, a in build.amd_groups("gfx90a,gfx942")] == [["gfx90a", "gfx942"]]
    with pytest.raises(build.BuildError, match=r"^amd arch gfx950: no installed toolchain accepts it") as e:
        build.amd_groups("gfx90a,gfx950")
    assert "\n" not in str(e.value)


def test_amd_isa_versions():
    assert [build._isa_version(a) for a in ["gfx90a", "gfx940", "gfx942", "gfx950", "gfx1030"]] == [
        9010, 9400, 9402, 9500, 10300]


def test_gpu_compile_only_amd():
    """Every arch of `make amd-build-check` compiles to a device code object, with the toolchain
    named; an arch no installed toolchain accepts fails the run, so none drops out silently."""
    if not all(shutil.which(t) for t in ("hipcc", "clang++-19", "clang++-22")):
        pytest.skip("hipcc, clang++-19 and clang++-22 not all installed (.ci/run's amd section installs them)")
    arch = ",".join(_make_amd_archs())
    proc = subprocess.run([sys.executable, "-m", "kernels.build", "--platform", "amd", "--arch", arch,
                           "--compile-only"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(ln.split(": ", 1) for ln in proc.stdout.splitlines() if ": " in ln)
    assert lines["platform"] == "amd" and lines["arch"] == arch
    for a in AMD_ARCHS:
        assert a in lines, f"no line for {a}:\n{proc.stdout}"
        assert "host+device compiled and linked" in lines[a] and f"{a} code object " in lines[a]
        assert int(lines[a].split(f"{a} code object ")[1].split()[0]) > 10_000
        assert lines[a].split()[0] == "hipcc" or lines[a].startswith("clang++-")  # names its toolchain


def _convert(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype)
    _lib.call("kernels_convert_host", x.data_ptr(), _lib.DTYPE_CODES[x.dtype], out.data_ptr(),
              _lib.DTYPE_CODES[dtype], x.numel())
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int16 if a.element_size() == 2
                                                                    else torch.int32), b[~nan].view(
        torch.int16 if b.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_conversions_match_torch_bit_for_bit(half):
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(half)
    assert _same_bits(_convert(every, torch.float32), every.float())
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), generator=g, dtype=torch.int64).to(torch.int32)
    edge = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, 2**-24, 2**-25, 2**-25 * 1.0001, 2**-14,
                         2**-14 * (1 - 2**-11), 1 + 2**-11, 1 + 3 * 2**-11, float("inf"), -float("inf"),
                         float("nan"), 3.0e38, 1e-40])
    x = torch.cat([bits.view(torch.float32), edge, every.float() * 1.00048828125])
    assert _same_bits(_convert(x, half), x.to(half))
