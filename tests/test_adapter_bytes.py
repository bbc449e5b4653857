"""Adapters' allocations count in a case's size budget: what a target declares it allocates
for a case (Target.estimate_bytes) is added where the ceiling is checked, before any tensor is
made, and in the device memory shares a case holds."""
from __future__ import annotations

import pytest

import harness.engine.execute as execute
from fault_target import FaultsTarget, fault_case
from harness.engine import device_memory, precheck
from harness.model import budget

GIB = 1 << 30


class CacheOwner(FaultsTarget):
    """A library whose adapter makes its own cache for every case: `own` bytes."""

    def __init__(self, own):
        self.own, self.asked = own, []

    def estimate_bytes(self, case):
        self.asked.append(case.id)
        return self.own


def test_a_case_that_fits_alone_is_skipped_when_its_adapters_cache_does_not(monkeypatch):
    case = fault_case("none")
    inputs = budget.case_bytes_estimate(dict(case.params))
    monkeypatch.setenv(budget.CEILING_ENV, str(inputs + 1000))

    def never(*a, **k):
        raise AssertionError("the problem was built before the ceiling was checked")
    monkeypatch.setattr(execute, "build_problem", never)
    target = CacheOwner(8 * GIB)
    r = execute.execute_case(case, target, "cpu")
    assert (r.outcome, r.passed) == ("skipped", True), r.message
    assert f"{inputs + 8 * GIB:,} bytes" in r.message, r.message
    assert f"{8 * GIB:,} of them the faults adapter's own" in r.message, r.message
    assert f"ceiling of {inputs + 1000:,} bytes (--max-case-bytes)" in r.message
    assert target.asked == [case.id]


def test_an_adapter_that_declares_nothing_keeps_the_harness_estimate(monkeypatch):
    case = fault_case("none")
    inputs = budget.case_bytes_estimate(dict(case.params))
    monkeypatch.setenv(budget.CEILING_ENV, str(inputs + 1000))
    assert execute.execute_case(case, CacheOwner(0), "cpu").outcome == "match"
    assert execute.execute_case(case, FaultsTarget(), "cpu").outcome == "match"
    assert precheck.over_budget(case, CacheOwner(999), inputs + 1000) is None
    assert precheck.over_budget(case, CacheOwner(1001), inputs + 1000) is not None


@pytest.mark.parametrize("bad", [-1, 1.5, "8 GB", True, None])
def test_a_declaration_that_is_no_byte_count_is_the_adapters_bug(monkeypatch, bad):
    monkeypatch.setenv(budget.CEILING_ENV, str(1 << 40))
    with pytest.raises(TypeError, match=r"estimate_bytes\(.*\) returned"):
        execute.execute_case(fault_case("none"), CacheOwner(bad), "cpu")


def test_the_adapters_bytes_count_in_the_device_memory_shares():
    params = dict(fault_case("none").params)
    total = 80 * GIB
    assert device_memory.shares_for(params, total) == 0
    assert device_memory.shares_for(params, total, extra=19 * GIB) == 2
    assert device_memory.shares_for(params, total, extra=800 * GIB) == device_memory.USABLE
