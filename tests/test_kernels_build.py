"""The build: keyed cache, one build under concurrency, clear missing-compiler errors, the GPU
compile checks, and the library's own fp16/bf16 conversions against torch."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernels import _lib, build

REPO = Path(__file__).resolve().parent.parent


def test_build_info_names_platform_arch_hash_path():
    info = build.build_info()
    assert set(info) == {"platform", "arch", "build_hash", "path", "variant"}
    assert os.path.exists(info["path"]) and len(info["build_hash"]) == 64
    assert _lib.platform() == info["platform"]


# The shipped library's C ABI (nm -D, defined functions not C++-mangled), as it was before the
# kernel faults moved to the test-only library: the move must not change it.
C_ABI = ["kernels_convert_host", "kernels_decode", "kernels_last_error", "kernels_ll4mi_decode",
         "kernels_merge_state", "kernels_merge_state_in_place", "kernels_params_size", "kernels_plan",
         "kernels_platform", "kernels_prefill", "kernels_schedule_len", "kernels_testonly_fault",
         "kernels_warp_size"]
TESTONLY_ABI = ["kernels_testonly_kernel_faults", "kernels_testonly_set_kernel_fault"]


def _nm(path, *flags) -> list[str]:
    if shutil.which("nm") is None:
        pytest.skip("nm not installed")
    out = subprocess.run(["nm", "-D", *flags, path], capture_output=True, text=True, check=True).stdout
    return [ln.split() for ln in out.splitlines() if ln.strip()]


def _c_exports(path) -> list[str]:
    return sorted(f[2] for f in _nm(path, "--defined-only") if len(f) == 3 and f[1] == "T"
                  and not f[2].startswith("_Z"))


@pytest.mark.system
def test_default_library_exports_the_c_abi_and_reads_no_environment():
    default, testonly = build.build_info("default")["path"], build.build_info("testonly")["path"]
    assert _c_exports(default) == C_ABI
    assert _c_exports(testonly) == sorted(C_ABI + TESTONLY_ABI)
    undefined = {f[-1].split("@")[0] for f in _nm(default, "--undefined-only")}
    assert not undefined & {"getenv", "secure_getenv", "__libc_getenv"}, undefined


def test_fault_code_lives_only_in_the_test_only_sources():
    """The shipped sources carry hook points (identity macros), never a fault's name or logic."""
    for p in build.sources("default"):
        text = p.read_text()
        assert "TF_" not in text and "getenv" not in text, p.name
    assert all(p.parent == build.CSRC for p in build.sources("default"))
    assert {p.relative_to(build.CSRC).as_posix() for p in build.sources("testonly")} - {
        p.name for p in build.sources("default")} == {"testonly/api.cpp", "testonly/faults.h",
                                                      "testonly/plan_faults.h"}
    assert "testonly/api.cpp" in {p.relative_to(build.CSRC).as_posix() for p in build.compiled("testonly")}
    assert "api.cpp" not in {p.relative_to(build.CSRC).as_posix() for p in build.compiled("testonly")}


def test_cache_key_covers_each_variant_and_only_its_sources(tmp_path, monkeypatch):
    tree = tmp_path / "csrc"
    shutil.copytree(build.CSRC, tree)
    monkeypatch.setattr(build, "CSRC", tree)
    monkeypatch.setattr(build, "TESTONLY_DIR", tree / "testonly")
    keys = lambda: (build.build_hash("host", "native"), build.build_hash("host", "native", "testonly"))
    d0, t0 = keys()
    assert d0 != t0
    with open(tree / "testonly" / "faults.h", "a") as f:
        f.write("// edited\n")
    d1, t1 = keys()
    assert d1 == d0 and t1 != t0  # a test-only edit leaves the shipped build's key alone
    with open(tree / "attention.h", "a") as f:
        f.write("// edited\n")
    d2, t2 = keys()
    assert d2 != d1 and t2 != t1
    with pytest.raises(build.BuildError, match="variant is 'nope'"):
        build.build_hash("host", "native", "nope")


