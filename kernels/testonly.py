"""Injected failures for the harness's own tests: each dies the way a broken kernel does.

Refused unless KERNELS_TESTONLY=1, so nothing reaches them by accident.
"""
from __future__ import annotations

import os

import torch

from . import _lib

FAULTS = {"sigfpe": 1, "sigsegv": 2, "abort": 3, "hang": 4}


def _allowed(name: str) -> None:
    if os.environ.get("KERNELS_TESTONLY") != "1":
        raise ValueError(f"testonly.{name}(): set KERNELS_TESTONLY=1 to reach injected failures")


def _fault(name: str, divisor: int = 0, flag: torch.Tensor | None = None) -> None:
    _allowed(name)
    stream = _lib.stream_of(flag) if flag is not None else None
    _lib.call("kernels_testonly_fault", FAULTS[name], divisor, _lib.ptr(flag), stream)


def divide_by_zero() -> None:
    """Integer division by zero in a host kernel: SIGFPE."""
    _fault("sigfpe", 0)


def null_write() -> None:
    """A write through a null pointer: SIGSEGV."""
    _fault("sigsegv", 0)


def abort() -> None:
    """abort(): SIGABRT."""
    _fault("abort")


def hang() -> None:
    """A kernel that spins on a flag nobody sets; on a GPU the wait is at the synchronize."""
    _allowed("hang")
    device = "cpu" if _lib.platform() == "host" else "cuda"
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    _fault("hang", flag=flag)
    if device == "cuda":
        torch.cuda.synchronize()


def exit3() -> None:
    """os._exit(3): the process ends with no exception and no signal."""
    _allowed("exit3")
    os._exit(3)
