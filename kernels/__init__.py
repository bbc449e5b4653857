"""The bundled HIP attention library: FlashInfer-shaped Python over a C ABI (see csrc/).

Tensors live on the CPU for the host platform and on the GPU otherwise; kernels launch on the
caller's current stream and never synchronize. Refusals raise ValueError (see guards.py).
Names load on first use, so `python -m kernels.build` does not import torch for a host build.
"""
import importlib

__version__ = "0.1.0"

_WHERE = {
    "single_prefill_with_kv_cache": "single", "single_decode_with_kv_cache": "single",
    "BatchPrefillWithPagedKVCacheWrapper": "prefill", "BatchPrefillWithRaggedKVCacheWrapper": "prefill",
    "BatchDecodeWithPagedKVCacheWrapper": "decode", "merge_state": "merge", "merge_state_in_place": "merge",
    "decode_first_attention": "mixed", "build_info": "build",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
