"""Run one case against one target in this process and classify it.

Stages: "build inputs" -> (the adapter's "plan", "run") -> "compare". The
stage reached is recorded on the result, and on_stage is told at every step
so that a worker that dies can still say where.

What is a harness error (raised) and what is an outcome (returned):
- bad params are a case bug: build_problem's ValueError propagates;
- an exception out of target.run is the library refusing: an outcome;
- a case with no reference (a GQA group that does not divide) that runs
  without error is `silent` when it must be refused, and a case bug
  otherwise: it can never be checked.
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch

from harness.engine.precheck import skip_reason
from harness.model import platform_info
from harness.model.builders import Buffers
from harness.model.case import Case
from harness.model.classify import (Verdict, adapter_bug_verdict, classify, crash_verdict,
                              error_text, harness_error_verdict)
from harness.model.compare import judge, summarize  # noqa: F401 (judge: tests)
from harness.model.params import ReadParams
from harness.model.signals import raises_device_fault
from harness.model.problem import build_problem
from harness.model.reference import NoReference, attention_baseline, attention_reference
from harness.results.columns import PER_OUTPUT_COLUMNS, from_result
from harness.targets.base import Skip, Target


class CaseBug(RuntimeError):
    """The case itself is inconsistent (not a library outcome)."""


@dataclass
class CaseResult:
    outcome: str
    passed: bool
    max_abs_diff: float | None
    n_wrong: int | None
    n_total: int | None
    first_bad_index: tuple | None
    message: str
    error_type: str
    stage: str
    duration_s: float
    tolerance: float | None = None
    baseline_error: float | None = None
    rel_error: float | None = None
    error_ratio: float | None = None
    # o's and lse's own numbers (harness/model/compare.py per_output); None when not compared.
    o_max_abs_diff: float | None = None
    o_tolerance: float | None = None
    o_error_ratio: float | None = None
    lse_max_abs_diff: float | None = None
    lse_tolerance: float | None = None
    lse_error_ratio: float | None = None
    # What the library returned (on the CPU), for comparing repeats bitwise;
    # never written to a row.
    outputs: dict = field(default_factory=dict, repr=False, compare=False)

    def as_dict(self) -> dict:
        row = asdict(self)
        row.pop("outputs")
        if self.first_bad_index is not None:
            row["first_bad_index"] = list(self.first_bad_index)
        return row


def _same_fields_as_the_row() -> None:
    """CaseResult's fields are the row's result columns (harness/results/columns.py names
    the field each is copied from), besides `outputs`: a field no column takes, or a column
    no field fills, fails at import, not as a row short of a number."""
    fields = set(CaseResult.__dataclass_fields__) - {"outputs"}
    named = {c.result for c in from_result()}
    if fields != named:
        raise TypeError(f"CaseResult and the row's columns disagree: fields without a "
                        f"column {sorted(fields - named)}, columns without a field "
                        f"{sorted(named - fields)} (harness/results/columns.py)")


_same_fields_as_the_row()


def is_device_fault(error: BaseException) -> bool:
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(error, accel):
        return True
    return isinstance(error, RuntimeError) and raises_device_fault(str(error))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Exceptions a library raises to refuse an input are ValueError, RuntimeError,
# TypeError or NotImplementedError (torch's TORCH_CHECK and friends). These are
# what an adapter or case bug raises instead; they never count as a refusal.
HARNESS_ERRORS = (AttributeError, NameError, KeyError, ImportError, AssertionError,
                  UnboundLocalError, SyntaxError)


def execute_case(case: Case, target: Target, device: torch.device | str | None = None,
                 on_stage: Callable[[str], None] | None = None) -> CaseResult:
    start = time.perf_counter()
    device = torch.device(device) if device is not None else platform_info.device()
    buffers = Buffers(device, on_stage=on_stage)

    def done(verdict: Verdict, summary=None, error_type: str = "", outputs=None) -> CaseResult:
        if buffers.notes:
            # How the adapter ran the case where the platform changes it (a captured graph
            # or plain calls): on the row whatever the verdict.
            note = "; ".join(buffers.notes)
            verdict = replace(verdict, message=f"{verdict.message}; {note}" if verdict.message
                              else note)
        return CaseResult(
            outcome=verdict.outcome, passed=verdict.passed,
            max_abs_diff=summary.max_abs_diff if summary else None,
            n_wrong=summary.n_wrong if summary else None,
            n_total=summary.n_total if summary else None,
            first_bad_index=summary.first_bad_index if summary else None,
            message=verdict.message, error_type=error_type, stage=buffers.current_stage,
            duration_s=time.perf_counter() - start,
            tolerance=summary.tolerance if summary else None,
            baseline_error=summary.baseline_error if summary else None,
            rel_error=summary.rel_error if summary else None,
            error_ratio=summary.error_ratio if summary else None,
            **{col: getattr(summary, col) if summary else None for col in PER_OUTPUT_COLUMNS},
            outputs=outputs or {})

    why = skip_reason(case, target)
    if why is not None:
        return done(classify(case, skip_reason=why))
    try:
        return _execute(case, target, device, buffers, done)
    except Exception as error:
        # A device fault is the device's, wherever it surfaces (an input copy, the reference,
        # the compare): a kernel launched earlier in this process faulted, and every later
        # call fails alike. A crash at the stage it surfaced in, never a harness error that
        # would leave the worker running on a poisoned context.
        if not is_device_fault(error):
            raise
        return done(device_fault_verdict(case, error, buffers.current_stage),
                    error_type=type(error).__name__)


def device_fault_verdict(case: Case, error: BaseException, stage: str, before: str = ""):
    # The runtime's first line names the error; the rest is its advice text.
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return crash_verdict(case, f"{before}device error {type(error).__name__}: {first_line}", stage)


def _execute(case: Case, target: Target, device: torch.device, buffers: Buffers, done) -> CaseResult:
    buffers.stage("build inputs")
    problem = build_problem(case.params, case.seed, device)
    performed, read = _tracked(case)
    read.buffers = buffers

    try:
        result = target.run(performed, problem, buffers)
        _sync(device)
    except Skip as skip:
        return done(classify(case, skip_reason=str(skip) or "skipped by the adapter"))
    except HARNESS_ERRORS as error:
        # A bug in an adapter or case (a misspelt attribute, a missing key) is not the
        # library refusing: a harness_error row naming where it was raised, in every
        # process that runs cases (a check worker, a repro or check-target child).
        return done(adapter_bug_verdict(error, buffers.current_stage),
                    error_type=type(error).__name__)
    except Exception as error:  # noqa: BLE001 - every library exception is an outcome
        if is_device_fault(error):
            return done(device_fault_verdict(case, error, buffers.current_stage),
                        error_type=type(error).__name__)
        try:
            # What the library launched before it raised must not fault either: a refusal
            # whose kernels then read out of bounds is a crash of this case, not the next one's.
            _sync(device)
        except Exception as fault:  # noqa: BLE001
            if not is_device_fault(fault):
                raise
            return done(device_fault_verdict(
                case, fault, buffers.current_stage,
                before=f"raised {type(error).__name__} ({error_text(error)[:200]}), then a "),
                error_type=type(fault).__name__)
        if buffers.current_stage == "build inputs":
            # Raised before the library was called: the adapter or the case, never a refusal.
            return done(harness_error_verdict(
                f"the adapter raised before calling the library: {error_text(error)}"),
                error_type=type(error).__name__)
        unread = _unread(read)
        if unread:
            return done(unread, error_type=type(error).__name__)
        corruption = buffers.check()
        return done(classify(case, error=error, corruption=corruption,
                             vocabulary=target.capabilities.vocabulary,
                             message_prefix=getattr(target, "message_prefix", None)),
                    error_type=type(error).__name__)

    unread = _unread(read)
    if unread:
        return done(unread)
    result = dict(result or {})
    corruption = buffers.check()
    outputs = _returned(result)
    if corruption:
        return done(classify(case, corruption=corruption), outputs=outputs)

    buffers.stage("compare")
    baseline = result.pop("baseline", None)
    if "expected" in result:
        expected = result.pop("expected")
    else:
        # Where it is cheapest: a small device problem's reference on the CPU, from its
        # kept copy of the same bits (Problem.on_host); the rest where the problem lives.
        where = problem.on_host() or problem
        try:
            expected = attention_reference(where)
        except NoReference as why:
            if case.expect == "refuse":
                return done(classify(case), outputs=outputs)
            raise CaseBug(f"{case.id}: ran without error but has no reference ({why}); "
                          f"a case the reference cannot define must expect 'refuse'") from why
        baseline = attention_baseline(where)
        if where is not problem:
            # Judged there too: the outputs' CPU copies are made already (for the repeats).
            result.update(outputs)
    not_returned = result.pop("not_returned", {})
    # What the target never returns (an LSE): judged without it, named on the row.
    for name, why in target.capabilities.not_returned(case.params).items():
        not_returned.setdefault(name, why)
    comparisons = judge(result, expected, baseline, problem, skip=set(not_returned))
    # A must-refuse case that ran is `silent` whatever its values; they still go on the row.
    summary = summarize(comparisons)
    verdict = classify(case, comparisons=comparisons)
    if not_returned:
        note = "; ".join(f"{name} not compared: {why}" for name, why in not_returned.items())
        verdict = replace(verdict, message=f"{verdict.message}; {note}" if verdict.message
                          else note)
    return done(verdict, summary, outputs=outputs)


def _tracked(case: Case):
    """The case as the adapter gets it: the same case, its params a ReadParams."""
    read = ReadParams(case.params)
    performed = copy.copy(case)
    object.__setattr__(performed, "params", read)
    return performed, read


def _unread(read: ReadParams) -> Verdict | None:
    keys = read.unread()
    if not keys:
        return _strided_not_handed(read)
    said = ", ".join(f"params[{k!r}] = {read._params[k]!r}" for k in keys)
    return harness_error_verdict(f"the adapter never read {said}: the case it ran is not "
                                 f"this case (docs/targets.md: every perturbation is the "
                                 f"adapter's to perform, or to Skip)")


def _strided_not_handed(read: ReadParams) -> Verdict | None:
    """A strided case whose named tensor never went through the case's buffers (Views or
    Buffers.watch/output under that name) tested the packed tensor: not this case."""
    name = read._params.get("strided")
    if not name:
        return None
    base = next((name[:-len(tail)] for tail in ("_heads", "_far") if name.endswith(tail)), name)
    if base in read.buffers.names() or name in read.buffers.names():
        return None
    return harness_error_verdict(
        f"params['strided'] = {name!r}, but no tensor named {base!r} went through the "
        f"case's buffers (layout.Views.input/index/output, or Buffers.watch/output under "
        f"that name): the view was never made, so the packed tensor was tested")


def _returned(result) -> dict:
    """The library's outputs, copied to the CPU, for comparing attempts bitwise."""
    out = {}
    for name in ("o", "lse"):
        value = (result or {}).get(name)
        if isinstance(value, torch.Tensor):
            out[name] = value.detach().to("cpu", copy=True)
    return out
