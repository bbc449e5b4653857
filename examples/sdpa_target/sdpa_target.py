"""A complete target adapter, as a user writes one for their own library: torch's
scaled_dot_product_attention as a single-prefill kernel. docs/targets.md is the contract.

Installed by entry point (pyproject.toml beside this file), it appears as `example-sdpa` in
`harness list --target example-sdpa`; or pass it as `--target path/to/sdpa_target.py`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.targets import Capabilities, Skip, Target


class SdpaSinglePrefill(Target):
    name = "example-sdpa"
    routes = ("sdpa.single_prefill",)
    capabilities = Capabilities(
        ops=frozenset({"single_prefill"}),
        call_forms=frozenset({"lse"}),     # returns the LSE; takes no out= buffer
        # Its messages call the kv heads "key heads" (judged as whole words with the values).
        vocabulary={"num_kv_heads": ("key_heads",)},
    )

    def version(self) -> str:
        return torch.__version__

    def platform(self) -> str:
        return "cpu"

    def run(self, case, problem, buffers):
        p = problem
        if p.batch_size != 1:
            raise Skip("one request per call")
        if case.params.get("strided") or case.params.get("window_left", -1) >= 0:
            raise Skip("no strided views or sliding windows in this example")
        q = p.q[0].transpose(0, 1).unsqueeze(0)                  # [1, Hq, L, D]
        k = p.k[0].transpose(0, 1).unsqueeze(0)                  # [1, Hkv, S, D]
        v = p.v[0].transpose(0, 1).unsqueeze(0)
        for name, t in (("q", q), ("k", k), ("v", v)):
            buffers.watch(t, name)                               # inputs must not change
        qo, kv = p.qo_lens[0], p.kv_lens[0]
        mask = None
        if p.causal:                                             # bottom-right aligned
            rows = torch.arange(qo, device=p.device)[:, None] + (kv - qo)
            mask = torch.arange(kv, device=p.device)[None, :] <= rows
        buffers.stage("run")                    # from here on, an exception is the library's
        if p.num_kv_heads <= 0 or p.num_qo_heads % p.num_kv_heads:
            # The library's own refusal, in its own words: "key_heads" is its name for our
            # num_kv_heads (the vocabulary above), and the values are in the message.
            raise ValueError(f"key_heads {p.num_kv_heads} must divide num_qo_heads "
                             f"{p.num_qo_heads}")
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.sm_scale,
                                           enable_gqa=p.num_qo_heads != p.num_kv_heads)
        result = {"o": o[0].transpose(0, 1)}                     # [L, Hq, Dv]
        if p.return_lse:                                         # natural log, [L, Hq]
            kk = k.repeat_interleave(p.num_qo_heads // p.num_kv_heads, dim=1)
            s = (q.float() @ kk.float().transpose(-1, -2)) * p.sm_scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            result["lse"] = torch.logsumexp(s, dim=-1)[0].transpose(0, 1)
        return result


def make_target() -> Target:
    return SdpaSinglePrefill()
