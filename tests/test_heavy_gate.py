"""The heavy-case gate: a heavy case runs alone among the run's workers (it waits for the
light cases in flight, and every later case waits for it), a dead holder frees it, and an
out-of-memory error of the harness's own input building is run once more alone, while one
in the library's call is its outcome, never retried.

Contention is proven from outside the processes: a taker is blocked when the kernel lists it
as a waiter on the gate's files (/proc/locks), never by how long it took."""
from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from harness.engine import heavy_gate as hg
from harness.engine.execute import execute_case
from harness.engine.perform import execute_repeated
from harness.model.budget import device_bytes_estimate
from harness.model.capabilities import Capabilities
from harness.model.case import Case
from harness.model.reference import attention_reference
from harness.targets import load_target
from harness.targets.base import Target

GIB = 1 << 30
H200 = 140 * GIB
POLL_S = 0.01
# Only ends a test whose gate is broken (a taker never gets in): never a timing assertion.
GIVE_UP_S = 60.0


def _until(what, why: str):
    end = time.monotonic() + GIVE_UP_S
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {why}")
        time.sleep(POLL_S)


def _waiting(pid: int, folder: Path) -> bool:
    """Whether the kernel lists pid as blocked on a lock of one of the gate's files."""
    inodes = set()
    for name in (hg.MAIN, hg.TURN, hg.WANT):
        try:
            inodes.add((folder / name).stat().st_ino)
        except FileNotFoundError:
            pass
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields:
            continue
        rest = fields[fields.index("->") + 1:]       # FLOCK ADVISORY WRITE pid maj:min:inode
        if int(rest[3]) == pid and int(rest[4].rsplit(":", 1)[1]) in inodes:
            return True
    return False


def _gate(folder, heavy: bool, release=lambda: None) -> hg.Gate:
    # Forced on (no GPU here): two workers on a 140 GiB device.
    gate = hg.Gate(folder, 100 * GIB if heavy else GIB, H200, 2, release=release)
    assert gate.active and gate.heavy == heavy
    return gate


