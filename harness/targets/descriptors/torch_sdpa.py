"""torch SDPA's descriptor: one call per request, no batch description (so no metadata
relation reaches it). Pure data: importing it imports no torch."""
from harness.model.capabilities import Capabilities
from harness.model.signature import Arg, Signature

NAME = "torch-sdpa"
OPS = ("single_prefill", "single_decode")
CALL = "scaled_dot_product_attention"
SIGNATURE = Signature(args=(
    Arg("query", "q", CALL, layout="[1, Hq, L, D]"),
    Arg("key", "k", CALL, layout="[1, Hkv, S, D]"),
    Arg("value", "v", CALL, layout="[1, Hkv, S, Dv]"),
    Arg("attn_mask", "custom_mask", CALL),
    Arg("is_causal", "causal", CALL),
    Arg("scale", "scale", CALL),
    Arg("enable_gqa", "variant_flags", CALL),
))
CAPABILITIES = Capabilities(ops=frozenset(OPS), call_forms=frozenset({"lse"}),
                            features=frozenset({"alibi"}), signature=SIGNATURE)
