"""Which cases this session runs, one test item each, and in what order workers take them."""
from __future__ import annotations

from harness.engine.session import Run, get_run
from harness.model import sizes


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    run = get_run(metafunc.config)
    cases = heaviest_first([c for c in run.cases() if c.id not in run.done_ids])
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


# A case at or above this much work (q.k products x heads x head_dim) starts before the rest.
HEAVY_WORK = 1 << 28


def heaviest_first(cases: list) -> list:
    """The heavy cases first, heaviest first, each followed by one light case; the rest in
    generation order.

    Workers pick cases up in this order (xdist hands each worker two cases, then one at a
    time: see one_case_at_a_time), so no long-context case starts last and holds one worker
    long after the others are done, and no two of them start on the same worker: on the
    H200 the full profile's eight long_kv_full cases, handed out in xdist's default chunks
    (a quarter of each worker's share, contiguous), all went to one worker, which ran them
    one after the other for 130 s after the other 2,990 rows were done. Every process
    sorts alike, as xdist needs."""
    work = {c.id: sizes.case_work(c.params) for c in cases}
    heavy = sorted((c for c in cases if work[c.id] >= HEAVY_WORK), key=lambda c: -work[c.id])
    light = [c for c in cases if work[c.id] < HEAVY_WORK]
    ordered = []
    for i, case in enumerate(heavy):
        ordered += [case, *light[i:i + 1]]
    return ordered + light[len(heavy):]


def one_case_at_a_time(config, cases: list) -> None:
    """With a heavy case selected, xdist's load scheduling in its smallest chunks: two cases
    to each worker at first, then one to whichever worker is free. Its default first
    hand-out (a contiguous quarter of each worker's share) would give one worker every
    heavy case heaviest_first put first. Without one the default chunks stay: one
    scheduling message per case cost the 1,845-case ci profile 0.9 s on 2 cores."""
    option = config.option
    if getattr(option, "dist", None) == "load" and getattr(option, "maxschedchunk", 0) is None \
            and any(sizes.case_work(c.params) >= HEAVY_WORK for c in cases):
        option.maxschedchunk = 1


def selected(run: Run) -> list:
    """The run's cases, or none when the selection is bad: collection then says why."""
    try:
        return run.cases()
    except Exception:  # noqa: BLE001 - reported by pytest_generate_tests, with its message
        return []
