"""Route names the harness knows: "<backend>.<op>".

An op is what a case family is written against (it decides which inputs make
sense); a backend is one implementation of that op in a target. Families
yield cases for every route whose op they cover, out of the routes the
selected target declares.
"""
from __future__ import annotations

from dataclasses import dataclass

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


# ---------------------------------------------------------------- what a family may ask of a route
#
# Families write inputs against an op; where a route's own kernel reaches different code
# for the same op, they ask these declared properties, never a backend's name. A route
# not named below has the defaults: its batch decode returns an LSE from its own kernel,
# takes no extra LSE-only plan, and its KV pools are built lazily.

@dataclass(frozen=True)
class RouteTraits:
    """What one route declares beyond its op."""
    # Its batch decode kernel writes the LSE; when False, return_lse=True runs another
    # kernel, so only a run without the LSE reaches its own one.
    decode_lse: bool = True
    # return_lse=True plans and runs a split shadow plan of its own (worth a case of its
    # own beside the kernel's unsplit run).
    lse_shadow_plan: bool = False
    # Its batch decode splits KV under a CUDA-graph plan and merges the partials itself.
    graph_split_decode: bool = False
    # The adapter fills a whole cache of its own (the caller's zeroed cache, written by the
    # library's cache writer), so a pool past 2^31 elements is resident (8.6 GB measured
    # for one case): no ci case past 2^31 on the host.
    eager_pools: bool = False


DEFAULT_TRAITS = RouteTraits()
# The bundled decode backends (kernels/decode.py): ll4mi's and aiter's kernels write no LSE;
# aiter's return_lse runs a lazily planned fa2 shadow plan; fa2's and fa2_tc's graph plans
# split (declared for these two only: the values family's graph decode cases are theirs).
# vLLM's CPU attention (harness/targets/vllm_cpu.py, backend "vllm") owns its cache.
TRAITS = {
    "fa2.batch_decode": RouteTraits(graph_split_decode=True),
    "fa2_tc.batch_decode": RouteTraits(graph_split_decode=True),
    "aiter.batch_decode": RouteTraits(decode_lse=False, lse_shadow_plan=True),
    "ll4mi.batch_decode": RouteTraits(decode_lse=False),
    **{f"vllm.{op}": RouteTraits(eager_pools=True) for op in OPS},
}


def traits(route: str) -> RouteTraits:
    """The declared properties of a route (the defaults for one not declared)."""
    op_of(route)
    return TRAITS.get(route, DEFAULT_TRAITS)
