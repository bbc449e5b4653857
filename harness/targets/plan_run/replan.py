"""The graph_replan and restaged scripts' calls, shared by every target that has them.

harness/targets/plan_run/replan_scenarios.py defines both scenarios and
builds the wrapper through the target's Call, then hands it here. These
functions touch only the Call's problem, params, buffers, views and result().

graph_replan: a capacity plan (index buffers sized by params["capacity"],
pages cycling through the pool, never run against), a re-plan for the
problem, one run. restaged: the caller's own index tensors, rewritten
between the calls that params["sequence"] names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.model.builders import CANARY_ELEMS
from harness.targets.base import Skip


def int32(values, device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int32, device=device)


def _running_sum(counts) -> list:
    out = [0]
    for n in counts:
        out.append(out[-1] + n)
    return out


# ------------------------------------------------------------------ graph_replan

@dataclass
class Capacity:
    """The capacity plan's index lists: what the graph buffers are sized for."""
    qo_indptr: list
    kv_indptr: list
    kv_indices: list
    last_page_len: list
    page_size: int

    @property
    def batch(self) -> int:
        return len(self.qo_indptr) - 1

    @property
    def rows(self) -> int:
        return self.qo_indptr[-1]

    def graph_buffers(self, device) -> dict:
        """A paged prefill wrapper's caller-owned index buffers, sized for this plan."""
        sizes = dict(qo_indptr_buf=self.batch + 1, paged_kv_indptr_buf=self.batch + 1,
                     paged_kv_indices_buf=len(self.kv_indices),
                     paged_kv_last_page_len_buf=self.batch)
        return {name: torch.zeros(n, dtype=torch.int32, device=device) for name, n in sizes.items()}


