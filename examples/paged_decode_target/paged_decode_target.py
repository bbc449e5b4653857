"""A complete FlashInfer-shaped target adapter: a wrapper whose plan() takes the paged batch
(kv_indptr, kv_indices, last_page_len, head counts, page size) and whose run() takes q and
the caches. docs/targets.md ("A plan()/run() adapter: your own run()") is the contract.

DeclaredTarget hands only the block-table roles (query start locations, kv lengths, a block
table); a library indexed by kv_indptr / kv_indices / last_page_len is laid out by its
adapter's own run(), as here. The library is a small one in torch, standing in for yours.

Installed by entry point (pyproject.toml beside this file) it is `example-paged-decode`; or
pass `--target path/to/paged_decode_target.py`.
"""
from __future__ import annotations

import math

import torch

from harness.targets import Arg, Capabilities, Signature, Skip, Target
from harness.targets.layout import Views


# ---- the library under test (yours) ---------------------------------------------------------

class BatchDecodeWrapper:
    """plan() checks and copies the batch description; run() computes one query per request."""

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, sm_scale=None):
        ip, idx, lpl = indptr.tolist(), indices.tolist(), last_page_len.tolist()
        if not ip or ip[0] != 0 or any(b < a for a, b in zip(ip, ip[1:])) or ip[-1] > len(idx):
            raise ValueError(f"indptr {ip} must rise from 0 within indices' {len(idx)} entries")
        if len(lpl) != len(ip) - 1:
            raise ValueError(f"last_page_len has {len(lpl)} entries, indptr {len(ip) - 1}")
        for r, n in enumerate(lpl):
            pages = ip[r + 1] - ip[r]
            if (n != 0) if pages == 0 else not 1 <= n <= page_size:
                raise ValueError(f"last_page_len[{r}] is {n}; page_size {page_size}")
        if num_kv_heads < 1 or num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} not a multiple of "
                             f"num_kv_heads {num_kv_heads}")
        scale = 1 / math.sqrt(head_dim) if sm_scale is None else sm_scale
        self._plan = (ip, idx, lpl, num_qo_heads, num_kv_heads, head_dim, page_size, scale)

    def run(self, q, k_cache, v_cache, out=None):
        ip, idx, lpl, hq, hkv, d, ps, scale = self._plan
        if tuple(q.shape) != (len(lpl), hq, d):
            raise ValueError(f"q is {tuple(q.shape)}; planned {len(lpl)} requests, "
                             f"num_qo_heads {hq}, head_dim {d}")
        for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if tuple(c.shape[1:]) != (ps, hkv, d) or c.dtype != q.dtype:
                raise ValueError(f"{name} is {tuple(c.shape)} {c.dtype}; planned page_size "
                                 f"{ps}, num_kv_heads {hkv}, head_dim {d}, {q.dtype}")
        out = torch.empty_like(q) if out is None else out
        if tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"out is {tuple(out.shape)}, q {tuple(q.shape)}")
        for r in range(len(lpl)):
            pages = idx[ip[r]:ip[r + 1]]
            bad = [x for x in pages if not 0 <= x < k_cache.shape[0]]
            if bad:
                raise ValueError(f"indices: page {bad[0]} of request {r} outside "
                                 f"0..{k_cache.shape[0] - 1}")
            if not pages:                       # no key: the output is 0
                out[r] = 0
                continue
            n, ids = (len(pages) - 1) * ps + lpl[r], torch.tensor(pages, device=q.device)
            k = k_cache[ids].reshape(-1, hkv, d)[:n].double().repeat_interleave(hq // hkv, 1)
            v = v_cache[ids].reshape(-1, hkv, d)[:n].double().repeat_interleave(hq // hkv, 1)
            w = torch.softmax(torch.einsum("hd,shd->hs", q[r].double(), k) * scale, -1)
            out[r] = torch.einsum("hs,shd->hd", w, v).to(out.dtype)
        return out


# ---- the adapter ------------------------------------------------------------------------------

PLAN, RUN = "plan", "run"
# Fields this adapter's own code bends when a case's params["mismatch"] names them.
PERFORMS = ("num_qo_heads", "num_kv_heads", "head_dim_qk", "page_size", "last_page_len",
            "block_table")
SIGNATURE = Signature(core="", performs=PERFORMS, args=(
    Arg("indptr", "kv_offsets", PLAN, dtype="int32"),
    Arg("indices", "page_indices", PLAN, dtype="int32"),
    Arg("last_page_len", "last_page_lengths", PLAN, dtype="int32"),
    Arg("num_qo_heads", "num_qo_heads", PLAN),
    Arg("num_kv_heads", "num_kv_heads", PLAN),
    Arg("head_dim", "head_dim_qk", PLAN),
    Arg("page_size", "block_size", PLAN),
    Arg("sm_scale", "scale", PLAN),
    Arg("q", "q", RUN, layout="[batch, num_qo_heads, head_dim]"),
    Arg("k_cache", "k_cache", RUN, layout="[pages, page_size, num_kv_heads, head_dim]"),
    Arg("v_cache", "v_cache", RUN, layout="[pages, page_size, num_kv_heads, head_dim]"),
    Arg("out", "out", RUN),
))
PLAN_NAME = {"num_qo_heads": "num_qo_heads", "num_kv_heads": "num_kv_heads",
             "head_dim_qk": "head_dim", "page_size": "page_size"}


class PagedDecodeTarget(Target):
    name = "example-paged-decode"
    routes = ("pd.batch_decode",)
    capabilities = Capabilities(ops=frozenset({"batch_decode"}), layouts=frozenset({"NHD"}),
                                call_forms=frozenset({"out"}), features=frozenset({"plan_run"}),
                                signature=SIGNATURE)

    def version(self) -> str:
        return "0.1.0"

    def platform(self) -> str:
        return "cpu"

    def run(self, case, problem, buffers):
        p, params = problem, case.params
        # Read every param this library has no analogue for, and Skip naming it.
        for key, why in (("use_cuda_graph", "no graph mode"), ("scenario", "no scripted calls"),
                         ("cache_form", "k and v caches are separate tensors")):
            if params.get(key) not in (None, False, "tuple"):
                raise Skip(f"{key} {params.get(key)!r}: {why}")
        if p.window_left >= 0 or p.head_dim_vo != p.head_dim:
            raise Skip("no sliding window and one head_dim for k and v")
        params.get("max_kv_chunk")              # a split hint: no splits here, same answer
        ps, offset = params.get("page_size", 16), params.get("page_id_offset", 0)
        lens = list(p.kv_lens)
        if (offset + sum(lens) + ps) * p.num_kv_heads * p.head_dim > 1 << 26:
            raise Skip(f"page_id_offset {offset}: a pool this example will not allocate")
        npages = [-(-n // ps) for n in lens]
        indptr = [0]
        for n in npages:
            indptr.append(indptr[-1] + n)
        ids = list(range(offset, offset + indptr[-1]))
        if params.get("page_order", "shuffled") == "shuffled":
            perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(case.seed))
            ids = [ids[i] for i in perm]
        pool = offset + max(indptr[-1], 1)
        caches = [torch.full((pool, ps, p.num_kv_heads, p.head_dim), float("nan"),
                             dtype=p.kv_dtype, device=p.device) for _ in "kv"]
        for r, n in enumerate(lens):            # each token into its page; NaN elsewhere
            for j in range(npages[r]):
                rows = slice(j * ps, min(n, (j + 1) * ps))
                for cache, src in zip(caches, (p.k[r], p.v[r])):
                    cache[ids[indptr[r] + j], :rows.stop - rows.start] = src[rows]
        last = [(n - 1) % ps + 1 if n else 0 for n in lens]
        stated = {"num_qo_heads": p.num_qo_heads, "num_kv_heads": p.num_kv_heads,
                  "head_dim": p.head_dim, "page_size": ps}
        mm = params.get("mismatch")
        if mm:                                   # plan() told one value, the tensors another
            if mm.get("only"):
                raise Skip("k and v move together: one cache shape is planned for both")
            if mm["field"] in PLAN_NAME:
                stated[PLAN_NAME[mm["field"]]] = mm["value"]
            elif mm["field"] == "last_page_len":
                last[-1] = mm["value"]
            elif mm["field"] == "block_table" and npages[-1]:
                ids[indptr[-2]] = mm["value"]   # the last request's first page
            else:
                raise Skip(f"mismatch {mm['field']} not performed here")
        # Views under the families' tensor names (not the library's): a strided or int64
        # case names kv_indptr, kv_indices, last_page_len, q, k_cache, v_cache, out.
        views = Views(params, buffers)
        q = views.input("q", p.q_packed())
        k_cache, v_cache = (views.input(n, c) for n, c in zip(("k_cache", "v_cache"), caches))
        indptr_t = views.index("kv_indptr", indptr, "cpu")
        indices_t = views.index("kv_indices", ids, "cpu")
        last_t = views.index("last_page_len", last, "cpu")
        out = None
        if params.get("out_form") != "library":
            out = views.output("out", (q.shape[0], p.num_qo_heads, p.head_dim_vo), p.dtype)
        views.check_used()
        wrapper = BatchDecodeWrapper()
        buffers.stage("plan")
        wrapper.plan(indptr_t, indices_t, last_t, stated["num_qo_heads"],
                     stated["num_kv_heads"], stated["head_dim"], stated["page_size"],
                     sm_scale=params.get("sm_scale"))
        buffers.stage("run")
        result = {"o": wrapper.run(q, k_cache, v_cache, out=out)}
        if p.return_lse:
            result["not_returned"] = {"lse": "run() returns no LSE"}
        return result


def make_target() -> Target:
    return PagedDecodeTarget()
