"""Where a run happened: device, arch, repo commit, host. Recorded on every row."""
from __future__ import annotations

import platform
import socket
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


# torch is imported where a function needs it: repo_commit and host_name serve processes
# that never load it (harness check's parent).

def device() -> "torch.device":
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def gpu_visible(torch_dir: Path | None = None, dev: Path = Path("/dev"),
                env=None) -> bool:
    """Whether torch would see a GPU, answered without importing it (2 CPU-s that a parent
    which only selects cases never needs): torch is a CUDA or HIP build (its version.py
    says so), a device node of that kind exists, and no visibility variable hides every
    device. `check` and `list` both choose their default profile by it, so they agree."""
    import importlib.util
    import os
    import re
    env = os.environ if env is None else env
    if torch_dir is None:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.submodule_search_locations:
            return False
        torch_dir = Path(list(spec.submodule_search_locations)[0])
    try:
        text = (torch_dir / "version.py").read_text()
    except OSError:
        return False

    def built(name: str) -> bool:
        m = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(.+)$", text, re.M)
        return bool(m) and m.group(1).strip() not in ("None", "''", '""')

    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if env.get(var) is not None and env[var].strip() in ("", "-1"):
            return False
    if built("hip"):
        return (dev / "kfd").exists()
    if built("cuda"):
        return any(dev.glob("nvidia[0-9]*"))
    return False


def arch() -> str:
    """'gfx942' on ROCm, 'sm_90' on CUDA, 'cpu-x86_64' without a GPU."""
    import torch
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if getattr(torch.version, "hip", None):
            return props.gcnArchName.split(":", 1)[0]
        return f"sm_{props.major}{props.minor}"
    return f"cpu-{platform.machine()}"


def arch_without_torch() -> str:
    """arch() for a process that must neither load torch nor hold a GPU context for a run's
    whole life (harness check's parent): answered here where no GPU is visible, else by a
    short child interpreter, whose answer is the one the run's own processes give."""
    import os
    import sys
    if not gpu_visible():
        return f"cpu-{platform.machine()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run([sys.executable, "-c", "from harness.model.platform_info "
                               "import arch; print(arch())"], capture_output=True, text=True,
                              env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot tell this machine's GPU arch: {e}") from None
    lines = done.stdout.split()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot tell this machine's GPU arch: {last}")
    return lines[-1]


def _git(path: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def repo_commit(path: str | Path | None = None) -> str:
    """Short hash of HEAD, '+dirty' when tracked files changed; '' outside a git repo."""
    path = Path(path) if path is not None else REPO_ROOT
    head = _git(path, "rev-parse", "--short", "HEAD")
    if not head:
        return ""
    # Untracked files (results/, build caches) do not change what ran.
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if status else "")


def host_name() -> str:
    return socket.gethostname()


MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"


def mps_pipe() -> str | None:
    """The NVIDIA MPS control pipe's folder when this process's CUDA work goes through an MPS
    server (CUDA_MPS_PIPE_DIRECTORY, or the daemon's default pipe), else None."""
    import os
    import stat
    folder = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE
    try:
        return folder if stat.S_ISFIFO(os.stat(Path(folder) / "control").st_mode) else None
    except OSError:
        return None
