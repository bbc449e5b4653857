"""Build the bundled HIP library for this machine's platform, once, into a keyed cache.

The cache key is sha256 over the sources, platform, arch and flags, so a source edit or a new
target builds again and nothing else does. Concurrent processes (xdist workers) take an fcntl
lock and the library appears by atomic rename, so it is built once.

    python -m kernels.build [--platform host|nvidia|amd] [--arch A[,B]] [--compile-only]
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
REPO = CSRC.parent.parent
PLATFORMS = ("host", "nvidia", "amd")
LIB_NAME = "libkernels.so"


class BuildError(RuntimeError):
    pass


def sources() -> list[Path]:
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h"))


def cache_dir() -> Path:
    return Path(os.environ.get("KERNELS_CACHE_DIR") or REPO / ".cache" / "kernels")


def detect() -> tuple[str, str]:
    """(platform, arch): env KERNELS_PLATFORM, else the GPU torch sees, else host."""
    plat = os.environ.get("KERNELS_PLATFORM", "").strip()
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
    "amd": "hipcc (apt install hipcc, or ROCm's /opt/rocm/bin/hipcc)",
}


def command(platform: str, arch: str, out: Path) -> tuple[list[str], dict]:
    """The compiler command line and its extra environment."""
    srcs = [str(p) for p in sources() if p.suffix == ".cpp"]
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
        cc = _find("hipcc", "/opt/rocm/bin/hipcc")
        env["HIP_PLATFORM"] = "amd"
        flags = ["-x", "hip", "-O2", "-std=c++17", "-fPIC", "-shared", "-DKERNELS_PLATFORM_AMD"]
        for a in arch.split(","):
            if not a.startswith("gfx"):
                raise BuildError(f"--arch {a!r}: expected gfxNNN for amd")
            flags.append(f"--offload-arch={a}")
    else:
        raise BuildError(f"unknown platform {platform!r}; expected one of {PLATFORMS}")
    if cc is None:
        raise BuildError(f"cannot build the {platform} library: compiler not found; install {_INSTALL[platform]}")
    return [cc, *flags, *srcs, "-o", str(out)], env


def build_hash(platform: str, arch: str) -> str:
    h = hashlib.sha256()
    for p in sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    flags, _ = command(platform, arch, Path("OUT"))
    srcs = {str(p) for p in sources()}
    h.update(repr([platform, arch] + [f for f in flags[1:] if f not in srcs]).encode())
    return h.hexdigest()


def _compile(platform: str, arch: str, out: Path) -> None:
    cmd, env = command(platform, arch, out)
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{platform} build failed ({' '.join(cmd[:1])}, exit {proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")


def ensure_built(platform: str | None = None, arch: str | None = None) -> dict:
    """Build if needed; return build_info's dict."""
    if platform is None:
        platform, detected = detect()
        arch = arch or detected
    arch = arch or ("native" if platform == "host" else None)
    if arch is None:
        raise BuildError(f"platform {platform}: pass --arch")
    key = build_hash(platform, arch)
    root = cache_dir()
    target = root / f"{platform}-{arch.replace(',', '+')}-{key[:16]}" / LIB_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
                os.close(fd)
                try:
                    _compile(platform, arch, Path(tmp))
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
    return {"platform": platform, "arch": arch, "build_hash": key, "path": str(target)}


_INFO: dict | None = None


def build_info() -> dict:
    """dict(platform, arch, build_hash, path) of the library this process loads."""
    global _INFO
    if _INFO is None:
        _INFO = ensure_built()
    return dict(_INFO)


def compile_only(platform: str, arch: str) -> dict:
    """Compile into a temporary dir and report; for targets this machine cannot run."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / LIB_NAME
        _compile(platform, arch, out)
        size = out.stat().st_size
    return {"platform": platform, "arch": arch, "build_hash": build_hash(platform, arch), "bytes": size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.splitlines()[0])
    ap.add_argument("--platform", choices=PLATFORMS)
    ap.add_argument("--arch", help="sm_90 (nvidia), gfx942 or gfx90a,gfx940 (amd)")
    ap.add_argument("--compile-only", action="store_true", help="build to a temp dir and report")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.compile_only:
            plat = args.platform or detect()[0]
            arch = args.arch or ("native" if plat == "host" else None)
            if arch is None:
                raise BuildError(f"--compile-only for {plat} needs --arch")
            info = compile_only(plat, arch)
        else:
            info = ensure_built(args.platform, args.arch)
    except BuildError as e:
        print(f"kernels.build: {e}", file=sys.stderr)
        return 1
    for k, v in info.items():
        print(f"{k}: {v}")
    print(f"seconds: {time.perf_counter() - t0:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
