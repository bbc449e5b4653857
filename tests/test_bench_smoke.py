"""The benchmarks' own pieces, in seconds: the table, the stage clock, the guard-call recorder,
and the guards' call-time switch that the guard fast path must keep."""
from __future__ import annotations

import pytest

from benchmarks.bare_loop import StageClock
from benchmarks.common import Section
from benchmarks.record import format_table


def test_table_has_one_line_per_row_and_says_what_was_not_measured():
    a, b = Section("one"), Section("two")
    a.add("wall", 12.345, "s", "a note")
    b.add("broken", None)
    lines = format_table([a, b]).splitlines()
    assert len(lines) == 4
    assert "12.3" in lines[2] and "a note" in lines[2]
    assert "n/a" in lines[3]


def test_stage_clock_times_and_restores():
    class Owner:
        @staticmethod
        def work(x):
            return x + 1

    clock = StageClock()
    original = Owner.work
    clock.patch(Owner, "work", "stage")
    clock.patch(Owner, "absent", "stage")  # a name that is gone is skipped
    assert Owner.work(1) == 2
    assert clock.seconds["stage"] > 0
    clock.restore()
    assert Owner.work is original


def test_recorded_guard_calls_are_the_ones_run_makes():
    from benchmarks.guard_cost import guard_functions, record_calls, scenarios
    from kernels import guards
    before = guard_functions()
    calls = record_calls(scenarios()["paged prefill run()"])
    names = [name for name, *_ in calls]
    assert {"half_planned_refuses", "run_matches_plan", "out_contiguous"} <= set(names)
    assert guard_functions() == before
    assert all(getattr(guards, a) is f for a, f in before.items())


def test_guard_switch_is_read_at_every_call(monkeypatch):
    from kernels import guards
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS", raising=False)
    with pytest.raises(ValueError, match="num_kv_heads"):
        guards.gqa_divisible("w", 4, 3)
    monkeypatch.setenv("KERNELS_DISABLE_GUARDS", "gqa_divisible")
    assert guards.gqa_divisible("w", 4, 3) is None
    monkeypatch.setenv("KERNELS_DISABLE_GUARDS", "all")
    assert guards.disabled() == set(guards.NAMES)
    monkeypatch.setenv("KERNELS_DISABLE_GUARDS", "rank_expected")
    with pytest.raises(ValueError, match="num_kv_heads"):
        guards.gqa_divisible("w", 4, 3)
    monkeypatch.setenv("KERNELS_DISABLE_GUARDS", "no_such_guard")
    for _ in range(2):  # an unknown name is refused at every call, not only the first
        with pytest.raises(ValueError, match="unknown guard"):
            guards.gqa_divisible("w", 4, 2)
