"""The restaged class on a vLLM-shaped call: the caller's metadata tensors, rewritten in
place between the metadata call and the run (cases/restaged_indptr.py, params["restage"]).

A vLLM-shaped caller hands its metadata call (vLLM's get_scheduler_metadata) its own
seq_lens, query_start_loc and block table, then hands the run the same tensors. A caller
that stages its next batch into them before the run has changed what the run is handed;
a library whose metadata call kept a reference to them, or planned from what they held,
must plan again or refuse. The answer compared is the problem's: the batch the tensors
describe at the run. Before the rewrite they hold the same requests regrouped, in each
tensor the case names:

  seq_lens         the lengths in reverse request order (a plan for [300, 50, 100]
                   run with [100, 50, 300])
  query_start_loc  the offsets of the query lengths in reverse request order (same total)
  block_table      the rows in reverse request order (each request handed another's blocks)
"""
from __future__ import annotations

import torch

from harness.targets.base import Skip
from harness.targets.block_table.batch import BlockBatch

# The tensors a case may restage, and the metadata field each one is (capabilities).
RESTAGEABLE = {"seq_lens": "kv_lens", "query_start_loc": "query_start_loc",
               "block_table": "block_table"}


def _offsets(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


def first_batch(batch: BlockBatch) -> dict:
    """What each restageable tensor held before the rewrite: the run's batch regrouped."""
    rows = [b - a for a, b in zip(batch.query_start_loc, batch.query_start_loc[1:])]
    return {"seq_lens": list(reversed(batch.seq_lens)),
            "query_start_loc": _offsets(reversed(rows)),
            "block_table": [list(r) for r in reversed(batch.block_table)]}


class Metadata:
    """The caller's metadata tensors, as the metadata call and then the run are handed them.

    Without params["restage"] each is made once through the case's views (strided or of
    another index dtype where the case says) and watched: neither call may change it. With
    it, the named tensors hold the first batch until rewrite(), which puts the run's batch
    in them in place and only then watches them (the caller's own rewrite is no library's
    corruption)."""

    def __init__(self, calls, batch: BlockBatch):
        self.calls, self.batch = calls, batch
        names = calls.params.get("restage") or []
        if not isinstance(names, list) or not names:
            raise ValueError(f"params['restage'] = {names!r}: a non-empty list of "
                             f"{sorted(RESTAGEABLE)}")
        unknown = sorted(set(names) - set(RESTAGEABLE))
        if unknown:
            raise Skip(f"restage names no tensor of a block-table call {unknown} (it has "
                       f"{sorted(RESTAGEABLE)})")
        self.names = tuple(names)

    @staticmethod
    def restages(params) -> bool:
        return bool(params.get("restage"))

    def tensors(self) -> dict:
        """{name: tensor} for the metadata call: the first batch in the restaged ones."""
        c, batch, dev = self.calls, self.batch, self.calls.device
        if c.params.get("strided") or c.params.get("index_dtype"):
            raise Skip("a restaged case hands the caller's own int32 tensors; a strided or "
                       "re-typed one is the strided family's")
        first = first_batch(batch)
        now = {"seq_lens": batch.seq_lens, "query_start_loc": batch.query_start_loc,
               "block_table": batch.block_table}
        self.final = {n: torch.tensor(v, dtype=torch.int32, device=dev) for n, v in now.items()}
        self.held = {n: torch.tensor(first[n] if n in self.names else v, dtype=torch.int32,
                                     device=dev) for n, v in now.items()}
        return self.held

    def rewrite(self) -> None:
        """The caller stages the run's batch into its tensors, in place; from here on it
        leaves them alone, and the library must too."""
        self.calls.buffers.stage("restage")
        for name in self.names:
            self.held[name].copy_(self.final[name])
        for name, t in self.held.items():
            self.calls.buffers.watch(t, name)
