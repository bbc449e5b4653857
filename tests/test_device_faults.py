"""A device fault is the device's wherever it surfaces, and nothing runs after it in that process.

On a GPU a kernel's illegal access is reported asynchronously: by the library's next call, by
the next input copy, or by the synchronize after a call that raised a refusal. Every such
surfacing is a `crash` of the case at the stage it surfaced in (never a harness error, which
would keep the worker running on a poisoned context, nor a refusal), and no further attempt
of the case runs on that context.
"""
from __future__ import annotations

import pytest

import harness.engine.execute as execute
from harness.engine import isolation
from harness.engine.execute import execute_case
from harness.engine.perform import execute_repeated
from harness.targets import load_target
from fault_target import fault_case

ILLEGAL = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be..."


def test_a_fault_surfacing_while_inputs_are_built_is_a_crash(monkeypatch):
    def poisoned(*args, **kwargs):
        raise RuntimeError(ILLEGAL)
    monkeypatch.setattr(execute, "build_problem", poisoned)
    r = execute_case(fault_case("none"), load_target("faults"), "cpu")
    assert (r.outcome, r.passed, r.stage) == ("crash", False, "build inputs"), r.message
    assert "illegal memory access" in r.message and "kernel errors" not in r.message


def test_a_refusal_whose_kernels_then_fault_is_a_crash_of_that_case(monkeypatch):
    class Refuses(type(load_target("faults"))):
        def run(self, case, problem, buffers):
            buffers.stage("run")
            raise ValueError("run(): num_qo_heads is 4 in plan() but q has 8")
    syncs = []

    def sync(device):
        syncs.append(device)
        raise RuntimeError(ILLEGAL)
    monkeypatch.setattr(execute, "_sync", sync)
    r = execute_case(fault_case("none"), Refuses(), "cpu")
    assert (r.outcome, r.passed, r.stage) == ("crash", False, "run"), r.message
    assert r.message.count("raised ValueError (") == 1 and "illegal memory access" in r.message
    assert syncs, "the refusal path never synchronized"


def test_a_harness_bug_is_still_raised(monkeypatch):
    def buggy(*args, **kwargs):
        raise RuntimeError("shape mismatch in the harness")
    monkeypatch.setattr(execute, "build_problem", buggy)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        execute_case(fault_case("none"), load_target("faults"), "cpu")


def test_no_attempt_runs_after_the_device_turns_unhealthy():
    try:
        result, attempts = execute_repeated(fault_case("sticky"), load_target("faults"), 3)
    finally:
        isolation._FORCED_UNHEALTHY.clear()
    assert len(attempts) == 1
    result, attempts = execute_repeated(fault_case("none"), load_target("faults"), 3)
    assert len(attempts) == 3 and result.outcome == "match"


def test_no_attempt_runs_after_a_crash(monkeypatch):
    calls = []

    def crashing(case, target, on_stage=None):
        calls.append(case.id)
        return execute_case(case, target, "cpu")
    monkeypatch.setattr(execute, "build_problem", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError(ILLEGAL)))
    monkeypatch.setattr(execute, "execute_case", crashing)
    result, attempts = execute_repeated(fault_case("none"), load_target("faults"), 3)
    assert result.outcome == "crash" and len(attempts) == 1 and len(calls) == 1


NINJA = ("Ninja build failed. Ninja output:\n[1/3] nvcc batch_prefill.cu\n"
         "include/flashinfer/utils.cuh:12: cudaError_t e = cudaGetLastError(); CUDA error check\n"
         "batch_prefill.cu(88): error: no instance of function template matches the argument list")


def test_a_kernel_build_failure_that_quotes_cuda_source_is_not_a_device_fault():
    # A JIT build's output may quote source naming cudaError: the device never faulted, so the
    # row is the library's failure in its own words, not a crash that retires the worker.
    class BuildFails(type(load_target("faults"))):
        def run(self, case, problem, buffers):
            buffers.stage("run")
            assert case.params["fault"] == "none"   # read, as an adapter reads what it performs
            raise RuntimeError(NINJA)
    assert not execute.is_device_fault(RuntimeError(NINJA))
    assert execute.is_device_fault(RuntimeError(ILLEGAL))
    r = execute_case(fault_case("none"), BuildFails(), "cpu")
    assert r.outcome != "crash" and not r.passed, (r.outcome, r.message)
    assert "Ninja build failed" in r.message, r.message
