"""The adapter contract every target implements."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from harness.case import Case
    from harness.problem import Problem
    from harness.builders import Buffers


class Skip(Exception):
    """Raised by an adapter when a case's params cannot be expressed on this route.

    The row's outcome becomes `skipped` with this message as the reason.
    """


class Target:
    name: str = "?"
    routes: tuple[str, ...] = ()
    # A target whose own contract the cases are (the bundled library): a valid
    # input it refuses, or a refusal that does not name the field, fails the
    # run. For any other library those are findings that fail only with --strict.
    owns_contract: bool = False

    def version(self) -> str:
        """Version string recorded on every row."""
        raise NotImplementedError

    def build_id(self) -> str:
        """Build hash (or '') recorded on every row."""
        return ""

    def commit(self) -> str:
        """Library commit (or '') recorded on every row."""
        return ""

    def platform(self) -> str:
        """'host', 'nvidia', 'amd', or 'cpu' for pure-CPU external libraries."""
        raise NotImplementedError

    def run(self, case: "Case", problem: "Problem", buffers: "Buffers") -> Mapping[str, "torch.Tensor"]:
        """Perform the case's calls and return logical outputs.

        Returns {"o": [total_q_rows, num_qo_heads, head_dim_vo]} plus
        {"lse": [total_q_rows, num_qo_heads]} (natural log) when the case asks
        for it; rows concatenated in request order, whatever the library's
        layout. Raise Skip when the route cannot express the params; let the
        library's own exceptions (refusals) propagate untouched. Every output
        buffer handed to the library comes from `buffers` (canary-guarded,
        NaN-poisoned) and every input is registered with it for fingerprinting.
        Call buffers.stage("plan"/"run") as the calls progress.
        """
        raise NotImplementedError
