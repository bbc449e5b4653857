"""fa2 batch prefill wrappers: paged and ragged KV, plan() then run()."""
from __future__ import annotations

import torch

from . import guards
from . import _lib
from ._launch import (check_device, dense_dims, dense_kv_dims, launch, paged_dims, paged_kv_dims, params,
                      run_features, unpack_paged)
from ._lib import call, ptr, stream_of
from ._plan import Planned, host_ints

_T = torch.Tensor


def out_sig(t):
    """What the guards read of an out, lse or partial-state tensor: shape, contiguity, dtype,
    device (None for None). False when it is not a plain torch.Tensor: such a call is not memoized."""
    if t is None:
        return None
    # Reachable by an out/lse/partial_state half that is a tensor subclass (e.g. nn.Parameter); no ci case yet.
    if type(t) is not _T:
        return False
    return t.shape, t.is_contiguous(), t.dtype, t.device


def state_sig(partial_state):
    """out_sig of both halves of a partial_state (None for None); False when it is not a pair of
    plain tensors, which the full checks then see as the caller passed it."""
    # Unreachable from callers: _prepare_paged calls state_sig only when partial_state is given.
    if partial_state is None:
        return None
    # Reachable by a partial_state that is not a tuple/list, or not of two; no ci case yet.
    if type(partial_state) not in (tuple, list) or len(partial_state) != 2:
        return False
    a, b = out_sig(partial_state[0]), out_sig(partial_state[1])
    # Reachable by a partial_state with a None or tensor-subclass half; no ci case yet.
    return False if not a or not b else (a, b)


def paged_kv_lens(kv_indptr: list[int], last_page_len: list[int], page_size: int) -> list[int]:
    out = []
    for i, last in enumerate(last_page_len):
        pages = kv_indptr[i + 1] - kv_indptr[i]
        out.append((pages - 1) * page_size + last if pages > 0 else 0)
    return out


