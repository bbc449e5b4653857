"""Workers take the heavy cases first, so no long-context case starts last."""
from __future__ import annotations

from cases import generate
from harness import isolation
from harness.plugin import HEAVY_WORK, heaviest_first
from harness.routes import BUNDLED_ROUTES


def test_heavy_cases_come_first_heaviest_first_and_the_rest_keep_their_order():
    cases = generate(None, BUNDLED_ROUTES, profile="full")
    ordered = heaviest_first(cases)
    assert sorted(c.id for c in ordered) == sorted(c.id for c in cases)
    work = [isolation.case_work(c.params) for c in ordered]
    heavy = [w for w in work if w >= HEAVY_WORK]
    assert heavy and work[:len(heavy)] == sorted(heavy, reverse=True)
    assert all("long_kv_full" in c.id for c in ordered[:len(heavy)])
    light = [c.id for c in ordered[len(heavy):]]
    assert light == [c.id for c in cases if isolation.case_work(c.params) < HEAVY_WORK]
