"""graph_replan captures run() in a graph at the capacity plan and replays it after the re-plan.

On the host a stand-in graph API replays by calling the captured run() again over the same
capacity-sized buffers (what a replay launches), so the script's buffer handling is tested
here: the warm-up must leave the banded outputs poisoned, the capture must see capacity-sized
q/out/lse/partial_state, and a merge that writes past the re-planned rows must hit out's canary
band. On a GPU the real CUDA graph does the same (skipped without one).
"""
from __future__ import annotations

import pytest
import torch

from cases import generate
from harness.engine.execute import execute_case
from harness.targets import load_target
from harness.targets.plan_run.call import Call

GUARDS_ENV = "KERNELS_DISABLE_GUARDS"
ROUTE = "fa2.paged_prefill"


class HostReplay:
    """A graph API whose replay calls the captured function again (what a replay launches)."""

    def __init__(self):
        self.captured = []

    def warm_up(self, fn):
        fn()

    def capture(self, fn):
        self.captured.append(fn)
        return fn


def graph_cases() -> dict:
    return {c.variant: c for c in generate(["graph_replan"], [ROUTE])}


def _host_build() -> bool:
    import kernels
    return kernels.build_info()["platform"] == "host"


# The stand-in replays on the host build; a GPU build runs the real capture (last test).
host_only = pytest.mark.skipif(not _host_build(), reason="the library is a GPU build here")


@pytest.fixture
def host_graphs(monkeypatch):
    api = HostReplay()
    monkeypatch.setattr(Call, "graphs", property(lambda self: api))
    monkeypatch.delenv(GUARDS_ENV, raising=False)
    return api


@host_only
def test_replayed_graph_matches_and_says_it_was_captured(host_graphs):
    target = load_target("bundled")
    for variant in ("rows16_to_8_partial_state", "rows16_to_8_uneven", "rows16_to_8_no_partial_state"):
        r = execute_case(graph_cases()[variant], target, "cpu")
        assert r.outcome == "match", (variant, r.message)
        assert "captured at the capacity plan (16 rows" in r.message
    assert len(host_graphs.captured) == 3


@host_only
def test_replayed_merge_past_the_smaller_batch_is_corrupt(host_graphs, monkeypatch):
    monkeypatch.setenv(GUARDS_ENV, "merge_live_rows")
    r = execute_case(graph_cases()["rows16_to_8_partial_state"], load_target("bundled"), "cpu")
    assert r.outcome == "corrupt", r.message
    assert "canary after out" in r.message
    assert "replayed after the re-plan (8 rows" in r.message


@host_only
def test_a_refused_replan_is_refused_after_the_capture(host_graphs):
    r = execute_case(graph_cases()["rows_outgrow"], load_target("bundled"), "cpu")
    assert r.outcome == "refused", r.message
    assert r.stage == "replan"
    assert "total_num_rows" in r.message


@host_only
def test_the_host_says_it_did_not_capture(monkeypatch):
    monkeypatch.delenv(GUARDS_ENV, raising=False)
    r = execute_case(graph_cases()["rows16_to_8_partial_state"], load_target("bundled"), "cpu")
    assert r.outcome == "match"
    assert "no capture on this platform" in r.message


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU with CUDA graphs")
def test_cuda_graph_replay_past_the_smaller_batch_is_corrupt_with_the_guard_off(monkeypatch):
    target = load_target("bundled")
    cases = graph_cases()
    monkeypatch.delenv(GUARDS_ENV, raising=False)
    on = execute_case(cases["rows16_to_8_partial_state"], target, "cuda")
    assert on.outcome == "match" and "captured" in on.message, on.message
    monkeypatch.setenv(GUARDS_ENV, "merge_live_rows")
    off = execute_case(cases["rows16_to_8_partial_state"], target, "cuda")
    assert off.outcome == "corrupt" and "canary after out" in off.message, off.message
