"""Shared by the adapter tests that drive a library's stand-in on the CPU."""
from __future__ import annotations

import cases as families
from harness.engine.execute import execute_case


def sample(route, key, skip=lambda c: False, family="valid", limit=8) -> list:
    """A few non-fp32 cases of one route, one per distinct key(params), skipping skip(case)."""
    seen, picked = set(), []
    for c in families.generate([family], routes=(route,)):
        p = c.params
        if p.get("dtype") == "fp32" or len(p["kv_lens"]) > 7 or skip(c):
            continue
        k = key(p)
        if k not in seen:
            seen.add(k)
            picked.append(c)
    return picked[:limit]


def assert_all_match(target, chosen, route) -> None:
    """Every sampled case computes the reference answer through the stand-in."""
    assert chosen, route
    for case in chosen:
        result = execute_case(case, target, device="cpu")
        assert result.outcome == "match", (case.id, result.message)