class _BatchRun(Planned):
    """run() shared by the paged and ragged wrappers (and batch decode)."""

    def _dims(self, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal, window_left, sm_scale,
              q_data_type, kv_data_type, logits_soft_cap=0.0, **more) -> dict:
        return dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim_qk,
                    # Reachable by a paged/ragged plan() without head_dim_vo or kv_data_type (ci passes both); no ci case yet.
                    head_dim_vo=head_dim_vo or head_dim_qk, causal=bool(causal), window_left=window_left,
                    sm_scale=sm_scale, q_data_type=q_data_type, kv_data_type=kv_data_type or q_data_type,
                    logits_soft_cap=logits_soft_cap or 0.0, **more)

    def _validate_dims(self, where, d):
        guards.gqa_divisible(where, d["num_qo_heads"], d["num_kv_heads"])
        guards.head_dim_supported(where, d["head_dim_qk"], d["head_dim_vo"])
        if d["logits_soft_cap"]:
            c = guards.logits_soft_cap_valid(where, d["logits_soft_cap"])
            # c is None only with logits_soft_cap_valid disabled (KERNELS_DISABLE_GUARDS); ci disables none.
            d["logits_soft_cap"] = float(d["logits_soft_cap"]) if c is None else c

    def _plan_batch(self, where, d, need, validate, stage, qo, max_kv_chunk, unsplit=False):
        """plan()'s common steps: every check before the first write, then stage and schedule.

        validate(): the wrapper's own index-tensor checks; stage(): stages its index tensors
        and returns the per-request kv_lens (computed only once the checks have passed).
        The run() memo is cleared first and last: the next run() is checked against this plan."""
        self._memo = None
        def checks():
            validate()
            self._validate_dims(where, d)
            guards.max_kv_chunk_positive(where, max_kv_chunk)
            self._validate_capacity(where, need)

        def early_write():
            self._state = "partial"
            self._p = d
            self._write_capacity(need)

        guards.plan_validates_first(checks, early_write)
        kv_lens = stage()
        self._stage("kv_lens", kv_lens, "batch_size")
        self._plan_sched = self._schedule(qo, kv_lens, d["num_qo_heads"], d["head_dim_vo"], max_kv_chunk, unsplit)
        self._state = "ok"
        self._memo = None

    def _stage_mask(self, mask):
        """The plan's own copy of a custom mask (bytes, 1: attend); graph mode: one fixed buffer."""
        host = mask.detach().reshape(-1).to("cpu", torch.uint8)
        buf = self._bufs.get("custom_mask") if self._use_cuda_graph else None
        # Reachable by a graph-mode re-plan with a custom_mask (the buffer exists); no ci case yet.
        if buf is None:
            cap = self._caps["custom_mask"] if self._use_cuda_graph else host.numel()
            buf = torch.zeros(max(cap, host.numel(), 1), dtype=torch.uint8, device=self._device)
            self._bufs["custom_mask"] = buf
        buf[:host.numel()].copy_(host)

    def _alloc(self, q, rows, out, lse, return_lse):
        """out (and lse when asked for) where the caller gave none."""
        P = self._p
        if out is None:
            out = torch.empty(rows, P["num_qo_heads"], P["head_dim_vo"], dtype=P["q_data_type"], device=q.device)
        if lse is None and return_lse:
            lse = torch.empty(rows, P["num_qo_heads"], dtype=torch.float32, device=q.device)
        return out, lse

    def _outputs(self, where, q, out, lse, return_lse, partial_state=None):
        P = self._p
        rows, hq, dvo = q.shape[0], P["num_qo_heads"], P["head_dim_vo"]
        out, lse = self._alloc(q, rows, out, lse, return_lse)
        ps_v, ps_s = partial_state if partial_state is not None else (None, None)
        check_device(where, {"out": out, "lse": lse, "partial_state_v": ps_v, "partial_state_s": ps_s})
        guards.out_contiguous(where, {"out": out, "lse": lse, "partial_state_v": ps_v, "partial_state_s": ps_s},
                              {"out": (rows, hq, dvo), "lse": (rows, hq),
                               "partial_state_v": tuple(out.shape), "partial_state_s": tuple(out.shape[:2])})
        if partial_state is not None:
            guards.partial_state_needs_lse(where, self._plan_sched["split"], lse)
        return out, lse

    def _run(self, where, entry, q, k, v, kd, vd, out, lse, return_lse, partial_state=None, page_size=0,
             kv_indices=None, sched=None, lse_written=True, q_stride=None, feat=None):
        """The launch (and partial_state merge); every check is done (or memoized) by then.
        feat: run()'s checked feature fields (run_features)."""
        P = self._p
        feat = dict(feat or ())
        if P["logits_soft_cap"]:
            feat["logits_soft_cap"] = P["logits_soft_cap"]
        mask = self._bufs.get("custom_mask") if P.get("custom_mask") else None
        if mask is not None:
            feat["custom_mask"], feat["mask_indptr"] = mask.data_ptr(), self._bufs["mask_indptr"].data_ptr()
        sched = sched or self._plan_sched
        if partial_state is not None:
            # Reachable by partial_state on an unsplit plan without lse/return_lse; no ci case yet.
            if lse is None and not sched["split"]:
                lse = torch.empty(out.shape[0], P["num_qo_heads"], dtype=torch.float32, device=q.device)
        p = params(q=q, k=k, v=v, kd=kd, vd=vd, o=out, lse=lse if lse_written else None,
                   num_qo_heads=P["num_qo_heads"], num_kv_heads=P["num_kv_heads"],
                   head_dim_qk=P["head_dim_qk"], head_dim_vo=P["head_dim_vo"], causal=P["causal"],
                   window_left=P["window_left"], sm_scale=P["sm_scale"], q_dtype=P["q_data_type"],
                   kv_dtype=P["kv_data_type"], o_dtype=P["q_data_type"], page_size=page_size, q_stride=q_stride,
                   **self._launch_fields(sched, self._bufs["qo_indptr"], self._bufs["kv_indptr"],
                                         kv_indices, self._bufs["kv_lens"]), **feat)
        launch(entry, p, q)
        if partial_state is not None:
            v_other, s_other = partial_state
            live = guards.merge_live_rows(sched["live_rows_ptr"])
            call("kernels_merge_state_in_place", out.data_ptr(), ptr(lse), v_other.data_ptr(), s_other.data_ptr(),
                 sched["total_num_rows"], live, P["num_qo_heads"], P["head_dim_vo"],
                 _code(P["q_data_type"]), stream_of(q))
        return (out, lse) if return_lse else out


def _code(dtype):
    from ._launch import code
    return code(dtype)


