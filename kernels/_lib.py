"""ctypes binding of the C ABI: the library handle, AttnParams, and status -> ValueError."""
from __future__ import annotations

import ctypes as C
import os
import threading

import torch

_i64, _i32, _p = C.c_int64, C.c_int32, C.c_void_p


class AttnParams(C.Structure):
    """Mirror of csrc/params.h, field for field."""
    _fields_ = [
        ("q", _p), ("q_stride_n", _i64), ("q_stride_h", _i64),
        ("k", _p), ("k_stride_page", _i64), ("k_stride_n", _i64), ("k_stride_h", _i64),
        ("v", _p), ("v_stride_page", _i64), ("v_stride_n", _i64), ("v_stride_h", _i64),
        ("o", _p), ("lse", _p), ("partial_o", _p), ("partial_lse", _p),
        ("qo_indptr", _p), ("kv_indptr", _p), ("kv_indices", _p), ("kv_lens", _p),
        ("work_req", _p), ("work_kv_lo", _p), ("work_kv_hi", _p), ("work_slot", _p),
        ("work_nchunks", _p), ("merge_indptr", _p), ("live", _p),
        ("num_work", _i32), ("num_rows", _i32), ("qo_len", _i32), ("kv_len", _i32),
        ("num_qo_heads", _i32), ("num_kv_heads", _i32), ("head_dim_qk", _i32), ("head_dim_vo", _i32),
        ("page_size", _i32), ("causal", _i32), ("window_left", _i32), ("sm_scale", C.c_float),
        ("q_dtype", _i32), ("kv_dtype", _i32), ("o_dtype", _i32), ("split", _i32),
        ("max_qo_len", _i32),
        ("logits_soft_cap", C.c_float), ("k_scale", C.c_float), ("v_scale", C.c_float),
        ("sinks", _p), ("alibi_slopes", _p), ("custom_mask", _p), ("mask_indptr", _p),
    ]


DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# fp8 only as a KV cache element (paged prefill, batch decode).
FP8_CODES = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 4}

_SIGNATURES = {
    "kernels_last_error": ([], C.c_char_p),
    "kernels_platform": ([], C.c_char_p),
    "kernels_warp_size": ([], C.c_int),
    "kernels_params_size": ([], C.c_int),
    "kernels_prefill": ([C.POINTER(AttnParams), _p], C.c_int),
    "kernels_decode": ([C.POINTER(AttnParams), _p], C.c_int),
    "kernels_ll4mi_decode": ([C.POINTER(AttnParams), _p], C.c_int),
    "kernels_merge_state": ([_p, _p, _p, _p, _p, _p, _i64, C.c_int, C.c_int, C.c_int, _p], C.c_int),
    "kernels_merge_state_in_place": ([_p, _p, _p, _p, _i64, _p, C.c_int, C.c_int, C.c_int, _p], C.c_int),
    "kernels_schedule_len": ([_i64, _i64], _i64),
    "kernels_plan": ([_p, _p, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, C.c_int, _i64, _p, _i64, _i64, _p], C.c_int),
    "kernels_testonly_fault": ([C.c_int, C.c_int, _p, _p], C.c_int),
    "kernels_convert_host": ([_p, C.c_int, _p, C.c_int, _i64], C.c_int),
}

# Only the test-only library (libkernels_testonly.so) has these.
_TESTONLY_SIGNATURES = {
    "kernels_testonly_set_kernel_fault": ([C.c_char_p], C.c_int),
    "kernels_testonly_kernel_faults": ([], C.c_char_p),
}

# Read once, when the first call loads a library: a process started with it set (a harness
# worker of a test) loads the test-only library with that fault (kernels/testonly.py). No
# launch reads the environment.
FAULT_ENV = "KERNELS_TESTONLY_FAULT"

_lock = threading.RLock()
_handle = None
_opened: dict = {}  # variant -> CDLL, each opened once per process
_platform = None  # kernels_platform() of the loaded library, which cannot change in a process
_coverage: list = []  # the opened coverage builds' CDLLs (env KERNELS_COVERAGE_DIR), to flush


