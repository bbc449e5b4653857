"""Crash isolation: what a worker leaves behind, and what the controller reads.

Each xdist worker keeps two small files in the run's state directory: its
faulthandler file (where a fatal signal or the per-case timeout dumps its
traceback) and a state file naming the case and stage it is in and the case
ids it ran before. When the worker dies, the controller reads both, plus the
worker's exit status, and turns them into one `crash` or `hang` row; culprit
replay then reruns the case in a fresh process to tell whether it fails alone.

Nothing here touches the GPU runtime except `health_probe`, which a worker
calls after a case it already ran on the device.
"""
from __future__ import annotations

import faulthandler
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.engine import fast_exit
from harness.model.signals import names_device_fault, signal_text
from harness.model.sizes import case_work

STAGES = ("build inputs", "plan", "run", "compare")
RECENT = 8                 # case ids a worker remembers for culprit replay
RETIRE_EXIT = 86           # a worker that retires itself (unhealthy device) exits with this
TIMEOUT_BASE_S = 60.0      # every case gets at least this long (imports, first build)
TIMEOUT_PER_ELEMENT_S = 5e-7  # plus this per q.k product element (host loops are slow)
# No case waits longer than this for its verdict, however big (the watchdog ends it then).
CASE_TIMEOUT_CEILING_S = 1800.0

# faulthandler's headers for the fatal signals it handles.
_FAULT_NAMES = {
    "Floating point exception": "SIGFPE",
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Aborted": "SIGABRT",
    "Illegal instruction": "SIGILL",
}
_TIMEOUT_RE = re.compile(r"^Timeout \((\d+):(\d+):(\d+)(?:\.\d+)?\)!", re.M)


def case_timeout(params: dict, base: float | None = None) -> float:
    """Seconds a case may take before it counts as a hang.

    `base` (from --case-timeout) replaces the fixed part; the per-element part
    keeps a batch-64 split-KV case from being called a hang on a slow host.
    """
    return min(CASE_TIMEOUT_CEILING_S, (TIMEOUT_BASE_S if base is None else base)
               + case_work(params) * TIMEOUT_PER_ELEMENT_S)


# ---------------------------------------------------------------- worker side

