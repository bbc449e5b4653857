"""A dead worker is replaced while work is left, and not once the run has nothing left."""
from __future__ import annotations

from types import SimpleNamespace

from harness.engine.controller import no_replacement_after_the_end


def dsession(finished: bool):
    cloned = []
    d = SimpleNamespace(sched=SimpleNamespace(tests_finished=finished),
                        _clone_node=lambda node: cloned.append(node) or "new")
    no_replacement_after_the_end(d)
    return d, cloned


def test_no_replacement_when_nothing_is_left():
    d, cloned = dsession(finished=True)
    assert d._clone_node("gw3") is None and cloned == []


def test_a_replacement_while_work_is_left():
    d, cloned = dsession(finished=False)
    assert d._clone_node("gw3") == "new" and cloned == ["gw3"]


def test_work_put_back_after_the_patch_is_seen():
    d, cloned = dsession(finished=True)
    d.sched.tests_finished = False       # a crashed case handed back for a rerun
    assert d._clone_node("gw1") == "new" and cloned == ["gw1"]
