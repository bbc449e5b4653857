"""The pure-PyTorch reference: what every library's answer is compared with.

Computed from the problem's logical per-request q/k/v, never from a
library's buffers, so a layout bug in an adapter or a library cannot leak
into the expected values. Always float64, on the device of the problem it is
given (the engine gives a small device problem's CPU copy: Problem.on_host): an
fp32 case needs a reference finer than its own fp32 baseline, and the logits are
computed in bounded blocks, so fp64 costs time, not memory.

attention_baseline is the same computation done in the input dtype (the
tolerance model's yardstick, harness/model/tolerance.py).

Conventions (FlashInfer's): causal is bottom-right aligned, so with qo_len L
and kv_len K query row i sees kv j <= i + K - L; window_left w >= 0 also
requires j >= i + K - L - w. LSE is the natural log. A row that sees no kv
gives output 0 and LSE -inf.

Features, in this order for the logit of query row i and key j (kernels/README.md's order,
which is FlashInfer's and vLLM's):

1. s = q . k * sm_scale, k dequantized first: an fp8 (or scaled) cache's k is its stored
   values times k_scale, v likewise times v_scale (the exact stored bytes: quantization
   error is the problem's, not the library's);
2. soft cap c > 0: s = c * tanh(s / c);
3. ALiBi: s += slope[h] * (j - pos), h the q head (never its kv head), pos = i + K - L: the
   query's key position, bottom-right aligned exactly as causal is, so a decode row
   (L = 1) sits at the last key and every bias is <= 0 there;
4. masking (causal, window, custom mask: a key must pass every mask given) removes a key
   entirely: it has no logit, capped or not;
5. softmax over the kept keys and, with sinks, one extra logit sinks[h] in the denominator
   only: o = sum_j exp(s_j - lse) v_j, lse = log(sum_j exp(s_j) + exp(sinks[h])). A row
   that keeps no key has o = 0 and lse = sinks[h] (-inf without sinks).

Multi-token decode (q_len_per_req n) is that same causal problem with L = n rows a request.
"""
from __future__ import annotations

import torch

from harness.model.problem import Problem


_LOGITS_BUDGET = 1 << 24   # elements of one logits block (128 MiB in fp64)


class NoReference(ValueError):
    """The problem has no defined answer (no kv heads, or no q heads)."""


def compute_dtype(device: torch.device | str | None = None) -> torch.dtype:
    return torch.float64


def kv_head_map(num_qo_heads: int, num_kv_heads: int) -> torch.Tensor:
    """The kv head each q head reads: qo_head // (Hq // Hkv) when the group divides.

    When it does not (12 q heads over 8 kv heads), there is no standard GQA and
    such inputs must be refused; the reference still defines the one mapping that
    spreads q heads evenly over every kv head (kv = qo * Hkv // Hq), so a library
    that runs anyway is judged by its values (seed 002 reports "wrong output"),
    not only as silent. With no kv heads there is nothing to attend to.
    """
    if num_kv_heads <= 0 or num_qo_heads <= 0:
        raise NoReference(
            f"num_qo_heads={num_qo_heads}, num_kv_heads={num_kv_heads}: "
            "attention needs at least one head of each; there is no reference")
    qo = torch.arange(num_qo_heads)
    if num_qo_heads % num_kv_heads == 0:
        return qo // (num_qo_heads // num_kv_heads)
    return qo * num_kv_heads // num_qo_heads


