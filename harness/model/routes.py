"""Route names the harness knows: "<backend>.<op>".

An op is what a case family is written against (it decides which inputs make
sense); a backend is one implementation of that op in a target. Families
yield cases for every route whose op they cover, out of the routes the
selected target declares.
"""
from __future__ import annotations

# The target every command tests when --target is not given: the bundled library.
DEFAULT_TARGET = "bundled"

OPS = (
    "single_prefill",   # one request, dense q/k/v
    "single_decode",    # one request, one query token
    "paged_prefill",    # plan()/run() over a paged KV cache
    "ragged_prefill",   # plan()/run() over packed (ragged) k/v
    "batch_decode",     # plan()/run(), one query token per request, paged KV
    "merge_state",      # merge two attention states (o, lse)
    "mixed_batch",      # decode-first mixed batch split by query_start_loc
)

# The bundled library's routes. Other targets declare their own lists.
BUNDLED_ROUTES = (
    "fa2.single_prefill",
    "fa2.single_decode",
    "fa2.paged_prefill",
    "fa2.ragged_prefill",
    "fa2.batch_decode",
    "fa2_tc.batch_decode",    # tensor-core decode variant (prefill kernel over decode)
    "aiter.batch_decode",     # no LSE output; return_lse falls back to an fa2 shadow plan
    "ll4mi.batch_decode",     # VHELOOP = head_size / 16 / NWARPS, with its route selector
    "fa2.merge_state",
    "fa2.mixed_batch",
)


def op_of(route: str) -> str:
    op = route.split(".", 1)[-1]
    if op not in OPS:
        raise ValueError(f"route {route!r}: op {op!r} is not one of {OPS}")
    return op


def routes_for(ops: set[str] | tuple[str, ...], routes: tuple[str, ...]) -> list[str]:
    """The routes among `routes` whose op is in `ops`."""
    return [r for r in routes if op_of(r) in ops]
