"""short_output: a caller-given output one row short must be refused, naming it; the view
is laid out one row short between canaries, and a target without a caller-given buffer
skips the case with the reason."""
from __future__ import annotations

import torch

from cases import short_output
from harness.model.builders import Buffers
from harness.model.capabilities import Capabilities
from harness.targets.layout import Views


def _cases():
    return list(short_output.cases(["fa2.paged_prefill", "fa2.single_decode",
                                     "vllm.batch_decode"]))


def test_every_case_must_be_refused_naming_its_buffer():
    cases = _cases()
    assert {c.variant for c in cases} == {"out_short", "lse_short"}
    for c in cases:
        assert c.expect == "refuse" and c.refuse_words == (c.params["short_output"],), c.id


def test_the_named_output_is_one_row_short_and_the_other_is_whole():
    buffers = Buffers("cpu")
    views = Views({"short_output": "out"}, buffers)
    out = views.output("out", (7, 4, 8), torch.float16)
    lse = views.output("lse", (7, 4), torch.float32)
    assert tuple(out.shape) == (6, 4, 8) and tuple(lse.shape) == (7, 4)
    views.check_used()            # the short buffer was handed: no Skip


def test_a_target_that_hands_no_output_buffer_skips_it():
    caps = Capabilities(ops=frozenset({"paged_prefill"}), call_forms=frozenset({"lse"}))
    why = caps.lacks("paged_prefill", {"short_output": "out"})
    assert why and "call form out" in why