def state_tempdir() -> str:
    """A fresh folder for the workers' breadcrumbs, in memory where the system has one:
    the state file is replaced at every stage, and on a disk each rename waits for
    the data to reach it (measured at 1.6-2.5 ms a write on a busy disk, 46% of a
    worker's time; under 0.2 ms on tmpfs)."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="harness-state-", dir=where)


# A stage breadcrumb: "<case id>\0<stage>", NUL-padded to a fixed size and written over the
# previous one with one pwrite (no rename, no fsync): a case passes ~8 stages, and the JSON
# state file's write-and-rename cost 0.15 ms each even on tmpfs. A torn read (the worker died
# inside the pwrite) can only disagree with the JSON's case id, and is then ignored.
STAGE_RECORD = 1024


def _stage_record(case_id: str | None, stage: str) -> bytes:
    raw = f"{case_id or ''}\0{stage}".encode("utf-8", "replace")[:STAGE_RECORD]
    return raw.ljust(STAGE_RECORD, b"\0")


def read_stage(path: str | os.PathLike) -> tuple[str, str] | None:
    """(case id, stage) from a stage breadcrumb, or None."""
    try:
        raw = Path(path).read_bytes()[:STAGE_RECORD].rstrip(b"\0").decode("utf-8", "replace")
    except OSError:
        return None
    if "\0" not in raw:
        return None
    case_id, stage = raw.split("\0", 1)
    return case_id, stage


class WorkerState:
    """The worker's breadcrumbs: faulthandler file, JSON state file, stage record.

    The state file is replaced atomically at each case's start and end so the controller
    never reads half of it, however the worker dies; the stage within a case is one
    fixed-size record overwritten in place (STAGE_RECORD).
    """

    def __init__(self, state_dir: str | os.PathLike, worker: str):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.pid = os.getpid()
        self.fault_path = self.dir / f"{worker}.{self.pid}.fault"
        self.state_path = self.dir / f"{worker}.json"
        self.stage_path = self.dir / f"{worker}.stage"
        self._stage_fd = os.open(self.stage_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fault_file = open(self.fault_path, "w")
        faulthandler.enable(file=self._fault_file, all_threads=True)
        self.recent: list[str] = []
        self.data: dict[str, Any] = {
            "worker": worker, "pid": self.pid, "fault_file": str(self.fault_path),
            "stage_file": str(self.stage_path), "case_id": None, "stage": "", "recent": [], "timeout_s": None,
            "context": None, "retired": None,
        }
        self._write()

    def _write(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.state_path)

    def begin(self, case_id: str, timeout_s: float | None) -> None:
        """Before a case: record it, then arm the hang timer."""
        self.data.update(case_id=case_id, stage="start", recent=list(self.recent),
                         timeout_s=timeout_s, started=time.time())
        self._write()
        self._write_stage("start")
        if timeout_s:
            # A C thread that needs no GIL: fires even inside a kernel's loop,
            # dumps every thread's traceback to the fault file, then _exit(1).
            faulthandler.dump_traceback_later(timeout_s, exit=True, file=self._fault_file)

    def stage(self, name: str) -> None:
        self.data["stage"] = name
        self._write_stage(name)

    def _write_stage(self, name: str) -> None:
        os.pwrite(self._stage_fd, _stage_record(self.data["case_id"], name), 0)

    def end(self, case_id: str) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.recent = (self.recent + [case_id])[-RECENT:]
        self.data.update(case_id=None, stage="", recent=list(self.recent))
        self._write()
        self._write_stage("")

    def set_context(self, context: dict) -> None:
        self.data["context"] = context
        self._write()

    def retire(self, reason: str) -> None:
        """Leave the reason where the controller will look, then exit."""
        self.data["retired"] = reason
        self._write()
        self._fault_file.flush()
        fast_exit.flush_coverage()   # os._exit skips a coverage run's writers
        os._exit(RETIRE_EXIT)


def health_probe() -> str | None:
    """None when the device is healthy, else the error text.

    On a GPU: a tiny kernel and a synchronize, which surface a sticky error
    (illegal address, HSA exception) left by the previous case. On the host
    there is no device state to poison, so nothing to probe.
    """
    if _FORCED_UNHEALTHY:
        return _FORCED_UNHEALTHY[0]
    try:
        import torch
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        x = torch.ones(16, device="cuda")
        (x * 2).sum().item()
        torch.cuda.synchronize()
    except Exception as e:  # a sticky device error raises on any call
        return f"{type(e).__name__}: {e}"
    return None


# Test hook: the faults target poisons the "device" through this list.
_FORCED_UNHEALTHY: list[str] = []

def is_sticky_device_error(message: str) -> bool:
    """A CUDA/HIP error that leaves the context unusable for every later case."""
    return names_device_fault(message)


# ------------------------------------------------------------ controller side

@dataclass
class Death:
    kind: str        # "crash" | "hang" | "retired"
    cause: str       # "SIGFPE", "exit code 3", "timeout after 5 s", retire reason
    stage: str       # last stage reached ("" when unknown)
    case_id: str | None   # the case the worker was in, per its state file
    recent: list[str]     # case ids the worker ran before it
    timeout_s: float | None
    fault_text: str
    context: dict | None


def read_state(state_dir: str | os.PathLike, worker: str) -> dict:
    """The worker's JSON state, its stage taken from the stage record when that record is
    about the same case."""
    try:
        state = json.loads((Path(state_dir) / f"{worker}.json").read_text())
    except (OSError, ValueError):
        return {}
    record = read_stage(state["stage_file"]) if state.get("stage_file") else None
    if record is not None and record[0] == (state.get("case_id") or ""):
        state["stage"] = record[1]
    return state


def parse_fault_text(text: str) -> tuple[str, str] | None:
    """(kind, cause) from a faulthandler dump, or None when it holds nothing fatal."""
    m = _TIMEOUT_RE.search(text)
    if m:
        h, mi, s = (int(g) for g in m.groups())
        return "hang", f"timeout after {h * 3600 + mi * 60 + s} s"
    for header, name in _FAULT_NAMES.items():
        if f"Fatal Python error: {header}" in text:
            return "crash", name
    return None


def diagnose(state_dir: str | os.PathLike, worker: str, exitcode: int | None) -> Death:
    """Why a worker died, from its state file, fault file and exit status."""
    state = read_state(state_dir, worker)
    fault_text = ""
    if state.get("fault_file"):
        try:
            fault_text = Path(state["fault_file"]).read_text(errors="replace")
        except OSError:
            pass
    stage = state.get("stage") or ""
    common = dict(stage=stage, case_id=state.get("case_id"), recent=state.get("recent") or [],
                  timeout_s=state.get("timeout_s"), fault_text=fault_text,
                  context=state.get("context"))
    if state.get("retired"):
        return Death("retired", state["retired"], **common)
    parsed = parse_fault_text(fault_text)
    if parsed:
        return Death(parsed[0], parsed[1], **common)
    if exitcode is not None and exitcode < 0:
        return Death("crash", signal_text(exitcode), **common)
    if exitcode == RETIRE_EXIT:
        return Death("retired", "worker retired itself", **common)
    if exitcode:
        return Death("crash", f"exit code {exitcode}", **common)
    return Death("crash", "worker died (exit status unknown)", **common)


def worker_exitcode(node, wait_s: float = 5.0) -> int | None:
    """The dead xdist worker's exit status, from its execnet popen gateway."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    try:
        return popen.wait(timeout=wait_s)
    except Exception:
        return popen.returncode
