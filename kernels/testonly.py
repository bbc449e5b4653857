"""Injected failures for the harness's own tests: each dies the way a broken kernel does.

Refused unless KERNELS_TESTONLY=1, so nothing reaches them by accident.

Kernel faults. KERNELS_TESTONLY_FAULT=<name> (with KERNELS_TESTONLY=1), read by the C library
at every launch (csrc/testonly.h), makes the real kernels take the path a known class of bug
takes; each shows up only on inputs one case family generates:

  merge_no_max     every merge (split-KV partials, merge_state, run(partial_state=)) weights a
                   state by exp(lse) without subtracting the larger lse: an LSE past ~88.7
                   overflows fp32 (values=large_logits)
  softmax_no_max   the online softmax sums exp(logit) with no running max: a logit past ~88.7
                   overflows (values=large_logits)
  empty_skipped    a kernel returns early for a request with kv_len 0, leaving its rows
                   unwritten (edge_rows: empty requests)
  masked_row_nan   a row that attends to nothing and is written straight to the output comes
                   out 0 / 0 (edge_rows: fully masked rows, empty requests)

The name is checked by the library: an unknown one, or one without KERNELS_TESTONLY=1, makes
every launch fail with a message naming it.
"""
from __future__ import annotations

import os

import torch

from . import _lib

FAULTS = {"sigfpe": 1, "sigsegv": 2, "abort": 3, "hang": 4}
KERNEL_FAULTS = ("merge_no_max", "softmax_no_max", "empty_skipped", "masked_row_nan")
KERNEL_FAULT_ENV = "KERNELS_TESTONLY_FAULT"


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