def _taker(folder: Path, name: str, heavy: bool) -> int:
    """A forked process that takes the gate, writes `<name>.in`, holds the gate until
    `<name>.go` exists, then writes `<name>.out` and lets go. Its allocator's cache handed
    back while it waits is `<name>.released`."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        with hg.held(_gate(folder, heavy, (folder / f"{name}.released").touch)):
            (folder / f"{name}.in").write_text(str(os.getpid()))
            while not (folder / f"{name}.go").exists():
                time.sleep(POLL_S)
            (folder / f"{name}.out").write_text("")   # still held: no one is in yet
        code = 0
    finally:
        os._exit(code)


def _reap(*pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def test_a_heavy_holder_blocks_a_heavy_and_a_light_taker_until_it_lets_go(tmp_path):
    holder = _taker(tmp_path, "holder", heavy=True)
    pids = [holder]
    try:
        _until((tmp_path / "holder.in").exists, "the heavy holder took the gate")
        heavy = _taker(tmp_path, "heavy", heavy=True)
        pids.append(heavy)
        _until(lambda: _waiting(heavy, tmp_path), "the second heavy taker blocked")
        light = _taker(tmp_path, "light", heavy=False)
        pids.append(light)
        _until(lambda: _waiting(light, tmp_path), "the light taker blocked")
        assert not (tmp_path / "heavy.in").exists() and not (tmp_path / "light.in").exists()
        # Waiting for (or behind) a heavy case, each first handed its cached blocks back.
        assert (tmp_path / "heavy.released").exists() and (tmp_path / "light.released").exists()
        assert not (tmp_path / "holder.released").exists()     # it never waited

        (tmp_path / "holder.go").touch()
        _until((tmp_path / "heavy.in").exists, "the heavy taker got in after the holder")
        assert (tmp_path / "holder.out").exists()
        # The light taker queued after the heavy one: it still waits, now for the heavy one.
        _until(lambda: _waiting(light, tmp_path), "the light taker blocked again")
        assert not (tmp_path / "light.in").exists()

        (tmp_path / "heavy.go").touch()
        _until((tmp_path / "light.in").exists, "the light taker got in last")
        assert (tmp_path / "heavy.out").exists()
        (tmp_path / "light.go").touch()
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
        pids = []
    finally:
        _reap(*pids)


def test_light_cases_share_and_a_heavy_one_waits_for_them_and_stops_new_ones(tmp_path):
    first, second = (_taker(tmp_path, n, heavy=False) for n in ("a", "b"))
    pids = [first, second]
    try:
        # Two light cases hold the gate together.
        _until(lambda: (tmp_path / "a.in").exists() and (tmp_path / "b.in").exists(),
               "two light takers inside at once")
        # Light behind light: no reason to hand a cache back.
        assert not (tmp_path / "a.released").exists() and not (tmp_path / "b.released").exists()
        heavy = _taker(tmp_path, "heavy", heavy=True)
        pids.append(heavy)
        _until(lambda: _waiting(heavy, tmp_path), "the heavy taker waits for the light ones")
        # Its turn is held while it waits: a new light case queues behind it, not past it.
        late = _taker(tmp_path, "late", heavy=False)
        pids.append(late)
        _until(lambda: _waiting(late, tmp_path), "the late light taker queued")
        # Light ones in flight see the heavy case waiting: they hand their cache back.
        assert _gate(tmp_path, heavy=False).release_cache()

        (tmp_path / "a.go").touch()
        _until((tmp_path / "a.out").exists, "the first light case ended")
        assert not (tmp_path / "heavy.in").exists()    # one light case is still in flight
        (tmp_path / "b.go").touch()
        _until((tmp_path / "heavy.in").exists, "the heavy case in once both light ones ended")
        assert not (tmp_path / "late.in").exists()
        (tmp_path / "heavy.go").touch()
        _until((tmp_path / "late.in").exists, "the late light case in after the heavy one")
        (tmp_path / "late.go").touch()
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
        pids = []
    finally:
        _reap(*pids)
    # Nobody waits for a heavy case now: a light case keeps its cache.
    assert not _gate(tmp_path, heavy=False).release_cache()


def test_a_holder_killed_mid_case_frees_the_gate(tmp_path):
    holder = _taker(tmp_path, "holder", heavy=True)
    try:
        _until((tmp_path / "holder.in").exists, "the holder took the gate")
        with open(tmp_path / hg.MAIN, "a") as main:
            assert not hg._try(main, fcntl.LOCK_SH)
            os.kill(holder, signal.SIGKILL)
            os.waitpid(holder, 0)
            assert hg._try(main, fcntl.LOCK_EX)
    finally:
        _reap(holder)


def test_the_gate_is_off_without_a_device_or_a_second_worker(tmp_path):
    assert not hg.Gate(tmp_path, 100 * GIB, 0, 16).active           # no GPU
    assert not hg.Gate(tmp_path, 100 * GIB, H200, 1).active         # one worker
    assert not hg.Gate(None, 100 * GIB, H200, 16).active            # no run folder
    off = hg.Gate(tmp_path, 100 * GIB, 0, 16)
    with hg.held(off):
        assert not list(tmp_path.iterdir()) and not off.release_cache()
    if not torch.cuda.is_available():   # a worker's own gate on this machine: off, no files
        case = load_target("bundled").cases(["scale"], "full")[0]
        assert not hg.for_case(tmp_path, case).active and not list(tmp_path.iterdir())


def test_the_workers_that_share_a_device_are_the_run_s_round_robin_share():
    # 16 workers on one GPU share it; on 8 GPUs two share each; one each: nobody shares.
    assert [hg.sharing_workers(w, d) for w, d in ((16, 1), (16, 8), (8, 8), (3, 2), (1, 4))] \
        == [16, 2, 1, 2, 1]
    assert not hg.Gate("/nonexistent", 100 * GIB, H200, hg.sharing_workers(8, 8)).active


def test_the_measured_h200_cases_are_heavy_at_16_workers_and_light_ones_stay_light():
    """The cases that ran an H200 out of memory with 16 workers (their device buffers: a page
    pool past 2^31 elements, a far-rows buffer past 2^31 elements) are heavy there; every ci
    case but those is light even at 16 workers, so the ci profile never waits."""
    full = load_target("bundled").cases(["scale"], "full")

    def heavy(c, workers):
        from harness.model.routes import op_of
        return hg.is_heavy(device_bytes_estimate(c.params, op_of(c.route)), H200, workers)
    far = [c for c in full if "past_2_31" in c.variant]
    assert far and all(heavy(c, 16) for c in far)
    assert not any(heavy(c, 2) for c in far)
    ci = load_target("bundled").cases(None, "ci")
    from harness.model.routes import op_of
    assert [c.id for c in ci if "past_2_31" not in c.variant
            and hg.is_heavy(device_bytes_estimate(c.params, op_of(c.route)), H200, 16)] == []


# ---- the retry of the harness's own out-of-memory error

P = {"dtype": "bf16", "head_dim": 8, "num_qo_heads": 4, "num_kv_heads": 2,
     "qo_lens": [3, 1], "kv_lens": [5, 4], "causal": True}


def _oom() -> BaseException:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.63 GiB")


class OomTarget(Target):
    """Runs the reference as its answer; its first `fail` runs raise an out-of-memory error
    at `where`: "inputs" (the adapter's own allocation, before the library's call) or "run"
    (inside the library's call)."""
    name = "oom"
    capabilities = Capabilities(ops=frozenset({"single_prefill"}))

    def __init__(self, where: str, fail: int = 1, seen=None):
        self.where, self.fail, self.calls = where, fail, 0
        self.seen = seen if seen is not None else (lambda: None)

    def run(self, case, problem, buffers):
        self.calls += 1
        self.seen()
        if self.where == "inputs" and self.calls <= self.fail:
            raise _oom()
        buffers.stage("plan")
        buffers.stage("run")
        if self.where == "run" and self.calls <= self.fail:
            raise _oom()
        total = sum(problem.qo_lens)
        o = buffers.output((total, problem.num_qo_heads, problem.head_dim_vo), problem.dtype,
                           "o")
        o.copy_(attention_reference(problem)["o"])
        return {"o": o}


def _case() -> Case:
    return Case("fa2.single_prefill", "oom", "v", dict(P), expect="match")


def _run(gate, target, case):
    with hg.held(gate):
        return gate.run(lambda on_stage: execute_repeated(case, target, 1, on_stage=on_stage))


def test_an_oom_while_building_inputs_is_run_again_alone_and_gets_the_real_verdict(tmp_path):
    gate = _gate(tmp_path, heavy=False)
    held: list = []

    def seen():
        # From another file description, as another worker would: is the gate exclusive?
        with open(tmp_path / hg.MAIN, "a") as other:
            free = hg._try(other, fcntl.LOCK_SH)
        held.append((gate.exclusive, not free))
    target = OomTarget("inputs", seen=seen)
    result, attempts = _run(gate, target, _case())
    assert target.calls == 2 and gate.retried
    assert held == [(False, False), (True, True)]      # shared first, then alone
    assert result.outcome == "match" and result.passed
    assert hg.RETRY_NOTE in result.message
    assert [a["outcome"] for a in attempts] == ["match"]


def test_an_oom_raised_by_the_harness_before_the_call_is_retried_too(tmp_path, monkeypatch):
    from harness.engine import execute
    real, calls = execute.build_problem, []

    def build(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise _oom()
        return real(*args, **kwargs)
    monkeypatch.setattr(execute, "build_problem", build)
    gate = _gate(tmp_path, heavy=False)
    result, _ = _run(gate, OomTarget("none"), _case())
    assert len(calls) == 2 and result.outcome == "match" and result.passed


def test_a_second_oom_is_the_harness_error_it_was(tmp_path):
    gate = _gate(tmp_path, heavy=False)
    target = OomTarget("inputs", fail=2)
    result, _ = _run(gate, target, _case())
    assert target.calls == 2
    assert result.outcome == "harness_error" and not result.passed
    assert "out of memory" in result.message and result.stage == "build inputs"


def test_an_oom_in_the_library_call_is_its_outcome_and_never_retried(tmp_path):
    gate = _gate(tmp_path, heavy=False)
    target = OomTarget("run")
    result, _ = _run(gate, target, _case())
    alone = execute_case(_case(), OomTarget("run"))
    assert target.calls == 1 and not gate.retried
    assert (result.outcome, result.passed, result.stage) == \
        (alone.outcome, alone.passed, alone.stage)
    assert result.stage == "run" and hg.RETRY_NOTE not in (result.message or "")


def test_nothing_is_retried_with_one_worker_or_on_other_errors(tmp_path):
    single = hg.Gate(tmp_path, GIB, H200, 1)
    target = OomTarget("inputs")
    result, _ = _run(single, target, _case())
    assert target.calls == 1 and result.outcome == "harness_error"

    gate = _gate(tmp_path, heavy=False)
    calls: list = []

    def broken(on_stage):
        calls.append(1)
        on_stage("build inputs")
        raise KeyError("num_qo_heads")
    with pytest.raises(KeyError), hg.held(gate):
        gate.run(broken)
    assert calls == [1]

    def library_oom(on_stage):
        calls.append(2)
        on_stage("run")
        raise _oom()
    with pytest.raises(torch.OutOfMemoryError), hg.held(gate):
        gate.run(library_oom)
    assert calls == [1, 2]


# ---- the worker's wiring (harness/engine/plugins/worker.py), the gate forced on

class _Config:
    """What run_case reads of pytest's config: options and the stash."""

    def __init__(self):
        self.options, self.stash = {"target": "faults", "repeat": 1, "profile": "ci"}, {}

    def getoption(self, name, default=None):
        return self.options.get(name, default)


class _State:
    """A worker's breadcrumbs in memory; at each begin (the hang timer armed) it notes
    whether the gate was held then, seen from another file description."""

    def __init__(self, folder):
        self.folder, self.data, self.log = folder, {"context": None}, []

    def set_context(self, context):
        self.data["context"] = context

    def begin(self, case_id, timeout_s):
        with open(self.folder / hg.MAIN, "a") as other:
            held = not hg._try(other, fcntl.LOCK_EX)
        with open(self.folder / hg.MAIN, "a") as other:
            alone = not hg._try(other, fcntl.LOCK_SH)
        self.log.append(("begin", timeout_s is not None, held, alone))

    def stage(self, name):
        pass

    def end(self, case_id):
        self.log.append(("end",))


def test_the_worker_times_a_case_from_when_the_gate_is_held_and_retries_alone(
        tmp_path, monkeypatch):
    from types import SimpleNamespace
    from fault_target import fault_case
    from harness.engine import execute
    from harness.engine.plugins import worker
    from harness.engine.session import ROW_KEY, RUN, Run

    gates: list = []

    def forced(folder, case, extra_bytes=0):
        gates.append(_gate(Path(folder), heavy=False))
        return gates[-1]
    monkeypatch.setattr(hg, "for_case", forced)
    real, built = execute.build_problem, []

    def build(*args, **kwargs):
        built.append(1)
        if len(built) == 1:
            raise _oom()
        return real(*args, **kwargs)
    monkeypatch.setattr(execute, "build_problem", build)

    config = _Config()
    run = Run(config, True, worker="gw0", run_id="r", state_dir=str(tmp_path))
    run.state = _State(tmp_path)
    config.stash[RUN] = run
    node = SimpleNamespace(user_properties=[])
    worker.run_case(SimpleNamespace(config=config, node=node), fault_case("none"))
    row = next(v for k, v in node.user_properties if k == ROW_KEY)
    assert (row["outcome"], row["pass"]) == ("match", True) and hg.RETRY_NOTE in row["message"]
    assert len(built) == 2 and gates[0].retried
    # (armed, gate held, held alone): the timer armed once the gate is held (shared), disarmed
    # (no timeout) before the wait for the gate alone, armed again once it is held alone.
    assert run.state.log == [("begin", True, True, False), ("begin", False, True, False),
                             ("begin", True, True, True), ("end",)]