def capacity(c, pool: int) -> Capacity:
    """params["capacity"] as index lists over a pool of `pool` pages."""
    cap = c.params["capacity"]
    page_size = int(c.params.get("page_size", 16))
    pages = [max(1, -(-n // page_size)) for n in cap["kv_lens"]]
    kv_indptr = _running_sum(pages)
    return Capacity(qo_indptr=_running_sum(cap["qo_lens"]), kv_indptr=kv_indptr,
                    kv_indices=[i % pool for i in range(kv_indptr[-1])],
                    last_page_len=[n - (m - 1) * page_size for n, m in zip(cap["kv_lens"], pages)],
                    page_size=page_size)


def banded(c, shape, dtype, name, capacity_rows):
    """A poisoned output whose canary band after it is at least capacity_rows long."""
    per_row = 1
    for n in shape[1:]:
        per_row *= int(n)
    return c.buffers.output(shape, dtype, name, canary_elems=max(CANARY_ELEMS, capacity_rows * per_row))


def graph_io(c, paged, cap: Capacity):
    """q, the paged cache, and out/lse in canary bands as long as the capacity's rows."""
    p = c.problem
    rows, hq, dv = sum(p.qo_lens), p.num_qo_heads, p.head_dim_vo
    q = c.views.input("q", p.q_packed())
    cache = (c.views.input("k_cache", paged.k_pages), c.views.input("v_cache", paged.v_pages))
    out = banded(c, (rows, hq, dv), p.dtype, "out", cap.rows)
    lse = banded(c, (rows, hq), torch.float32, "lse", cap.rows) if p.return_lse else None
    return q, cache, out, lse


class CudaGraphs:
    """torch.cuda's graph API as the graph_replan script uses it: a warm-up run on a side
    stream, a capture, a replay. Call.graphs gives one where the device has graphs (CUDA, and
    HIP through torch's same API); a test can hand a stand-in."""

    def __init__(self, device: torch.device):
        self.device = device

    def warm_up(self, fn) -> None:
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)

    def capture(self, fn):
        """fn's launches captured in a CUDA graph; returns what replays them (and waits)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()

        def replay() -> None:
            graph.replay()
            torch.cuda.synchronize(self.device)
        return replay


def replan_and_run(c, wrapper, cap: Capacity, paged, dims: dict, q, cache, out, lse,
                   partial_state=None) -> dict:
    """Plan the capacity batch, re-plan for the problem, run: the answer is the problem's.

    Where the device has graphs (Call.graphs), run() is captured at the capacity plan on capacity-sized
    q/out/lse/partial_state (as a graph caller holds them), the problem re-planned, and the
    graph replayed: out's rows past the problem's are its canary band, so a replay that
    writes past the smaller batch is `corrupt`. Without, the plans and the run are plain calls.
    """
    p, dev = c.problem, c.device
    heads = (p.num_qo_heads, p.num_kv_heads, p.head_dim, cap.page_size)
    c.buffers.notes.append(
        f"graph: run() captured at the capacity plan ({cap.rows} rows, batch {cap.batch}) and "
        f"replayed after the re-plan ({sum(p.qo_lens)} rows, batch {p.batch_size})"
        if c.graphs is not None else
        "graph: no capture on this platform; the plans and run() are plain calls")
    c.ready("plan")
    wrapper.plan(int32(cap.qo_indptr, "cpu"), int32(cap.kv_indptr, "cpu"),
                 int32(cap.kv_indices, dev), int32(cap.last_page_len, "cpu"), *heads, **dims)

    def replan():
        c.buffers.stage("replan")
        wrapper.plan(p.qo_indptr.clone(), int32(paged.indptr, "cpu"), int32(paged.indices, dev),
                     int32(paged.last_page_len, "cpu"), *heads, **dims)

    rows = sum(p.qo_lens)
    if c.graphs is not None:
        _capture_replan_replay(c, wrapper, cap, replan, q, cache, out, lse, partial_state)
        return c.result(out, lse, rows)
    replan()
    c.buffers.stage("run")
    kw = {"partial_state": partial_state[1]} if partial_state is not None else {}
    wrapper.run(q, cache, out=out, lse=lse, return_lse=p.return_lse, **kw)
    return c.result(out, lse, rows)


def capacity_view(t: torch.Tensor | None, rows: int):
    """The first `rows` rows over t's storage: t's own rows, then what follows them (its canary
    band, or the rest of a capacity-sized buffer)."""
    if t is None:
        return None
    return torch.as_strided(t, (rows, *t.shape[1:]), t.stride(), t.storage_offset())


def _capture_replan_replay(c, wrapper, cap: Capacity, replan, q, cache, out, lse,
                           partial_state) -> None:
    """Warm up and capture run() at the capacity plan, re-plan, load the live q, replay."""
    p = c.problem
    rows = sum(p.qo_lens)
    cap_rows = max(cap.rows, rows)
    q_cap = torch.zeros((cap_rows, *q.shape[1:]), dtype=q.dtype, device=q.device)
    out_cap, lse_cap = capacity_view(out, cap_rows), capacity_view(lse, cap_rows)
    state = {"partial_state": partial_state[0]} if partial_state is not None else {}

    # The warm-up writes scratch outputs (the banded ones stay poisoned): a library's lazy
    # first-call set-up must not happen inside the capture.
    c.buffers.stage("warm-up")
    scratch_out = torch.empty_like(out_cap)
    scratch_lse = torch.empty_like(lse_cap) if lse_cap is not None else None
    c.graphs.warm_up(lambda: wrapper.run(q_cap, cache, out=scratch_out, lse=scratch_lse,
                                         return_lse=p.return_lse, **state))
    c.buffers.stage("capture")
    replay = c.graphs.capture(lambda: wrapper.run(q_cap, cache, out=out_cap, lse=lse_cap,
                                                  return_lse=p.return_lse, **state))
    replan()
    c.buffers.stage("replay")
    q_cap[:rows].copy_(q)
    replay()


# ------------------------------------------------------------------ restaged

# The steps of each params["sequence"], after c.ready("plan"). A sequence that
# restages to the problem starts from the next batch.
SEQUENCES = {
    "plan_restage_run": ("plan", "restage_next"),
    "replan_restage_run": ("plan", "restage_problem", "replan", "restage_next"),
    "run_replan_run": ("plan", "run", "restage_problem", "replan"),
}


def next_batch(paged) -> dict:
    """The same pages regrouped: page counts, indices and last_page_len reversed."""
    counts = [b - a for a, b in zip(paged.indptr, paged.indptr[1:])]
    return {"indptr": _running_sum(reversed(counts)), "indices": list(reversed(paged.indices)),
            "last_page_len": list(reversed(paged.last_page_len))}


def restaged(c, paged, make_wrapper, **plan_kw) -> dict:
    """Plan from the caller's own index tensors, rewrite them per params["sequence"], run.

    make_wrapper() builds the batch-decode wrapper; plan_kw are the target's extra plan()
    keywords. The answer compared is always the problem's: what plan() saw last.
    """
    p = c.problem
    this = {"indptr": paged.indptr, "indices": paged.indices, "last_page_len": paged.last_page_len}
    nxt = next_batch(paged)
    restage = tuple(c.params["restage"])
    unknown = set(restage) - set(this)
    if unknown:
        raise Skip(f"restage names no index tensor {sorted(unknown)}")
    sequence = c.params.get("sequence", "plan_restage_run")
    if sequence not in SEQUENCES:
        raise Skip(f"sequence {sequence!r} is not one this script knows")
    steps = SEQUENCES[sequence]
    dev = c.device
    # The caller's own tensors: indptr and last_page_len on the CPU, indices where the cache
    # is; params["index_device"] = "device" puts all three on the device.
    placement = c.params.get("index_device", "cpu")
    if placement not in ("cpu", "device"):
        raise ValueError(f"params['index_device'] = {placement!r}: must be cpu or device")
    if placement == "device" and dev.type == "cpu":
        raise Skip("index_device=device: the device here is the CPU (the cpu case covers it)")
    where = {"indptr": "cpu", "indices": dev, "last_page_len": "cpu"}
    if placement == "device":
        where = {name: dev for name in where}
    first = nxt if "restage_problem" in steps else this
    caller = {name: int32(first[name], where[name]) for name in this}

    wrapper = make_wrapper()
    q = c.views.input("q", p.q_packed())
    cache = (c.views.input("k_cache", paged.k_pages), c.views.input("v_cache", paged.v_pages))
    rows = p.batch_size
    out, lse = c.out(rows), c.lse(rows)

    def plan():
        wrapper.plan(caller["indptr"], caller["indices"], caller["last_page_len"], p.num_qo_heads,
                     p.num_kv_heads, p.head_dim, paged.page_size, window_left=p.window_left,
                     q_data_type=p.dtype, kv_data_type=p.dtype, sm_scale=c.sm_scale, **plan_kw)

    def stage_into(batch, names):
        c.buffers.stage("restage")
        for name in names:
            caller[name].copy_(int32(batch[name], where[name]))

    def replan():
        c.buffers.stage("replan")
        plan()

    def first_run():
        c.buffers.stage("run")
        scratch_o = c.buffers.output((rows, p.num_qo_heads, p.head_dim_vo), p.dtype, "first_out")
        scratch_s = c.buffers.output((rows, p.num_qo_heads), torch.float32, "first_lse")
        wrapper.run(q, cache, out=scratch_o, lse=scratch_s, return_lse=True)

    actions = {"plan": plan, "replan": replan, "run": first_run,
               "restage_next": lambda: stage_into(nxt, restage),
               "restage_problem": lambda: stage_into(this, this)}
    c.ready("plan")
    for step in steps:
        actions[step]()
    # From here on the caller leaves its tensors alone: the library must too.
    for name, t in caller.items():
        c.buffers.watch(t, name)
    c.buffers.stage("run")
    returned = wrapper.run(q, cache, out=out, lse=lse, return_lse=p.return_lse)
    return c.result(*c.outputs(returned, out, lse), rows)
