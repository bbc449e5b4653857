"""Workers take the heavy cases first, one heavy case per worker, so no long-context case
starts last or waits behind another."""
from __future__ import annotations

import types
from functools import lru_cache

from xdist.scheduler.load import LoadScheduling

from cases import generate
from harness.engine import isolation
from harness.model import sizes
from harness.engine.plugin import HEAVY_WORK, _one_case_at_a_time, heaviest_first
from harness.model.routes import BUNDLED_ROUTES


@lru_cache(maxsize=1)
def _full_cases() -> tuple:
    """Generated once for the module's three tests (cases are frozen; each test gets a list)."""
    return tuple(generate(None, BUNDLED_ROUTES, profile="full"))


def _full_profile():
    return list(_full_cases())


def test_heavy_cases_come_first_heaviest_first_each_followed_by_a_light_one():
    cases = _full_profile()
    ordered = heaviest_first(cases)
    assert sorted(c.id for c in ordered) == sorted(c.id for c in cases)
    work = [sizes.case_work(c.params) for c in ordered]
    heavy = [w for w in work if w >= HEAVY_WORK]
    assert len(heavy) >= 2
    # Heavy at the even places, heaviest first; a light case between each two.
    assert work[0:2 * len(heavy):2] == sorted(heavy, reverse=True)
    assert all(w < HEAVY_WORK for w in work[1:2 * len(heavy):2])
    assert all("long_kv_full" in ordered[2 * i].id for i in range(8))
    light = [c.id for c in ordered if sizes.case_work(c.params) < HEAVY_WORK]
    assert light == [c.id for c in cases if sizes.case_work(c.params) < HEAVY_WORK]


class _Node:
    def __init__(self, name):
        self.name, self.sent, self.gateway = name, [], types.SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def shutdown(self):
        pass


def _first_hand_out(ids: list[str], workers: int, option) -> dict[str, list[int]]:
    """What xdist's load scheduler gives each worker before any case is done."""
    config = types.SimpleNamespace(option=option, getoption=lambda name: getattr(option, name),
                                   getvalue=lambda name: getattr(option, name))
    option.numprocesses, option.tx = workers, [f"{workers}*popen"]
    sched = LoadScheduling(config)
    nodes = [_Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, ids)
    sched.schedule()
    return {node.name: node.sent for node in nodes}


def test_xdist_gives_no_worker_two_heavy_cases_at_the_start():
    ordered = heaviest_first(_full_profile())
    is_heavy = [sizes.case_work(c.params) >= HEAVY_WORK for c in ordered]
    ids = [c.id for c in ordered]
    option = types.SimpleNamespace(dist="load", maxschedchunk=None)
    _one_case_at_a_time(types.SimpleNamespace(option=option), ordered)
    assert option.maxschedchunk == 1
    for workers in (2, 4, 16):
        handed = _first_hand_out(ids, workers, option)
        heavy_per_worker = [sum(is_heavy[i] for i in sent) for sent in handed.values()]
        assert max(heavy_per_worker) == 1, (workers, heavy_per_worker)
        assert sum(heavy_per_worker) == min(workers, sum(is_heavy))
    # xdist's default chunks are what this prevents: all heavy cases to the first worker.
    default = types.SimpleNamespace(dist="load", maxschedchunk=None)
    handed = _first_hand_out(ids, 16, default)
    assert sum(is_heavy[i] for i in handed["gw0"]) == sum(is_heavy)


def test_an_explicit_chunk_size_another_dist_mode_or_no_heavy_case_keeps_xdist_chunks():
    cases = _full_profile()
    light = [c for c in cases if sizes.case_work(c.params) < HEAVY_WORK]
    for dist, chunk, selected in (("load", 8, cases), ("loadgroup", None, cases),
                                  ("no", None, cases), ("load", None, light)):
        option = types.SimpleNamespace(dist=dist, maxschedchunk=chunk)
        _one_case_at_a_time(types.SimpleNamespace(option=option), selected)
        assert option.maxschedchunk == chunk
