"""short_output: a caller-given output one row short of the answer (issue: every tensor on
its own, `out` too small).

The caller hands out= (or lse=) with its first dimension one short: the buffer cannot hold
the answer, so no result is defined and the library must refuse, naming the buffer. The
buffer lies between canary bands: a library that writes the whole answer anyway writes into
the band (`corrupt`); one that writes what fits and stops is `silent`. Only the caller-given
call form: a library that allocates its own output has no buffer to be short.
"""
from __future__ import annotations

from typing import Iterator

from cases._expect import of_case
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "short_output"
# One problem per op, borrowed from the strided family (each tensor on its own there too).
OPS = ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill", "batch_decode",
       "mixed_batch")


def _problems():
    from cases import strided
    return strided.PROBLEMS, strided._BASE


def cases(routes) -> Iterator[Case]:
    problems, base = _problems()
    for route in routes:
        op = op_of(route)
        if op not in OPS:
            continue
        p = {**base, **problems[op]}
        outputs = ("out", "lse") if p.get("return_lse") else ("out",)
        for name in outputs:
            params = {**p, "short_output": name}
            yield Case(route=route, family=FAMILY, variant=f"{name}_short", params=params,
                       tag=id_tag(p, "dims"), **of_case(op, params))
