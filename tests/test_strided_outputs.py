"""Strided outputs watched: the gaps (skipped slots) of a strided `out`/`lse` hold poison, and
a library that writes into them (one that writes a strided output as if it were packed) is
`corrupt`, not `wrong`, whatever the values it leaves in the view."""
from __future__ import annotations

import pytest
import torch

from fault_target import FaultsTarget, fault_case
from harness.engine.execute import execute_case
from harness.model.builders import Buffers
from harness.model.reference import attention_reference
from harness.targets.layout import Views


class OutputsLibrary(FaultsTarget):
    """A small library that writes its outputs into the buffers it is handed: through their
    strides (`honours`), or as if every buffer were packed (`packed`, the defect)."""

    def __init__(self, packed: bool):
        self.packed = packed

    def run(self, case, problem, buffers):
        assert case.params["fault"] == "none"
        views = Views(case.params, buffers)
        buffers.stage("run")
        right = attention_reference(problem)
        got = {"o": right["o"].to(problem.dtype)}
        if problem.return_lse:
            got["lse"] = right["lse"].to(torch.float32)
        out = {}
        for name, value in got.items():
            buf = views.output(name, value.shape, value.dtype)
            if self.packed:
                # Its kernel takes the data pointer and the shape, never the strides.
                torch.as_strided(buf, value.shape, value.contiguous().stride()).copy_(value)
            else:
                buf.copy_(value)
            out[name] = buf
        views.check_used()
        return out


def strided(name: str):
    return fault_case("none", strided=name, return_lse=True, qo_lens=[3], kv_lens=[5],
                      num_qo_heads=2, head_dim=8)


@pytest.mark.parametrize("name", ["o", "lse"])
def test_a_library_that_writes_a_strided_output_as_packed_is_corrupt(name):
    r = execute_case(strided(name), OutputsLibrary(packed=True), "cpu")
    assert (r.outcome, r.passed) == ("corrupt", False), (r.outcome, r.message)
    assert f"gaps of strided {name}:" in r.message and "stride 2" in r.message, r.message


@pytest.mark.parametrize("name", ["o", "lse"])
def test_a_library_that_honours_the_stride_matches(name):
    r = execute_case(strided(name), OutputsLibrary(packed=False), "cpu")
    assert (r.outcome, r.passed) == ("match", True), (r.outcome, r.message)


def test_one_write_into_a_gap_is_named_with_where_it_landed():
    buffers = Buffers("cpu")
    view = buffers.strided_output((2, 3), torch.float32, "o")
    view.fill_(1.0)
    assert view.stride() == (6, 2) and buffers.check() == []
    torch.as_strided(view, (1,), (1,), view.storage_offset() + 3).fill_(7.0)   # row 0, slot 3
    problems = buffers.check()
    assert problems == ["gaps of strided o: 1 of 6 skipped slots written (the library ignored "
                        "its stride 2), first at [0, 3] of the [..., 6] buffer it was cut "
                        "from"], problems


def test_integer_outputs_gaps_are_watched_too():
    buffers = Buffers("cpu")
    view = buffers.strided_output((4,), torch.int32, "indices")
    view.copy_(torch.arange(4, dtype=torch.int32))
    assert buffers.check() == []
    view.as_strided((8,), (1,)).copy_(torch.arange(8, dtype=torch.int32))
    assert buffers.check()[0].startswith("gaps of strided indices: 4 of 4 skipped slots")