def visible_mask(qo_len: int, kv_len: int, causal: bool, window_left: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool [qo_len, kv_len]: True where query row i may attend to kv j."""
    i = torch.arange(qo_len, device=device).unsqueeze(1)
    j = torch.arange(kv_len, device=device).unsqueeze(0)
    diag = i + (kv_len - qo_len)   # the kv position aligned with query row i
    mask = torch.ones(qo_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= diag
    if window_left >= 0:
        mask &= j >= diag - window_left
    return mask


def _one_request(q, k, v, heads, scale, mask, ct, rounded: torch.dtype | None = None,
                 feats: dict | None = None):
    """q [L, Hq, D], k [K, Hkv, D], v [K, Hkv, Dv] -> o [L, Hq, Dv], lse [L, Hq], in ct.

    With `rounded`, the softmax weights P are rounded to it before P @ V and
    the output after, as a kernel working in that dtype does. feats: the problem's
    features (_features), applied in the module docstring's order.
    """
    f = feats or {}
    q = q.to(ct)
    k = k.to(ct) * f["k_scale"] if f.get("k_scale", 1.0) != 1.0 else k.to(ct)
    v = v.to(ct) * f["v_scale"] if f.get("v_scale", 1.0) != 1.0 else v.to(ct)
    heads = heads.to(k.device)
    k = k.index_select(1, heads)   # q head h reads kv head heads[h]
    v = v.index_select(1, heads)
    cap, slopes, sinks = f.get("cap", 0.0), f.get("slopes"), f.get("sinks")
    n_q, n_kv = q.shape[0], k.shape[0]
    # Query rows in blocks so the [Hq, rows, K] logits stay a bounded size.
    rows = max(1, _LOGITS_BUDGET // max(1, q.shape[1] * k.shape[0]))
    outs, lses = [], []
    for lo in range(0, max(q.shape[0], 1), rows):
        s = torch.einsum("lhd,khd->hlk", q[lo:lo + rows], k) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        if slopes is not None:
            i = torch.arange(lo, lo + s.shape[1], device=s.device, dtype=ct)
            j = torch.arange(n_kv, device=s.device, dtype=ct)
            dist = j.unsqueeze(0) - (i + (n_kv - n_q)).unsqueeze(1)     # key_pos - query_pos
            s = s + slopes.to(device=s.device, dtype=ct).view(-1, 1, 1) * dist
        s = s.masked_fill(~mask[lo:lo + rows], float("-inf"))
        if sinks is not None:
            sink = sinks.to(device=s.device, dtype=ct).view(-1, 1, 1).expand(-1, s.shape[1], 1)
            lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)   # finite: the sink
        else:
            lse = torch.logsumexp(s, dim=-1)               # [Hq, rows]; -inf when all masked
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
        if rounded is not None:
            p = p.to(rounded).to(ct)
        o = _weighted_values(p, v, mask[lo:lo + rows])
        outs.append(o.to(rounded).to(ct) if rounded is not None else o)
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def _weighted_values(p: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """o [L, Hq, Dv] = sum over each row's kept keys of p v: p [Hq, L, K], v [K, Hq, Dv],
    keep [L, K].

    A masked key is not in the sum at all (step 4): its weight is exactly 0, and 0 * inf is
    NaN, so a non-finite v of a masked key would leak into P @ V. Its non-finite entries are
    added key by key, only where the key is kept (a kept key's inf or NaN reaches the row as
    the arithmetic says)."""
    finite = torch.isfinite(v)
    if bool(finite.all()):
        return torch.einsum("hlk,khd->lhd", p, v)
    o = torch.einsum("hlk,khd->lhd", p, torch.where(finite, v, 0.0))
    for j in (~finite).flatten(1).any(1).nonzero().flatten().tolist():
        odd = torch.where(finite[j], 0.0, v[j])                      # [Hq, Dv]
        part = p[:, :, j].unsqueeze(-1) * odd.unsqueeze(1)           # [Hq, L, Dv]
        part = torch.where(keep[:, j].view(1, -1, 1) & ~finite[j].unsqueeze(1), part, 0.0)
        o = o + part.transpose(0, 1)
    return o


def _features(problem: Problem) -> dict:
    return {"k_scale": problem.k_scale, "v_scale": problem.v_scale,
            "cap": problem.logits_soft_cap, "slopes": problem.alibi_slopes,
            "sinks": problem.sinks}


def _attention(problem: Problem, ct: torch.dtype,
               rounded: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    heads = kv_head_map(problem.num_qo_heads, problem.num_kv_heads)
    dev = problem.device
    feats = _features(problem)
    masks = problem.custom_mask or [None] * problem.batch_size
    outs, lses = [], []
    for q, k, v, lq, lk, custom in zip(problem.q, problem.k, problem.v, problem.qo_lens,
                                       problem.kv_lens, masks):
        mask = visible_mask(lq, lk, problem.causal, problem.window_left, dev)
        if custom is not None:
            mask = mask & custom.to(dev)
        o, lse = _one_request(q, k, v, heads, problem.sm_scale, mask, ct, rounded, feats)
        outs.append(o)
        lses.append(lse)
    hq, dv = problem.num_qo_heads, problem.head_dim_vo
    o = torch.cat(outs) if outs else torch.empty(0, hq, dv, dtype=ct, device=dev)
    lse = torch.cat(lses) if lses else torch.empty(0, hq, dtype=ct, device=dev)
    return {"o": o, "lse": lse}


def attention_reference(problem: Problem) -> dict[str, torch.Tensor]:
    """{"o": [total_q, Hq, Dv], "lse": [total_q, Hq]} in fp64."""
    return _attention(problem, compute_dtype(problem.device))


def attention_baseline(problem: Problem) -> dict[str, torch.Tensor]:
    """The reference's computation done by PyTorch the way a kernel in the input dtype does it.

    The inputs are the dtype's; logits, softmax and the P @ V sums are fp32
    (every attention kernel accumulates there: tensor-core MMAs do); the
    softmax weights P are rounded to the dtype before P @ V and the output
    after, as FA2-style kernels do. Rounding the logits to bf16 as well (an
    unfused bf16 PyTorch graph) would make the bound ~10x looser than any
    kernel's real error and let a dropped key at kv 8192 pass. Its distance
    from the reference is how hard the problem is for that dtype.
    """
    return _attention(problem, torch.float32, problem.dtype)


def merge_reference(v_a: torch.Tensor, s_a: torch.Tensor,
                    v_b: torch.Tensor, s_b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Merge two attention states over disjoint kv sets (natural-log LSE).

    v [N, H, D], s [N, H] -> {"o": [N, H, D], "lse": [N, H]}: the attention
    over the union. Two empty states (both -inf) merge to output 0, LSE -inf.
    """
    ct = compute_dtype(v_a.device)
    v_a, s_a, v_b, s_b = (t.to(ct) for t in (v_a, s_a, v_b, s_b))
    s_max = torch.maximum(s_a, s_b)
    finite_max = torch.where(torch.isinf(s_max), 0.0, s_max)
    w_a, w_b = torch.exp(s_a - finite_max), torch.exp(s_b - finite_max)
    total = w_a + w_b
    safe = torch.where(total == 0, 1.0, total)
    o = (v_a * w_a.unsqueeze(-1) + v_b * w_b.unsqueeze(-1)) / safe.unsqueeze(-1)
    lse = torch.where(total == 0, float("-inf"), finite_max + torch.log(safe))
    return {"o": o, "lse": lse}
