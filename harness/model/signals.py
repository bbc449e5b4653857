"""How a process's end is named on a row: 'SIGSEGV' for a signal, 'exit 3' for an exit status.

Its own module so that what only watches processes (harness/engine/isolation.py, and through it
every parent that relays to a child) does not import the comparison code and torch with it.
"""
from __future__ import annotations

import signal


def signal_text(signal_or_exit) -> str:
    """'SIGSEGV' for a signal (a negative exit status is one), 'exit 3' for an exit status."""
    if isinstance(signal_or_exit, str):
        return signal_or_exit
    if isinstance(signal_or_exit, signal.Signals):
        return signal_or_exit.name
    if isinstance(signal_or_exit, int) and signal_or_exit < 0:
        try:
            return signal.Signals(-signal_or_exit).name
        except ValueError:
            return f"signal {-signal_or_exit}"
    return f"exit {signal_or_exit}"


# Signals a library does not send itself: a worker that dies of one was killed from outside
# (the kernel's OOM killer, an operator, a CI runner). Its row is the library's crash only if
# the case dies so again alone in a fresh process (engine/plugins/replay.py).
FROM_OUTSIDE = frozenset({"SIGKILL", "SIGTERM", "SIGHUP"})


# The words of a CUDA/HIP error that leaves the device context unusable for every later call
# in the process: an exception carrying one is a crash of the case (never a refusal), and a
# row that says one retires its worker.
DEVICE_FAULT_WORDS = ("CUDA error", "HIP error", "hipError", "cudaError",
                      "illegal memory access", "device-side assert", "HSA_STATUS",
                      "memory access fault", "unspecified launch failure",
                      "an illegal instruction", "misaligned address", "hardware exception")


def names_device_fault(text: str) -> bool:
    low = (text or "").lower()
    return any(w.lower() in low for w in DEVICE_FAULT_WORDS)


def raises_device_fault(message: str) -> bool:
    """Whether an exception's message reports a device fault: its first line must name one.

    The runtimes put the fault on the first line ("CUDA error: an illegal memory access
    ..."); what follows may be anything, e.g. a JIT compiler's output quoting source that
    says `cudaError_t`. A library whose kernel build failed has not faulted the device, and
    calling it so would make its failure a crash and retire a healthy worker."""
    lines = (message or "").strip().splitlines()
    return bool(lines) and names_device_fault(lines[0])
