"""The bundled HIP attention library: FlashInfer-shaped Python over a C ABI (see csrc/).

Tensors live on the CPU for the host platform and on the GPU otherwise; kernels launch on the
caller's current stream and never synchronize. Refusals raise ValueError (see guards.py).
"""
from .decode import BatchDecodeWithPagedKVCacheWrapper  # noqa: F401
from .merge import merge_state, merge_state_in_place  # noqa: F401
from .mixed import decode_first_attention  # noqa: F401
from .prefill import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper  # noqa: F401
from .single import single_decode_with_kv_cache, single_prefill_with_kv_cache  # noqa: F401



def build_info() -> dict:
    """dict(platform, arch, build_hash, path) of the library this process loads (built on first use)."""
    from .build import build_info as info
    return info()


__all__ = [
    "build_info", "single_prefill_with_kv_cache", "single_decode_with_kv_cache",
    "BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
    "BatchDecodeWithPagedKVCacheWrapper", "merge_state", "merge_state_in_place", "decode_first_attention",
]
