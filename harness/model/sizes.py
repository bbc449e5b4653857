"""How big a case is, from its params alone: torch-free, so the controller can size and
time cases before (or without) importing torch."""
from __future__ import annotations


def case_work(params: dict) -> int:
    """The q.k products a case computes: sum(qo_len * kv_len) * heads * head_dim."""
    try:
        pairs = sum(int(q) * int(k) for q, k in zip(params.get("qo_lens", [1]),
                                                    params.get("kv_lens", [1])))
        return pairs * int(params.get("num_qo_heads", 1)) * int(params.get("head_dim", 1))
    except (TypeError, ValueError):
        return 0


def qkv_elements(params: dict) -> int:
    """q, k and v elements over every request (num_kv_heads and head_dim_vo default to
    num_qo_heads and head_dim): what a problem's inputs hold."""
    try:
        hq, d = int(params.get("num_qo_heads", 1)), int(params.get("head_dim", 1))
        hkv = int(params.get("num_kv_heads") or hq)
        dv = int(params.get("head_dim_vo") or d)
        return sum(int(q) * hq * d + int(k) * hkv * (d + dv)
                   for q, k in zip(params.get("qo_lens", [1]), params.get("kv_lens", [1])))
    except (TypeError, ValueError):
        return 0
