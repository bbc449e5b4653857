"""Batch decode over a paged KV cache: fa2 (optionally through the prefill kernel), an
aiter-style route whose kernel writes no LSE, and an ll4mi-style route with its selector."""
from __future__ import annotations

import torch

from . import guards
from .prefill import BatchPrefillWithPagedKVCacheWrapper
from ._launch import run_features
from ._plan import host_ints

BACKENDS = ("fa2", "auto", "aiter", "ll4mi")


class BatchDecodeWithPagedKVCacheWrapper(BatchPrefillWithPagedKVCacheWrapper):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="fa2"):
        super(BatchPrefillWithPagedKVCacheWrapper, self).__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph,
            dict(kv_indptr=paged_kv_indptr_buffer, indices=paged_kv_indices_buffer,
                 last_page_len=paged_kv_last_page_len_buffer), backend, BACKENDS)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._shadow = None
        self._kept = None

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             window_left=-1, q_data_type=torch.float16, kv_data_type=None, sm_scale=None, max_kv_chunk=None,
             logits_soft_cap=0.0, q_len_per_req=1, **ignored):
        """q_len_per_req > 1: a multi-token (speculative verify) decode, q_len_per_req q rows per
        request, causal within the request (bottom-right aligned)."""
        guards.multi_token_decode_rows("plan()", q_len_per_req)
        # The other arms need a q_len_per_req the guard above refuses, i.e. multi_token_decode_rows disabled; ci disables none.
        n = q_len_per_req if isinstance(q_len_per_req, int) and q_len_per_req > 0 else 1
        kvp, last = host_ints(indptr), host_ints(last_page_len)
        batch = len(kvp) - 1
        d = self._dims(num_qo_heads, num_kv_heads, head_dim, head_dim, n > 1, window_left, sm_scale,
                       q_data_type, kv_data_type, logits_soft_cap, page_size=page_size, rows=max(batch, 0) * n,
                       batch=max(batch, 0), q_len_per_req=n)
        # aiter's kernel has no LSE output, so its plan cannot split (there is nothing to merge).
        self._plan_paged("plan()", [r * n for r in range(batch + 1)], kvp, indices, last, d, max_kv_chunk,
                         unsplit=self._backend == "aiter")
        self._shadow = None
        if self._backend == "aiter":
            # For the lazy fa2 shadow plan at the first return_lse run. A CPU tensor's .to("cpu")
            # is the caller's own tensor, which the caller may restage before that run.
            self._kept = dict(indptr=guards.plan_copies_indptr(indptr), indices=guards.plan_copies_indptr(indices),
                              last_page_len=guards.plan_copies_indptr(last_page_len), num_qo_heads=num_qo_heads,
                              num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                              window_left=window_left, q_data_type=q_data_type, kv_data_type=kv_data_type,
                              sm_scale=sm_scale, max_kv_chunk=max_kv_chunk, logits_soft_cap=logits_soft_cap,
                              q_len_per_req=q_len_per_req)
        self._route = (guards.ll4mi_route_selector(head_dim, window_left, n) if self._backend == "ll4mi"
                       else "fa2")

    def run(self, q, paged_kv_cache, out=None, lse=None, return_lse=False, sinks=None, alibi_slopes=None,
            k_scale=None, v_scale=None, **ignored):
        """q [batch * q_len_per_req, Hq, D]; sinks / alibi_slopes fp32 [Hq]; k_scale / v_scale floats."""
        where = "run()"
        if self._backend == "aiter" and return_lse:
            # Reachable by an aiter run(return_lse=True) before plan() or after a failed one; no ci case yet.
            if self._state != "ok":  # the guard passes an "ok" plan whether it is on or off
                guards.half_planned_refuses(where, self._state)
            return self._shadow_plan().run(q, paged_kv_cache, out=out, lse=lse, return_lse=True, sinks=sinks,
                                           alibi_slopes=alibi_slopes, k_scale=k_scale, v_scale=v_scale)
        P = self._p
        # Checked in full, or skipped when everything the checks read matches the last call that
        # passed them (_prepare_paged); half_planned_refuses comes first, as it always did.
        q, k, v, kd, vd, qst, out, lse = self._prepare_paged(where, q, paged_kv_cache, out, lse, return_lse,
                                                             rows_field="batch_size")
        if P.get("q_len_per_req", 1) > 1:
            guards.multi_token_decode_rows(where, P["q_len_per_req"], q.shape[0])
        feat = run_features(where, P["num_qo_heads"], sinks, alibi_slopes, k_scale, v_scale)
        common = dict(page_size=P["page_size"], kv_indices=self._bufs["indices"], q_stride=qst, feat=feat)
        if self._backend == "aiter":
            return self._run(where, "kernels_decode", q, k, v, kd, vd, out, None, False, lse_written=False, **common)
        if self._backend == "ll4mi" and self._route == "ll4mi" and not return_lse:
            # One unsplit work item per request; the kernel takes no window and writes no LSE.
            sched = dict(self._plan_sched, split=False, num_work=len(self._p_batch()),
                         ptrs={k_: None for k_ in self._plan_sched["ptrs"]})
            return self._run(where, "kernels_ll4mi_decode", q, k, v, kd, vd, out, None, False, sched=sched,
                             lse_written=False, **common)
        entry = "kernels_prefill" if self._use_tensor_cores else "kernels_decode"
        return self._run(where, entry, q, k, v, kd, vd, out, lse, return_lse, **common)

    def _p_batch(self):
        return range(self._p.get("batch", self._p["rows"]))

    def _shadow_plan(self):
        # Reachable by a second aiter run(return_lse=True) on one plan (the shadow is reused); no ci case yet.
        if self._shadow is None:
            kept = self._kept
            shadow = BatchDecodeWithPagedKVCacheWrapper(self._ws, self._kv_layout, backend="fa2")
            shadow.plan(kept["indptr"], kept["indices"], kept["last_page_len"], kept["num_qo_heads"],
                        kept["num_kv_heads"], kept["head_dim"], kept["page_size"], window_left=kept["window_left"],
                        q_data_type=kept["q_data_type"], kv_data_type=kept["kv_data_type"],
                        sm_scale=kept["sm_scale"], max_kv_chunk=kept["max_kv_chunk"],
                        logits_soft_cap=kept["logits_soft_cap"], q_len_per_req=kept["q_len_per_req"])
            self._shadow = shadow
        return self._shadow
