"""The bundled HIP attention library: FlashInfer-shaped Python over a C ABI (see csrc/)."""
from .single import single_decode_with_kv_cache, single_prefill_with_kv_cache  # noqa: F401
