"""What is decided about a case before any tensor is made or any library code runs: a
capability the target lacks, the memory ceiling (the adapter's own allocations counted), the
adapter's own skip. Decided where the case is handed out (a worker, a child), so a case a
target runs forked (forkserver.forks_each) costs no child to be skipped, and a case over the
ceiling never allocates."""
from __future__ import annotations

from harness.model import budget


def skip_reason(case, target) -> str | None:
    """Why the case is skipped, or None to run it. A malformed case raises (a harness error,
    never a skip), as does an adapter hook that answers what no adapter may."""
    from harness.model.problem import normalize   # torch: this module loads without it
    normalize(case.params)
    lacking = target.capabilities.lacks(case.op, case.params, case.requires)
    if lacking is not None:
        return f"{target.name} lacks {lacking}"
    over = over_budget(case, target)
    if over is not None:
        return over
    own = getattr(target, "skip_reason", None)
    return own(case) if callable(own) else None


def over_budget(case, target, ceiling: int | None = None) -> str | None:
    """The skipped row's message when the case's bytes, what its adapter declares it
    allocates included (Target.estimate_bytes), are over the run's ceiling; None when they fit."""
    ceiling = budget.run_ceiling() if ceiling is None else ceiling
    if not ceiling:
        return None
    params = dict(case.params)
    own = adapter_bytes(case, target)
    if not own:
        return budget.over_ceiling(params, ceiling)
    estimate = budget.case_bytes_estimate(params) + own
    if estimate <= ceiling:
        return None
    return (f"the case needs about {estimate:,} bytes ({own:,} of them the {target.name} "
            f"adapter's own, by its estimate), over the ceiling of {ceiling:,} bytes "
            f"(--max-case-bytes)")


def adapter_bytes(case, target) -> int:
    """The bytes the adapter declares it allocates for the case beyond the harness's own
    inputs (Target.estimate_bytes; 0 when it declares nothing). What a lazily allocated
    pool will really touch counts, not its virtual size. Anything but a whole number of
    bytes, 0 or more, is the adapter's bug: raised (a harness_error row), never a skip."""
    hook = getattr(target, "estimate_bytes", None)
    if not callable(hook):
        return 0
    value = hook(case)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{target.name}: estimate_bytes({case.id}) returned {value!r}; "
                        f"expected a whole number of bytes, 0 or more")
    return value
