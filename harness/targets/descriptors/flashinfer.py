"""FlashInfer's descriptor: its plan()/run() wrappers (the plan_run core performs them), a
base-2 LSE, fp16/bf16. Pure data: no torch, no flashinfer."""
from harness.model.capabilities import Capabilities
from harness.model.signature import Signature
from harness.targets.descriptors._flashinfer_shape import plan_run_args

NAME = "flashinfer"
ROUTES_FA2 = (
    "fi_fa2.single_prefill", "fi_fa2.single_decode", "fi_tc.single_decode",
    "fi_fa2.paged_prefill", "fi_fa2.ragged_prefill",
    "fi_fa2.batch_decode", "fi_tc.batch_decode", "fi.merge_state",
)
ROUTES_FA3 = ("fi_fa3.single_prefill", "fi_fa3.paged_prefill", "fi_fa3.ragged_prefill")
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill", "batch_decode",
       "merge_state")
SIGNATURE = Signature(args=plan_run_args(lse_encoding="base2"), core="plan_run")
CAPABILITIES = Capabilities(ops=frozenset(OPS), dtypes=frozenset({"fp16", "bf16"}),
                            features=frozenset({"plan_run", "graphs", "restage", "softcap",
                                                "fp8_kv", "custom_mask",
                                                "multi_token_decode"}),
                            signature=SIGNATURE)