def test_default_library_has_no_fault(monkeypatch):
    """softmax_no_max on large logits: wrong only on the test-only library; the shipped one,
    built from the same sources, gives the right answer whatever fault is chosen elsewhere."""
    import kernels
    from kernels import testonly
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 2, 16, generator=g) * 30, torch.randn(9, 2, 16, generator=g) * 30,
               torch.randn(9, 2, 16, generator=g))
    if _lib.platform() != "host":
        q, k, v = q.cuda(), k.cuda(), v.cuda()
    s = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / 4
    want = torch.einsum("hqk,khd->qhd", s.softmax(-1), v.double())
    assert s.max() > 200  # exp(logit) overflows fp32 without a running max
    right = lambda o: torch.allclose(o.double(), want, atol=1e-4, rtol=1e-4)
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    try:
        testonly.use_fault_library("softmax_no_max")
        assert kernels.build_info()["variant"] == "testonly" and testonly.active_fault() == "softmax_no_max"
        assert not right(kernels.single_prefill_with_kv_cache(q, k, v))
        testonly.use_fault_library(None)
        assert right(kernels.single_prefill_with_kv_cache(q, k, v))
        testonly.use_fault_library("softmax_no_max")
    finally:
        testonly.use_default_library()
    assert kernels.build_info()["variant"] == "default" and testonly.active_fault() is None
    assert right(kernels.single_prefill_with_kv_cache(q, k, v))


def test_fault_library_refusals(monkeypatch):
    from kernels import testonly
    monkeypatch.delenv("KERNELS_TESTONLY", raising=False)
    with pytest.raises(ValueError, match="set KERNELS_TESTONLY=1"):
        testonly.use_fault_library("merge_no_max")
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    with pytest.raises(ValueError, match="kernel fault no_such: unknown; known: merge_no_max, "):
        testonly.use_fault_library("no_such")
    assert set(testonly.KERNEL_FAULTS) <= set(testonly.kernel_faults())
    assert _lib._handle is None or testonly.active_fault() is None


@pytest.mark.system
@pytest.mark.parametrize("env,words", [({"KERNELS_TESTONLY": "1", "KERNELS_TESTONLY_FAULT": "no_such"}, "unknown"),
                                       ({"KERNELS_TESTONLY_FAULT": "merge_no_max"}, "KERNELS_TESTONLY=1"),
                                       ({"KERNELS_TESTONLY": "1", "KERNELS_TESTONLY_FAULT": "softmax_no_max"},
                                        "testonly softmax_no_max False")])
def test_a_process_started_with_a_fault_loads_the_fault_library_once(env, words):
    """The one environment read: the first call of a process picks the library; a bad setting
    fails every call, naming it."""
    code = textwrap.dedent("""
        import torch, kernels
        from kernels import testonly
        q = torch.randn(3, 2, 16) * 40
        for _ in range(2):
            try:
                o = kernels.single_prefill_with_kv_cache(q, q, q)
                print(kernels.build_info()["variant"], testonly.active_fault(), torch.isfinite(o).all().item())
            except ValueError as e:
                print("refused:", e)
    """)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELS_TESTONLY")}
    proc = subprocess.run([sys.executable, "-c", code], env={**base, **env, "PYTHONPATH": str(REPO),
                                                             "KERNELS_PLATFORM": "host"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(words in ln for ln in lines), lines


@pytest.mark.system
def test_gpu_compile_only_nvidia_testonly():
    if build._find("nvcc", "/usr/local/cuda/bin/nvcc") is None:
        pytest.skip("nvcc not installed")
    proc = subprocess.run([sys.executable, "-m", "kernels.build", "--platform", "nvidia", "--arch", "sm_90",
                           "--compile-only", "--variant", "testonly"], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "variant: testonly" in proc.stdout


def test_key_depends_on_platform_and_arch():
    keys = {build.build_hash("host", "native"), build.build_hash("nvidia", "sm_90"), build.build_hash("nvidia", "sm_80")}
    assert len(keys) == 3


@pytest.mark.system
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


@pytest.mark.system
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


@pytest.mark.system
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


@pytest.mark.system
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


def test_a_platform_given_without_an_arch_builds_for_the_visible_gpu(monkeypatch):
    # `python -m kernels.build --platform nvidia` on a GPU machine: the arch is the GPU's,
    # as when no platform is given; without a GPU, one line asks for --arch.
    import types
    import torch
    from kernels import build
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(major=9, minor=0, gcnArchName="gfx942:sramecc+"))
    assert build.detect("nvidia") == ("nvidia", "sm_90")
    assert build.detect("amd") == ("amd", "gfx942")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(build.BuildError, match="pass --arch"):
        build.detect("nvidia")