class BatchPrefillWithPagedKVCacheWrapper(_BatchRun):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 backend="fa2"):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         dict(qo_indptr=qo_indptr_buf, kv_indptr=paged_kv_indptr_buf,
                              indices=paged_kv_indices_buf, last_page_len=paged_kv_last_page_len_buf),
                         backend, ("fa2", "auto"))

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, causal=False, window_left=-1,
             sm_scale=None, q_data_type=torch.float16, kv_data_type=None, max_kv_chunk=None,
             logits_soft_cap=0.0, custom_mask=None):
        qo, kvp, last = host_ints(qo_indptr), host_ints(paged_kv_indptr), host_ints(paged_kv_last_page_len)
        d = self._dims(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal, window_left, sm_scale,
                       # Reachable by plan() with an empty qo_indptr; no ci case yet.
                       q_data_type, kv_data_type, logits_soft_cap, page_size=page_size, rows=qo[-1] if qo else 0,
                       custom_mask=custom_mask is not None)
        self._plan_paged("plan()", qo, kvp, paged_kv_indices, last, d, max_kv_chunk, custom_mask=custom_mask)

    def _plan_paged(self, where, qo, kvp, paged_kv_indices, last, d, max_kv_chunk, unsplit=False, custom_mask=None):
        n_idx = paged_kv_indices.numel()
        batch, page_size = len(qo) - 1, d["page_size"]
        # Reachable by plan() with a last_page_len of the wrong length (refused later); no ci case yet.
        kv_lens = paged_kv_lens(kvp, last, page_size) if len(last) == len(kvp) - 1 else []
        # Request r's mask starts at the sum of qo_len_i * kv_len_i over the requests before it.
        mask_indptr = [0]
        for r, n in enumerate(kv_lens):
            # Reachable by a paged plan() whose qo_indptr is shorter than paged_kv_indptr; no ci case yet.
            mask_indptr.append(mask_indptr[-1] + (qo[r + 1] - qo[r]) * n if r + 1 < len(qo) else mask_indptr[-1])
        need = dict(batch_size=batch, total_num_rows=d["rows"], indices=n_idx,
                    custom_mask=mask_indptr[-1] if custom_mask is not None else 0)

        def validate():
            pages = [b - a for a, b in zip(kvp, kvp[1:])]
            guards.batch_consistent(where, {"paged_kv_indptr": (batch + 1, len(kvp)),
                                            "paged_kv_last_page_len": (batch, len(last))},
                                    {"qo_indptr": qo, "paged_kv_indptr": kvp},
                                    # Reachable by plan() with an empty paged_kv_indptr; no ci case yet.
                                    indices_len=(kvp[-1] if kvp else 0, n_idx), last_page=(page_size, pages, last))
            if custom_mask is not None:
                guards.custom_mask_replaces_causal(where, d["causal"], custom_mask)
                guards.custom_mask_shape(where, custom_mask, mask_indptr[-1])

        def stage():
            self._stage("qo_indptr", qo, "batch_size", 1)
            self._stage("kv_indptr", kvp, "batch_size", 1)
            self._stage("indices", host_ints(paged_kv_indices), "indices")
            self._stage("last_page_len", last, "batch_size")
            if custom_mask is not None:
                self._stage("mask_indptr", mask_indptr, "batch_size", 1)
                self._stage_mask(custom_mask)
            return kv_lens

        self._plan_batch(where, d, need, validate, stage, qo, max_kv_chunk, unsplit)

    def _check_paged_run(self, where, q, paged_kv_cache, rows_field="rows"):
        P = self._p
        k, v = unpack_paged(paged_kv_cache, where)
        check_device(where, {"q": q, "k_cache": k, "v_cache": v}, fp8_ok=("k_cache", "v_cache"))
        t = guards.last_dim_contiguous(where, {"q": q, "k_cache": k, "v_cache": v})
        q, k, v = t["q"], t["k_cache"], t["v_cache"]
        kd, vd = paged_kv_dims(k, self._kv_layout), paged_kv_dims(v, self._kv_layout)
        guards.run_matches_plan(where, [
            ("rank", 3, q.dim(), "q"), ("rank", 4, k.dim(), "k_cache"), ("rank", 4, v.dim(), "v_cache"),
            ("num_qo_heads", P["num_qo_heads"], q.shape[1], "q"),
            ("head_dim_qk", P["head_dim_qk"], q.shape[-1], "q"),
            ("head_dim_qk", P["head_dim_qk"], kd["dim"], "k_cache"),
            ("head_dim_vo", P["head_dim_vo"], vd["dim"], "v_cache"),
            ("num_kv_heads", P["num_kv_heads"], kd["heads"], "k_cache"),
            ("num_kv_heads", P["num_kv_heads"], vd["heads"], "v_cache"),
            ("page_size", P["page_size"], kd["page_size"], "k_cache"),
            ("page_size", P["page_size"], vd["page_size"], "v_cache"),
            ("dtype", P["q_data_type"], q.dtype, "q"),
            ("dtype", P["kv_data_type"], k.dtype, "k_cache"),
            ("dtype", P["kv_data_type"], v.dtype, "v_cache"),
            (rows_field, P["rows"], q.shape[0], "q", "at_least"),
        ])
        return q, k, v, kd, vd

    def _prepare_paged(self, where, q, paged_kv_cache, out, lse, return_lse, partial_state=None,
                       rows_field="rows"):
        """run()'s checks, and what its launch reads: (q, k, v, kd, vd, q.stride(), out, lse).

        The checks run in full on the first call after plan(), and again whenever the key changes:
        the guard switch, and every tensor's shape, stride (contiguity for out, lse and
        partial_state), dtype and device, which is all that any of them reads (besides the
        plan, which plan() settles by clearing the memo). A call that matches the last one that
        passed skips them. Every guard off: no checks and no key."""
        sw = guards.switch()
        key = None
        cache = paged_kv_cache
        kind = type(cache)
        # Reachable by a list [k, v] cache, a tuple not of two plain tensors, or a 3-tuple; no ci case yet.
        if kind is tuple or kind is list:  # (k, v); anything else but two plain tensors: the full checks
            whole = None
            plain = len(cache) == 2 and _T is type(cache[0]) is type(cache[1])
            if plain:
                k, v = cache
        else:  # one [P, 2, ...] tensor
            whole = cache
            plain = kind is _T
        # The false arm needs a non-plain cache or q (a tensor subclass): reachable, no ci case yet.
        if plain and type(q) is _T:
            qs, qst = q.shape, q.stride()
            if whole is None:
                ks, kst, vs, vst = k.shape, k.stride(), v.shape, v.stride()
            # sw is None only with every guard off (KERNELS_DISABLE_GUARDS=all); ci disables none.
            if sw is None:  # every guard off: nothing to check
                hit = True
            else:
                osig = out_sig(out)
                lsig = None if lse is None else out_sig(lse)
                psig = None if partial_state is None else state_sig(partial_state)
                # Reachable by an out/lse that is a tensor subclass, or a partial_state not of two plain tensors; no ci case yet.
                if osig is False or lsig is False or psig is False:
                    hit = False  # not plain tensors: checked at every call
                else:
                    key = ((sw, qs, qst, q.dtype, q.device, ks, kst, k.dtype, k.device, vs, vst, v.dtype,
                            v.device, osig, lsig, not return_lse, psig) if whole is None else
                           (sw, qs, qst, q.dtype, q.device, whole.shape, whole.stride(), whole.dtype,
                            whole.device, osig, lsig, not return_lse, psig))
                    hit = key == self._memo
            # The memo hit: reachable by a second run() with the same key on one plan; no ci case yet.
            if hit:
                if whole is not None:
                    k, v = whole[:, 0], whole[:, 1]
                    ks, kst, vs, vst = k.shape, k.stride(), v.shape, v.stride()
                layout = self._kv_layout
                out, lse = self._alloc(q, qs[0], out, lse, return_lse)
                return q, k, v, paged_dims(ks, kst, layout), paged_dims(vs, vst, layout), qst, out, lse
        guards.half_planned_refuses(where, self._state)
        q, k, v, kd, vd = self._check_paged_run(where, q, paged_kv_cache, rows_field)
        out, lse = self._outputs(where, q, out, lse, return_lse, partial_state)
        # Reachable by the non-plain inputs above (or every guard off); no ci case yet.
        if key is not None:
            self._memo = key
        return q, k, v, kd, vd, None, out, lse

    def run(self, q, paged_kv_cache, out=None, lse=None, return_lse=False, partial_state=None, sinks=None,
            alibi_slopes=None, k_scale=None, v_scale=None):
        where = "run()"
        q, k, v, kd, vd, qst, out, lse = self._prepare_paged(where, q, paged_kv_cache, out, lse, return_lse,
                                                             partial_state)
        feat = run_features(where, self._p["num_qo_heads"], sinks, alibi_slopes, k_scale, v_scale)
        return self._run(where, "kernels_prefill", q, k, v, kd, vd, out, lse, return_lse, partial_state,
                         page_size=self._p["page_size"], kv_indices=self._bufs["indices"], q_stride=qst, feat=feat)


