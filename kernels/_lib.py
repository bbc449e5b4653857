"""ctypes binding of the C ABI: the library handle, AttnParams, and status -> ValueError."""
from __future__ import annotations

import ctypes as C
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
    ]


DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

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

_lock = threading.Lock()
_handle = None
_platform = None  # kernels_platform() of the loaded library, which cannot change in a process


def lib():
    global _handle
    if _handle is None:
        with _lock:
            if _handle is None:
                from .build import build_info
                h = C.CDLL(build_info()["path"])
                for name, (args, res) in _SIGNATURES.items():
                    fn = getattr(h, name)
                    fn.argtypes, fn.restype = args, res
                if h.kernels_params_size() != C.sizeof(AttnParams):
                    raise RuntimeError("kernels: AttnParams in _lib.py disagrees with csrc/params.h")
                _handle = h
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
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream
    return None
