"""What plan() does for every batch wrapper: stage index tensors into the wrapper's own int32
buffers, run the C scheduler (kernels_plan) and keep the schedule on the device.

CUDA-graph mode: the first plan() fixes the capacity (batch size, total q rows, indices
length, work items) and every buffer a launch reads, so a captured run replays a later plan;
the graph path always splits KV. On the host it is the same fixed-buffer semantics.
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import torch

from . import _lib, guards
from ._launch import LAYOUTS

DEFAULT_MAX_KV_CHUNK = 512
# kernels_plan's info[] slots (csrc/plan.cpp).
INFO_WS_BYTES, INFO_CHUNK = 3, 4
# Work items a graph grid holds per request, beyond what the first plan needs: later plans
# with longer KV use larger chunks to fit (kernels_plan doubles the chunk).
GRAPH_WORK_PER_REQUEST = 4


def host_ints(t) -> list[int]:
    # Reachable by plan() with list indptrs (ci passes tensors); no ci case yet.
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.int64).tolist()
    return [int(x) for x in t]


def fit_chunk(sizes, chunk: int, longest: int, ws_bytes: int, info) -> int:
    """The first of chunk, 2 * chunk, ... whose schedule's partial rows fit ws_bytes, stopping at
    one chunk per request (longest). sizes(chunk, limit) fills info without a schedule."""
    while True:
        sizes(chunk, 0)
        # Reachable by a float workspace too small even for one chunk per request (max_kv_chunk=None); no ci case yet.
        if info[INFO_WS_BYTES] <= ws_bytes or chunk >= longest:
            return chunk
        chunk = min(chunk * 2, longest)


class Planned:
    """State shared by the batch wrappers. _state: 'none' | 'partial' | 'ok'."""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, graph_bufs: dict, backend: str,
                 backends: tuple):
        guards.layout_known("__init__()", "kv_layout", kv_layout, LAYOUTS)
        guards.layout_known("__init__()", "backend", backend, backends)
        self._ws = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._graph_bufs = {k: v for k, v in graph_bufs.items() if v is not None}
        self._backend = backend
        self._state = "none"
        self._p: dict = {}
        self._caps: dict | None = None
        self._bufs: dict = {}
        self._sched = None
        self._plan_sched: dict | None = None
        # The key of the last run() whose checks passed (see prefill._BatchRun._prepare_paged);
        # every plan() clears it, so a re-planned wrapper checks its next run() in full.
        self._memo = None

    @property
    def plan_info(self) -> SimpleNamespace:
        """The last schedule: total_num_rows (the capacity in graph mode), live_rows, split, num_work, chunk."""
        # Reachable by reading wrapper.plan_info; no ci case does.
        s = getattr(self, "_plan_sched", None) or {}
        return SimpleNamespace(**{k: s.get(k) for k in ("total_num_rows", "live_rows", "split", "num_work", "chunk")})

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    # -- plan pieces ---------------------------------------------------------------------------

    def _capacity(self, need: dict) -> dict:
        """Graph mode: the capacity this plan must fit (the first plan's, or the caller's buffers)."""
        if self._caps is not None:
            return {k: self._caps[k] for k in need}
        caps = dict(need)
        if "indices" in self._graph_bufs:
            caps["indices"] = self._graph_bufs["indices"].numel()
        return caps

    def _validate_capacity(self, where: str, need: dict) -> None:
        if self._use_cuda_graph:
            guards.graph_capacity(where, self._capacity(need), need)

    def _write_capacity(self, need: dict) -> None:
        if self._use_cuda_graph and self._caps is None:
            self._caps = self._capacity(need)

    def _stage(self, name: str, values: list[int], cap_key: str | None = None, extra: int = 0) -> torch.Tensor:
        """values into an int32 device buffer the wrapper owns (graph: a fixed one, filled in place)."""
        host = torch.tensor(values, dtype=torch.int32)
        n = host.numel()
        if self._use_cuda_graph:
            buf = self._bufs.get(name)
            if buf is None:
                caller = self._graph_bufs.get(name)
                # Unreachable from callers: every _stage call passes a cap_key.
                cap = self._caps[cap_key] + extra if cap_key else n
                # Reachable by a graph-mode caller buffer that is not int32, not contiguous or too small (the device arm
                # needs a GPU); no ci case yet. The copy back into such a buffer below follows.
                if (caller is not None and caller.dtype == torch.int32 and caller.is_contiguous()
                        and caller.device == self._device and caller.numel() >= cap):
                    buf = caller  # launches read the caller's buffer, as FlashInfer's graph path does
                else:
                    buf = torch.zeros(max(cap, n, 1), dtype=torch.int32, device=self._device)
                self._bufs[name] = buf
            buf[:n].copy_(host)
            caller = self._graph_bufs.get(name)
            if caller is not None and caller is not buf:
                caller.view(-1)[:n].copy_(host)
            return buf
        buf = torch.empty(max(n, 1), dtype=torch.int32, device=self._device)
        buf[:n].copy_(host)
        self._bufs[name] = buf
        return buf

    def _schedule(self, qo: list[int], kv_lens: list[int], num_qo_heads: int, head_dim_vo: int,
                  max_kv_chunk, unsplit: bool = False) -> dict:
        """Run kernels_plan; fails (ValueError) when the float workspace cannot hold the schedule.

        max_kv_chunk None: the library picks the chunk, the default or the finest coarser one whose
        partial rows fit the float workspace (FlashInfer sizes its split to its buffers too), so
        a long context needs no bigger workspace; only a schedule that cannot fit even unsplit
        (a graph plan always splits) is refused. A caller's max_kv_chunk is kept as given."""
        lib = _lib.lib()
        batch = len(kv_lens)
        # Reachable by plan() with an empty qo_indptr, or of zero requests (empty kv_lens); no ci case yet.
        qo_t = torch.tensor(qo or [0], dtype=torch.int32)
        kv_t = torch.tensor(kv_lens or [0], dtype=torch.int32)
        chunk = int(max_kv_chunk or DEFAULT_MAX_KV_CHUNK)
        if unsplit:
            chunk = max([chunk, *kv_lens, 1])
        ws_bytes = self._ws.numel() * self._ws.element_size()
        info = (ctypes.c_int64 * 6)()
        force = int(self._use_cuda_graph and not unsplit)

        def sizes(chunk: int, limit: int) -> None:
            _lib.call("kernels_plan", qo_t.data_ptr(), kv_t.data_ptr(), batch, num_qo_heads, head_dim_vo,
                      chunk, limit, force, ws_bytes, None, 0, 0, info)

        if max_kv_chunk is None:
            chunk = fit_chunk(sizes, chunk, max([1, *kv_lens]), ws_bytes, info)
        args = (qo_t.data_ptr(), kv_t.data_ptr(), batch, num_qo_heads, head_dim_vo, chunk)
        if self._use_cuda_graph and "work" not in self._caps:
            sizes(chunk, 0)
            self._caps["work"] = max(int(info[0]), GRAPH_WORK_PER_REQUEST * batch)
        limit = self._caps["work"] if self._use_cuda_graph else 0
        _lib.call("kernels_plan", *args, limit, force, ws_bytes, None, 0, 0, info)
        work_cap = self._caps["work"] if self._use_cuda_graph else int(info[0])
        rows_cap = self._caps["total_num_rows"] if self._use_cuda_graph else int(info[5])
        host = torch.zeros(lib.kernels_schedule_len(work_cap, rows_cap), dtype=torch.int32)
        _lib.call("kernels_plan", *args, limit, force, ws_bytes, host.data_ptr(), work_cap, rows_cap, info)
        # Unreachable: in graph mode work_cap and rows_cap are the fixed caps, so the schedule length never changes.
        if self._use_cuda_graph and self._sched is not None and self._sched.numel() == host.numel():
            self._sched.copy_(host)
        else:
            self._sched = host.to(self._device, copy=True)
        s = self._sched
        base, W, R = s.data_ptr(), work_cap, rows_cap
        slot_cap = ws_bytes // (4 * max(num_qo_heads * (head_dim_vo + 1), 1))
        return dict(
            num_work=W if self._use_cuda_graph else int(info[0]), split=bool(info[1]), chunk=int(info[4]),
            live_rows=int(info[5]), total_num_rows=R, max_qo_len=max([0, *qo]),
            ptrs=dict(work_req=base, work_kv_lo=base + 4 * W, work_kv_hi=base + 8 * W,
                      work_slot=base + 12 * W, work_nchunks=base + 16 * W, merge_indptr=base + 20 * W,
                      live=(base + 4 * (5 * W + R + 1)) if self._use_cuda_graph else None),
            live_rows_ptr=base + 4 * (5 * W + R + 2),
            partial_o=self._ws.data_ptr(),
            partial_lse=self._ws.data_ptr() + 4 * slot_cap * num_qo_heads * head_dim_vo,
        )

    def _launch_fields(self, sched: dict, qo_indptr, kv_indptr, kv_indices, kv_lens) -> dict:
        f = dict(qo_indptr=qo_indptr.data_ptr(), kv_indptr=kv_indptr.data_ptr(),
                 kv_indices=kv_indices.data_ptr() if kv_indices is not None else None,
                 kv_lens=kv_lens.data_ptr(), num_work=sched["num_work"], num_rows=sched["total_num_rows"],
                 split=int(sched["split"]), partial_o=sched["partial_o"], partial_lse=sched["partial_lse"],
                 max_qo_len=sched["max_qo_len"])
        f.update(sched["ptrs"])
        return f
