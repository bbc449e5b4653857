"""Which dtype a family writes its cases in, for the target at hand.

A family pins a dtype only where the dtype is the point of the case; everywhere else its
cases run in a dtype the target declares (Capabilities.dtypes), so a library without bf16
still gets the family. A family keeps its own dtype wherever the target has it, so its case
ids do not change for a target that declares every dtype (the bundled library).

`declared` is the target's dtypes, or None when the cases are generated for no particular
target (every dtype is then declared).
"""
from __future__ import annotations

# The order a stand-in dtype is taken in: the 16-bit formats libraries serve first.
PREFERRED = ("bf16", "fp16", "fp32")


def _have(declared) -> tuple[str, ...]:
    return PREFERRED if declared is None else tuple(d for d in PREFERRED if d in declared)


def own_or_first(own: str, declared) -> str | None:
    """`own` where the target declares it, else the first declared dtype in PREFERRED order;
    None when the target declares none of them (the family then writes no case)."""
    have = _have(declared)
    if own in have:
        return own
    return have[0] if have else None


def each_declared(wanted, declared) -> tuple[str, ...]:
    """The dtypes of `wanted` the target declares, in `wanted`'s order; when it declares
    none of them, the one own_or_first gives for the first (so the family still runs)."""
    have = _have(declared)
    kept = tuple(d for d in wanted if d in have)
    if kept:
        return kept
    first = own_or_first(wanted[0], declared) if wanted else None
    return (first,) if first else ()