class BatchPrefillWithRaggedKVCacheWrapper(_BatchRun):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, backend="fa2"):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         dict(qo_indptr=qo_indptr_buf, kv_indptr=kv_indptr_buf), backend, ("fa2", "auto"))

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             causal=False, window_left=-1, sm_scale=None, q_data_type=torch.float16, kv_data_type=None,
             max_kv_chunk=None, logits_soft_cap=0.0):
        where = "plan()"
        qo, kvi = host_ints(qo_indptr), host_ints(kv_indptr)
        batch = len(qo) - 1
        d = self._dims(num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal, window_left, sm_scale,
                       # Reachable by a ragged plan() with an empty qo_indptr/kv_indptr; no ci case yet.
                       q_data_type, kv_data_type, logits_soft_cap, rows=qo[-1] if qo else 0,
                       kv_rows=kvi[-1] if kvi else 0)
        need = dict(batch_size=batch, total_num_rows=d["rows"])

        def validate():
            guards.batch_consistent(where, {"kv_indptr": (batch + 1, len(kvi))}, {"qo_indptr": qo, "kv_indptr": kvi})

        def stage():
            self._stage("qo_indptr", qo, "batch_size", 1)
            self._stage("kv_indptr", kvi, "batch_size", 1)
            return [b - a for a, b in zip(kvi, kvi[1:])]

        self._plan_batch(where, d, need, validate, stage, qo, max_kv_chunk)

    def run(self, q, k, v, out=None, lse=None, return_lse=False, sinks=None, alibi_slopes=None):
        where = "run()"
        def features():  # once the plan is known to be whole
            if sinks is None and alibi_slopes is None:
                return None
            return run_features(where, self._p["num_qo_heads"], sinks, alibi_slopes)
        sw = guards.switch()
        key = None
        # The false arm: reachable by a tensor-subclass (or non-tensor) q/k/v; no ci case yet.
        if _T is type(q) is type(k) is type(v):
            qs, qst, ks, kst, vs, vst = q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride()
            # sw is None only with every guard off (KERNELS_DISABLE_GUARDS=all); ci disables none.
            if sw is None:  # every guard off: nothing to check
                hit = True
            else:  # the memo: see _prepare_paged
                osig = out_sig(out)
                lsig = None if lse is None else out_sig(lse)
                # Reachable by an out/lse that is a tensor subclass; no ci case yet.
                if osig is False or lsig is False:
                    hit = False
                else:
                    key = (sw, qs, qst, q.dtype, q.device, ks, kst, k.dtype, k.device, vs, vst, v.dtype, v.device,
                           osig, lsig, not return_lse)
                    hit = key == self._memo
            # The memo hit: reachable by a second ragged run() with the same key on one plan; no ci case yet.
            if hit:
                layout = self._kv_layout
                kd, vd = dense_dims(ks, kst, layout), dense_dims(vs, vst, layout)
                out, lse = self._alloc(q, qs[0], out, lse, return_lse)
                return self._run(where, "kernels_prefill", q, k, v, kd, vd, out, lse, return_lse, q_stride=qst,
                                 feat=features())
        q, k, v, kd, vd = self._check_ragged_run(where, q, k, v)
        out, lse = self._outputs(where, q, out, lse, return_lse)
        # Reachable by a tensor-subclass out/lse (or every guard off); no ci case yet.
        if key is not None:
            self._memo = key
        return self._run(where, "kernels_prefill", q, k, v, kd, vd, out, lse, return_lse, feat=features())

    def _check_ragged_run(self, where, q, k, v):
        guards.half_planned_refuses(where, self._state)
        P = self._p
        check_device(where, {"q": q, "k": k, "v": v})
        t = guards.last_dim_contiguous(where, {"q": q, "k": k, "v": v})
        q, k, v = t["q"], t["k"], t["v"]
        kd, vd = dense_kv_dims(k, self._kv_layout), dense_kv_dims(v, self._kv_layout)
        guards.run_matches_plan(where, [
            ("rank", 3, q.dim(), "q"), ("rank", 3, k.dim(), "k"), ("rank", 3, v.dim(), "v"),
            ("num_qo_heads", P["num_qo_heads"], q.shape[1], "q"),
            ("head_dim_qk", P["head_dim_qk"], q.shape[-1], "q"),
            ("head_dim_qk", P["head_dim_qk"], kd["dim"], "k"),
            ("head_dim_vo", P["head_dim_vo"], vd["dim"], "v"),
            ("num_kv_heads", P["num_kv_heads"], kd["heads"], "k"),
            ("num_kv_heads", P["num_kv_heads"], vd["heads"], "v"),
            ("dtype", P["q_data_type"], q.dtype, "q"),
            ("dtype", P["kv_data_type"], k.dtype, "k"),
            ("dtype", P["kv_data_type"], v.dtype, "v"),
            ("rows", P["rows"], q.shape[0], "q", "at_least"),
            ("kv_rows", P["kv_rows"], kd["len"], "k", "at_least"),
            ("kv_rows", P["kv_rows"], vd["len"], "v", "at_least"),
        ])
        return q, k, v, kd, vd
