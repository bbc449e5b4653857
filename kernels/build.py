"""Build the bundled HIP library for this machine's platform, once, into a keyed cache.

The cache key is sha256 over the sources, platform, arch and flags, so a source edit or a new
target builds again and nothing else does. Concurrent processes (xdist workers) take an fcntl
lock and the library appears by atomic rename, so it is built once.

    python -m kernels.build [--platform host|nvidia|amd] [--arch A[,B]] [--compile-only]
                            [--variant default|testonly] [--coverage]

Two variants share the sources: `default`, the shipped libkernels.so, and `testonly`,
libkernels_testonly.so, compiled with -DKERNELS_TEST_FAULTS and csrc/testonly/ (the kernel
faults kernels.testonly selects). Each is keyed by its own sources and flags.

Either can also be built for coverage (host only; `harness.tools.coverage` does it, selected
in a process by env KERNELS_COVERAGE_DIR): gcc --coverage -O0, one object per unit in a
directory of its own in the cache, so each unit's .gcno lies next to its object and the
.gcda paths compiled in never change. csrc/coverage/flush.cpp adds kernels_coverage_flush.

amd picks a toolchain per arch: hipcc first, else clang++-19..22 driven directly in HIP mode
against Debian's HIP 5.2 headers and device libraries (kernels/AMD.md says what each covers).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import hashlib
import functools
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

CSRC = Path(__file__).resolve().parent / "csrc"
REPO = CSRC.parent.parent
PLATFORMS = ("host", "nvidia", "amd")
LIB_NAME = "libkernels.so"
VARIANTS = ("default", "testonly")
LIB_NAMES = {"default": LIB_NAME, "testonly": "libkernels_testonly.so"}
TESTONLY_DIR = CSRC / "testonly"
# The test-only library compiles testonly/api.cpp (which includes api.cpp) in api.cpp's place.
TESTONLY_REPLACES = "api.cpp"
# The coverage build: one more unit (the exported flush), and the environment variable that
# selects it in a process (the directory its counters and the Python tracer's data go to).
COVERAGE_DIR = CSRC / "coverage"
COVERAGE_ENV = "KERNELS_COVERAGE_DIR"
# -O0: a line's counts are its own; atomic: OpenMP threads' counts add up exactly;
# -fno-exceptions: nothing here throws (no try, a C ABI), so gcov's branches are decisions only,
# not every call's may-throw edge.
COVERAGE_FLAGS = ["--coverage", "-O0", "-fprofile-update=atomic", "-fno-exceptions"]
OBJ_DIR = "obj"


class BuildError(RuntimeError):
    pass


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise BuildError(f"variant is {variant!r}; expected one of {VARIANTS}")


def sources(variant: str = "default") -> list[Path]:
    """Every file the variant's build reads (its cache key); the default never reads testonly/."""
    _check_variant(variant)
    found = [p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")]
    if variant == "testonly":
        found += [p for p in TESTONLY_DIR.iterdir() if p.suffix in (".cpp", ".h")]
    return sorted(found)


def compiled(variant: str = "default") -> list[Path]:
    """The translation units the variant compiles."""
    units = [p for p in sources(variant) if p.suffix == ".cpp"]
    if variant == "testonly":
        units = [p for p in units if p.parent != CSRC or p.name != TESTONLY_REPLACES]
    return units


def _variant_flags(variant: str) -> list[str]:
    return ["-DKERNELS_TEST_FAULTS"] if variant == "testonly" else []


def coverage_wanted() -> bool:
    """Whether this process loads the coverage build (env KERNELS_COVERAGE_DIR set)."""
    return bool(os.environ.get(COVERAGE_ENV))


def _unit_stem(unit: Path) -> str:
    """testonly/api.cpp -> testonly__api: one object (and .gcno/.gcda) name per unit."""
    return unit.relative_to(CSRC).with_suffix("").as_posix().replace("/", "__")


def coverage_commands(arch: str, objdir: Path, out: Path, variant: str = "default"
                      ) -> list[list[str]]:
    """The coverage build's command lines: one compile per unit into objdir, then the link.
    Host only: gcov instruments host code, and the host build is the one run as CPU loops."""
    cmd, _ = command("host", arch, out, variant=variant)
    cc, flags = cmd[0], [f for f in cmd[1:-2] if f not in {str(p) for p in compiled(variant)}]
    flags = [f for f in flags if f not in ("-O2", "-shared")] + COVERAGE_FLAGS
    cmds = [[cc, *flags, "-c", str(u), "-o", str(objdir / f"{_unit_stem(u)}.o")]
            for u in compiled(variant)]
    # The flush wrapper counts nothing of the library's own, so it is not instrumented.
    flush = COVERAGE_DIR / "flush.cpp"
    cmds.append([cc, *[f for f in flags if f not in COVERAGE_FLAGS], "-c", str(flush), "-o",
                 str(objdir / "coverage_flush.o")])
    objs = [str(objdir / f"{_unit_stem(u)}.o") for u in compiled(variant)] + [str(objdir / "coverage_flush.o")]
    cmds.append([cc, "-shared", "-fopenmp", "--coverage", *objs, "-o", str(out)])
    return cmds


def cache_dir() -> Path:
    return Path(os.environ.get("KERNELS_CACHE_DIR") or REPO / ".cache" / "kernels")


def detect(platform: str | None = None) -> tuple[str, str]:
    """(platform, arch): the platform given, else env KERNELS_PLATFORM, else the GPU torch
    sees, else host; the arch is the visible GPU's (`--platform nvidia` alone builds for it)."""
    plat = (platform or os.environ.get("KERNELS_PLATFORM", "")).strip()
    if plat and plat not in PLATFORMS:
        raise BuildError(f"KERNELS_PLATFORM is {plat!r}; expected one of {PLATFORMS}")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    gpu = torch is not None and torch.cuda.is_available()
    if not plat:
        if gpu and getattr(torch.version, "hip", None):
            plat = "amd"
        elif gpu and getattr(torch.version, "cuda", None):
            plat = "nvidia"
        else:
            plat = "host"
    if plat == "host":
        return plat, "native"
    if not gpu:
        raise BuildError(f"platform {plat} needs a visible GPU to pick an arch; pass --arch")
    props = torch.cuda.get_device_properties(0)
    if plat == "amd":
        return plat, props.gcnArchName.split(":")[0]
    return plat, f"sm_{props.major}{props.minor}"


def _find(tool: str, *extra: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for cand in extra:
        if os.access(cand, os.X_OK):
            return cand
    return None


_INSTALL = {
    "host": "g++ (apt install g++)",
    "nvidia": "nvcc from the CUDA toolkit (https://developer.nvidia.com/cuda-downloads)",
    "amd": "hipcc (apt install hipcc, or ROCm's /opt/rocm/bin/hipcc); without ROCm, gfx942 and "
           "gfx950 need Debian's clang too (apt install hipcc clang-19 lld-19 clang-22 lld-22)",
}

# --- amd toolchains -------------------------------------------------------------------------
# Tried in this order for each arch; the first that accepts it builds it. hipcc is ROCm's (or
# Debian's 5.2, whose clang 15 stops at gfx940). The direct clangs compile HIP against the
# headers and device libraries of Debian's hipcc/rocm-device-libs packages (ROCm 5.2).
AMD_DIRECT_CLANGS = tuple(f"clang++-{v}" for v in (19, 20, 21, 22))
DEVLIBS_PLACEHOLDER = "<devlibs>"  # replaced by a per-build directory in _compile


class Toolchain(NamedTuple):
    """An amd compiler; direct: a plain clang driven in HIP mode, not hipcc."""
    name: str  # hipcc, clang++-19, ...
    path: str
    direct: bool

    def __str__(self) -> str:
        return self.name


def _rocm_root() -> str | None:
    """The prefix whose include/hip and amdgcn bitcode the direct clangs use (Debian: /usr)."""
    return "/usr" if os.path.exists("/usr/include/hip/hip_runtime.h") and _bitcode_dir() else None


def _bitcode_dir() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/amdgcn/bitcode")) + sorted(glob.glob("/usr/lib/amdgcn/bitcode"))
    return found[0] if found and os.path.exists(os.path.join(found[0], "ocml.bc")) else None


def _amd_toolchains() -> list[Toolchain]:
    found = []
    hipcc = _find("hipcc", "/opt/rocm/bin/hipcc")
    if hipcc:
        found.append(Toolchain("hipcc", hipcc, False))
    if _rocm_root():
        found += [Toolchain(n, p, True) for n in AMD_DIRECT_CLANGS if (p := _find(n))]
    return found


def _isa_version(arch: str) -> int:
    """gfx942 -> 9402 (major, minor, stepping), the value device libs call __oclc_ISA_version."""
    digits = arch.split(":")[0].removeprefix("gfx")
    return int(digits[:-2]) * 1000 + int(digits[-2], 16) * 100 + int(digits[-1], 16)


@functools.lru_cache(maxsize=None)
def _accepts(tc: Toolchain, arch: str) -> bool:
    """Whether tc's driver accepts arch, device libraries included (hipcc), without compiling."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.hip"
        src.write_text("__global__ void k() {}\n")
        cmd = [tc.path, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-c", str(src),
               "-o", os.devnull, "-###"]
        if tc.direct:
            cmd.insert(1, "-nogpulib")  # device libs: _prepare_devlibs supplies every arch's
        try:
            proc = subprocess.run(cmd, env={**os.environ, "HIP_PLATFORM": "amd"}, capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return proc.returncode == 0 and not re.search(r"^\S+: error: ", proc.stdout + proc.stderr, re.M)


@functools.lru_cache(maxsize=None)
def _version(tc: Toolchain) -> str:
    try:
        out = subprocess.run([tc.path, "--version"], env={**os.environ, "HIP_PLATFORM": "amd"},
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    hip = re.search(r"HIP version: (\S+)", out)
    clang = re.search(r"clang version (\S+)", out)
    return ", ".join(x for x in (hip and f"HIP {hip.group(1)}", clang and f"clang {clang.group(1)}") if x)


def amd_groups(arch: str) -> list[tuple[Toolchain, list[str]]]:
    """[(toolchain, archs)] in toolchain order; BuildError naming an arch that none accepts."""
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    if not archs:
        raise BuildError(f"--arch {arch!r}: no amd arch given")
    for a in archs:
        if not re.fullmatch(r"gfx[0-9]+[0-9a-f]{2}(:[a-z0-9_]+[+-])*", a):
            raise BuildError(f"--arch {a!r}: expected gfxNNN for amd")
    tcs = _amd_toolchains()
    if not tcs:
        raise BuildError(f"cannot build the amd library: compiler not found; install {_INSTALL['amd']}")
    groups: dict[Toolchain, list[str]] = {}
    for a in archs:
        tc = next((t for t in tcs if _accepts(t, a)), None)
        if tc is None:
            tried = ", ".join(t.name for t in tcs)
            raise BuildError(f"amd arch {a}: no installed toolchain accepts it (tried {tried}); "
                             f"install {_INSTALL['amd']}")
        groups.setdefault(tc, []).append(a)
    return [(tc, groups[tc]) for tc in tcs if tc in groups]


def _amd_command(tc: Toolchain, archs: list[str], srcs: list[str], out: Path, devlibs: str,
                 vflags: list[str] = ()) -> list[str]:
    flags = ["-x", "hip", "-O2", "-std=c++17", "-fPIC", "-shared", "-DKERNELS_PLATFORM_AMD", *vflags]
    if tc.direct:
        # Code object v5: Debian's device libs have oclc_abi_version_500 but not clang 22's v6.
        flags = ["-x", "hip", f"--rocm-path={_rocm_root()}", f"--rocm-device-lib-path={devlibs}",
                 "-mcode-object-version=5", *flags[2:]]
    flags += [f"--offload-arch={a}" for a in archs]
    return [tc.path, *flags, *srcs, *(["-lamdhip64"] if tc.direct else []), "-o", str(out)]


def _prepare_devlibs(tc: Toolchain, archs: list[str], d: Path) -> None:
    """Debian's device libraries, plus the one-constant oclc_isa_version_<arch>.bc that ROCm 5.2
    predates for an arch (gfx942, gfx950). Those libraries compare the ISA version only with
    values up to 9010 (gfx90a), so gfx942 (9402) and gfx950 (9500) take gfx940's (9400) paths."""
    d.mkdir(parents=True, exist_ok=True)
    for bc in Path(_bitcode_dir()).glob("*.bc"):
        (d / bc.name).symlink_to(bc)
    for a in archs:
        name = f"oclc_isa_version_{a.split(':')[0].removeprefix('gfx')}.bc"
        if (d / name).exists():
            continue
        cl = d / f"{name}.cl"
        cl.write_text(f"__constant int __oclc_ISA_version = {_isa_version(a)};\n")
        cmd = [tc.path, "-x", "cl", "-cl-std=CL1.2", "-target", "amdgcn-amd-amdhsa", "-nogpulib",
               "-fvisibility=protected", "-Xclang", "-mcode-object-version=none", "-emit-llvm", "-c",
               str(cl), "-o", str(d / name)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"amd {a}: {tc} could not make {name}:\n{proc.stdout}{proc.stderr}")


def command(platform: str, arch: str, out: Path, devlibs: str = DEVLIBS_PLACEHOLDER,
            variant: str = "default") -> tuple[list[str], dict]:
    """The compiler command line and its extra environment (amd: archs of one toolchain only)."""
    srcs = [str(p) for p in compiled(variant)]
    vflags = _variant_flags(variant)
    env: dict = {}
    if platform == "host":
        cc = _find("g++")
        flags = ["-x", "c++", "-O2", "-fopenmp", "-fPIC", "-shared", "-std=c++17", "-DKERNELS_PLATFORM_HOST"]
    elif platform == "nvidia":
        cc = _find("nvcc", "/usr/local/cuda/bin/nvcc")
        flags = ["-x", "cu", "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-DKERNELS_PLATFORM_NVIDIA"]
        for a in arch.split(","):
            num = a.removeprefix("sm_")
            if not num.isdigit():
                raise BuildError(f"--arch {a!r}: expected sm_XY for nvidia")
            flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
    elif platform == "amd":
        groups = amd_groups(arch)
        if len(groups) > 1:
            raise BuildError(f"--arch {arch}: one library needs one toolchain, these need "
                             + "; ".join(f"{tc} for {','.join(a)}" for tc, a in groups)
                             + " (--compile-only checks them all)")
        tc, archs = groups[0]
        return _amd_command(tc, archs, srcs, out, devlibs, vflags), {"HIP_PLATFORM": "amd"}
    else:
        raise BuildError(f"unknown platform {platform!r}; expected one of {PLATFORMS}")
    if cc is None:
        raise BuildError(f"cannot build the {platform} library: compiler not found; install {_INSTALL[platform]}")
    return [cc, *flags, *vflags, *srcs, "-o", str(out)], env


def build_hash(platform: str, arch: str, variant: str = "default", coverage: bool = False) -> str:
    h = hashlib.sha256()
    for p in sources(variant):
        # The path below csrc/ (a plain name for the shipped files, so their key is unchanged).
        h.update(p.relative_to(CSRC).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    srcs = {str(p) for p in sources(variant)}
    if platform == "amd":  # every toolchain's command, named by toolchain (paths differ per machine)
        flags = [f for tc, a in amd_groups(arch)
                 for f in [tc.name, *_amd_command(tc, a, [], Path("OUT"), DEVLIBS_PLACEHOLDER,
                                                  _variant_flags(variant))[1:]]]
    else:
        cmd, _ = command(platform, arch, Path("OUT"), variant=variant)
        flags = [f for f in cmd[1:] if f not in srcs]
    # The compiled units too: which file stands in for which is part of what was built.
    units = [p.relative_to(CSRC).as_posix() for p in compiled(variant)]
    h.update(repr([platform, arch] + flags + (units if variant != "default" else [])).encode())
    if coverage:  # its own key: the flags and the wrapper (the default key is as it was)
        h.update(repr(COVERAGE_FLAGS).encode() + (COVERAGE_DIR / "flush.cpp").read_bytes())
    return h.hexdigest()


def _compile(platform: str, arch: str, out: Path, variant: str = "default") -> None:
    with tempfile.TemporaryDirectory() as d:
        devlibs = Path(d) / "devlibs"
        cmd, env = command(platform, arch, out, str(devlibs), variant)
        if platform == "amd" and any(f.startswith("--rocm-device-lib-path=") for f in cmd):
            (tc, archs), = amd_groups(arch)
            _prepare_devlibs(tc, archs, devlibs)
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{platform} build failed ({' '.join(cmd[:1])}, exit {proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")


def code_objects(lib: Path) -> dict[str, int]:
    """{arch: bytes} of the AMD GPU ELF code objects in a HIP library's offload bundles."""
    data, found, magic = lib.read_bytes(), {}, b"__CLANG_OFFLOAD_BUNDLE__"
    at = data.find(magic)
    while at >= 0:
        p = at + len(magic)
        (n,) = struct.unpack_from("<Q", data, p)
        p += 8
        for _ in range(n):
            off, size, idlen = struct.unpack_from("<QQQ", data, p)
            bid = data[p + 24:p + 24 + idlen].decode(errors="replace")
            p += 24 + idlen
            obj = data[at + off:at + off + size]
            # ELF magic and e_machine EM_AMDGPU (224): a real code object, not an empty entry.
            if "amdgcn" in bid and obj[:4] == b"\x7fELF" and struct.unpack_from("<H", obj, 18)[0] == 224:
                a = bid.rsplit("--", 1)[-1]
                found[a] = found.get(a, 0) + size
        at = data.find(magic, p)
    return found


def _compile_coverage(arch: str, objdir: Path, out: Path, variant: str) -> None:
    objdir.mkdir(parents=True, exist_ok=True)
    for cmd in coverage_commands(arch, objdir, out, variant):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"host coverage build failed ({cmd[0]}, exit {proc.returncode}):\n"
                             f"{proc.stdout}{proc.stderr}")


def ensure_built(platform: str | None = None, arch: str | None = None, variant: str = "default",
                 coverage: bool = False) -> dict:
    """Build if needed; return build_info's dict (coverage: also its objdir, of the .gcno)."""
    _check_variant(variant)
    if platform is None:
        platform, detected = detect()
        arch = arch or detected
        if coverage and platform != "host":
            platform, arch = "host", "native"  # the coverage build is the host's CPU loops
    if coverage and platform != "host":
        raise BuildError(f"the coverage build is host only, not {platform}")
    if arch is None:
        arch = detect(platform)[1]   # the visible GPU's, else a BuildError saying pass --arch
    key = build_hash(platform, arch, variant, coverage)
    root = cache_dir()
    tag = "-coverage" if coverage else ""
    target = root / f"{platform}-{arch.replace(',', '+')}{tag}-{key[:16]}" / LIB_NAMES[variant]
    if coverage:
        info = {"platform": platform, "arch": arch, "build_hash": key, "path": str(target),
                "variant": variant, "coverage": str(target.parent / OBJ_DIR)}
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
                os.close(fd)
                try:
                    if coverage:
                        _compile_coverage(arch, target.parent / OBJ_DIR, Path(tmp), variant)
                    else:
                        _compile(platform, arch, Path(tmp), variant)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    if coverage:
        return info
    return {"platform": platform, "arch": arch, "build_hash": key, "path": str(target), "variant": variant}


_INFO: dict = {}
# The variant kernels._lib has loaded (it sets this when it opens one); build_info() names it.
_active = "default"


def build_info(variant: str | None = None) -> dict:
    """dict(platform, arch, build_hash, path, variant) of the library this process loads (or
    of the variant named), built on first use. This is where the library is chosen: with env
    KERNELS_COVERAGE_DIR set it is the variant's coverage build (one more key, coverage: the
    directory of its objects and .gcno files)."""
    variant = variant or _active
    coverage = coverage_wanted()
    if (variant, coverage) not in _INFO:
        _INFO[(variant, coverage)] = ensure_built(variant=variant, coverage=coverage)
    return dict(_INFO[(variant, coverage)])


def set_active(variant: str) -> None:
    """kernels._lib's record of the loaded variant."""
    global _active
    _check_variant(variant)
    _active = variant


def compile_only(platform: str, arch: str, variant: str = "default") -> dict:
    """Compile into a temporary dir and report; for targets this machine cannot run.

    amd: one full host+device build per toolchain (in parallel); each arch is reported with its
    toolchain and the size of its device code object, and an arch without one fails the check."""
    _check_variant(variant)
    lib_name = LIB_NAMES[variant]
    if platform != "amd":
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / lib_name
            _compile(platform, arch, out, variant)
            size = out.stat().st_size
        return {"platform": platform, "arch": arch, "variant": variant,
                "build_hash": build_hash(platform, arch, variant), "bytes": size}
    groups = amd_groups(arch)
    info = {"platform": platform, "arch": arch, "variant": variant,
            "build_hash": build_hash(platform, arch, variant), "bytes": 0}

    def one(group):
        tc, archs = group
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / lib_name
            _compile(platform, ",".join(archs), out, variant)
            return out.stat().st_size, code_objects(out), time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(groups), os.cpu_count() or 1)) as ex:
        results = list(ex.map(one, groups))
    for (tc, archs), (size, objs, secs) in zip(groups, results):
        info["bytes"] += size
        for a in archs:
            if not objs.get(a):
                raise BuildError(f"amd arch {a}: {tc} built the library but it holds no {a} code object")
            how = "its HIP headers and device libs"
            if tc.direct:
                isa = f"oclc_isa_version_{a.split(':')[0].removeprefix('gfx')}.bc"
                how = "Debian's HIP 5.2 headers and device libs" + (
                    "" if os.path.exists(os.path.join(_bitcode_dir(), isa)) else f" (+ generated {isa})")
            info[a] = (f"{tc} ({_version(tc)}, {tc.path}) with {how}: host+device compiled and linked, "
                       f"{a} code object {objs[a]} bytes ({secs:.1f} s for {','.join(archs)})")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.splitlines()[0])
    ap.add_argument("--platform", choices=PLATFORMS)
    ap.add_argument("--arch", help="sm_90 (nvidia), gfx942 or gfx90a,gfx940,gfx942,gfx950 (amd)")
    ap.add_argument("--compile-only", action="store_true", help="build to a temp dir and report")
    ap.add_argument("--variant", choices=VARIANTS, default="default",
                    help="testonly: libkernels_testonly.so, with the kernel faults of csrc/testonly/")
    ap.add_argument("--coverage", action="store_true",
                    help="the host coverage build (gcc --coverage -O0), into the cache")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.coverage and args.compile_only:
            raise BuildError("--coverage builds into the cache; it has no --compile-only")
        if args.coverage:
            info = ensure_built(args.platform or "host", args.arch, args.variant, coverage=True)
        elif args.compile_only:
            plat = args.platform or detect()[0]
            arch = args.arch or ("native" if plat == "host" else None)
            if arch is None:
                raise BuildError(f"--compile-only for {plat} needs --arch")
            info = compile_only(plat, arch, args.variant)
        else:
            info = ensure_built(args.platform, args.arch, args.variant)
    except BuildError as e:
        print(f"kernels.build: {e}", file=sys.stderr)
        return 1
    for k, v in info.items():
        print(f"{k}: {v}")
    print(f"seconds: {time.perf_counter() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