def _coverage_opened(h, info: dict) -> None:
    """A coverage build was opened: its counters go to <KERNELS_COVERAGE_DIR>/gcda/<unit>.gcda
    (libgcov's GCOV_PREFIX, read when it writes), so a run's counts start from nothing while
    the build, and its .gcno files, stay cached. A forked child starts from zero: what it
    inherited is the parent's to write."""
    from .build import COVERAGE_ENV
    objdir = info["coverage"]
    os.environ["GCOV_PREFIX"] = os.path.join(os.environ[COVERAGE_ENV], "gcda")
    os.environ["GCOV_PREFIX_STRIP"] = str(len(os.path.abspath(objdir).strip("/").split("/")))
    h.kernels_coverage_flush.argtypes, h.kernels_coverage_flush.restype = [], None
    h.kernels_coverage_reset.argtypes, h.kernels_coverage_reset.restype = [], None
    # One coverage build per ci process, and the lambda runs only in a child forked after one opened;
    # the ci run records no second build and no such child.
    if not _coverage:
        os.register_at_fork(after_in_child=lambda: [c.kernels_coverage_reset() for c in _coverage])
    _coverage.append(h)


def flush_coverage() -> None:
    """Write the coverage counters of every coverage build this process opened, then zero them;
    a no-op in any other process. For a process about to leave by os._exit, which skips
    libgcov's exit-time writer (harness/engine/fast_exit.py runs this first); concurrent
    writers are merged by libgcov under an fcntl lock on each .gcda."""
    for h in _coverage:
        h.kernels_coverage_flush()


def open_variant(variant: str):
    """The CDLL of a build variant ('default' or 'testonly'), built and opened on first use."""
    with _lock:
        h = _opened.get(variant)
        # Reachable by reopening a variant in one process (kernels.testonly switching back); no ci case yet.
        if h is None:
            from .build import build_info
            info = build_info(variant)
            h = C.CDLL(info["path"])
            # The testonly arm needs the fault library (KERNELS_TESTONLY_FAULT runs); the ci coverage run loads none.
            sigs = {**_SIGNATURES, **(_TESTONLY_SIGNATURES if variant == "testonly" else {})}
            for name, (args, res) in sigs.items():
                fn = getattr(h, name)
                fn.argtypes, fn.restype = args, res
            # Unreachable while _lib.py's AttnParams and csrc/params.h agree (only a stale build would differ).
            if h.kernels_params_size() != C.sizeof(AttnParams):
                raise RuntimeError("kernels: AttnParams in _lib.py disagrees with csrc/params.h")
            # The coverage run always opens the coverage build; only normal runs take the other arm.
            if "coverage" in info:
                _coverage_opened(h, info)
            _opened[variant] = h
        return h


def use_variant(variant: str):
    """Point every later call of this process at a variant's library; returns its CDLL."""
    global _handle
    with _lock:
        h = open_variant(variant)
        from . import build
        build.set_active(variant)
        _handle = h
        return h


def lib():
    global _handle
    if _handle is None:
        with _lock:
            # Taken only when another thread loads the library between the two checks; no ci case races.
            if _handle is None:
                # Needs KERNELS_TESTONLY_FAULT (the fault library's runs); the ci coverage run sets none.
                if os.environ.get(FAULT_ENV):
                    from .testonly import use_fault_library
                    use_fault_library(os.environ[FAULT_ENV])  # sets _handle, or raises at every call
                else:
                    use_variant("default")
    return _handle


def call(name: str, *args) -> None:
    """Call an entry point; a non-zero status raises ValueError with the library's message."""
    if getattr(lib(), name)(*args) != 0:
        raise ValueError(lib().kernels_last_error().decode())


def platform() -> str:
    """'host', or the GPU platform the library was built for; asked once (every run() reads it)."""
    global _platform
    if _platform is None:
        _platform = lib().kernels_platform().decode()
    return _platform


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def stream_of(t: torch.Tensor) -> int | None:
    """The caller's current stream on t's device (so a run is capturable); None on the host."""
    # GPU builds only: ci runs the host library on CPU tensors.
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream
    return None
