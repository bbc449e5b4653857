"""Injected failures for the harness's own tests. Refused unless KERNELS_TESTONLY=1, so nothing
reaches them by accident.

Crashes (in the shipped library too: nothing runs unless called): divide_by_zero() SIGFPE,
null_write() SIGSEGV, abort() SIGABRT, hang(), exit3().

Kernel faults live only in the test-only library, libkernels_testonly.so: the same sources
built with -DKERNELS_TEST_FAULTS and csrc/testonly/ (kernels.build, variant "testonly"). The
shipped libkernels.so has no fault branch and reads no environment variable. Each fault makes
the real kernels take the path a known class of bug takes:

  merge_no_max     every merge (split-KV partials, merge_state, run(partial_state=)) weights a
                   state by exp(lse) without subtracting the larger lse: an LSE past ~88.7
                   overflows fp32 (values=large_logits)
  softmax_no_max   the online softmax sums exp(logit) with no running max: a logit past ~88.7
                   overflows (values=large_logits)
  empty_skipped    a kernel returns early for a request with kv_len 0, leaving its rows
                   unwritten (edge_rows: empty requests)
  masked_row_nan   a row that attends to nothing and is written straight to the output comes
                   out 0 / 0 (edge_rows: fully masked rows, empty requests)

Faults on a crossing or a boundary (tests/test_reach_faults.py holds each to the cases that
reach it; the ci profile before them missed each one):

  page_offset_mask       a key's slot in its page by a mask (j & (page_size - 1)), not a
                         division: right only for pages of 2^n tokens (valid: pages of 3, 12
                         and 24)
  token_offset_32        a ragged or dense k/v element offset wraps at 32 bits (scale: a k or
                         v view whose token stride puts rows past 2^31 elements)
  workspace_without_lse  plan() sizes a split's float workspace without the partial LSEs, so
                         a buffer one byte short of the need is taken as a fit (schedule)
  empty_merge_keeps_a    a merge of two empty states (LSE -inf) writes state a's values, not 0
                         (values / edge_rows: a caller's empty state holding values)
  feature_dims_qk        a sink's or v_scale's rescale of the output stops at head_dim_qk
                         (features: the covering set's head_dim_vo > head_dim_qk crossings)

    use_fault_library("softmax_no_max")   # this process's kernels.* calls now run the test-only
    ...                                   # library with that fault (None or "none": no fault)
    use_default_library()                 # back to the shipped library
    with fault_library("merge_no_max"): ...   # the same, restoring what was loaded before

A process started with KERNELS_TESTONLY_FAULT=<name> (and KERNELS_TESTONLY=1) makes that
choice once, when its first call loads a library; an unknown name, or one without
KERNELS_TESTONLY=1, makes every call fail with a message naming it.
"""
from __future__ import annotations

import contextlib
import os

import torch

from . import _lib

FAULTS = {"sigfpe": 1, "sigsegv": 2, "abort": 3, "hang": 4}
# The faults a case family catches (tests/test_generator_reach.py holds each to its family).
KERNEL_FAULTS = ("merge_no_max", "softmax_no_max", "empty_skipped", "masked_row_nan")
# One plausible defect per feature (kernels/README.md "Features"); each shows only on inputs
# that use its feature (tests/test_kernels_features.py).
FEATURE_FAULTS = ("softcap_after_mask", "sink_in_numerator", "alibi_kv_head", "fp8_scale_twice",
                  "decode_rows_at_last_position", "custom_mask_transposed")
# One per class of generator reach round three: a crossing or boundary only the cases built
# for it visit (tests/test_reach_faults.py).
REACH_FAULTS = ("page_offset_mask", "token_offset_32", "workspace_without_lse",
                "empty_merge_keeps_a", "feature_dims_qk")
KERNEL_FAULT_ENV = _lib.FAULT_ENV

# (variant, fault) loaded now; fault None on the shipped library.
_current = ("default", None)


def _allowed(name: str) -> None:
    if os.environ.get("KERNELS_TESTONLY") != "1":
        raise ValueError(f"testonly.{name}(): set KERNELS_TESTONLY=1 to reach injected failures")


def kernel_faults() -> tuple[str, ...]:
    """Every fault the test-only library knows, in its order (builds it on first use)."""
    _allowed("kernel_faults")
    return tuple(_lib.open_variant("testonly").kernels_testonly_kernel_faults().decode().split(","))


def use_fault_library(fault: str | None) -> None:
    """Run this process's kernels.* calls on the test-only library with `fault` active (None or
    "none": the test-only library with no fault). ValueError for an unknown fault."""
    global _current
    if os.environ.get("KERNELS_TESTONLY") != "1":
        raise ValueError(f"kernel fault {fault}: set KERNELS_TESTONLY=1 to reach injected faults "
                         f"(testonly.use_fault_library)")
    name = fault or "none"
    h = _lib.open_variant("testonly")
    if h.kernels_testonly_set_kernel_fault(name.encode()) != 0:
        raise ValueError(h.kernels_last_error().decode())
    _lib.use_variant("testonly")
    _current = ("testonly", None if name == "none" else name)


def use_default_library() -> None:
    """Back to the shipped library (the test-only one stays open, its fault as set)."""
    global _current
    _lib.use_variant("default")
    _current = ("default", None)


def active_fault() -> str | None:
    """The fault the loaded library runs with (None: none, or the shipped library)."""
    return _current[1] if _lib._handle is not None else None


@contextlib.contextmanager
def fault_library(fault: str | None):
    """use_fault_library(fault) for the with block, then what was loaded before."""
    before = _current if _lib._handle is not None else ("default", None)
    use_fault_library(fault)
    try:
        yield
    finally:
        if before[0] == "default":
            use_default_library()
        else:
            use_fault_library(before[1])


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
