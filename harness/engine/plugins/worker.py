"""A worker's side: the test body that runs one case and attaches its row, the retiring of a
worker whose device is unusable, and the worker's device."""
from __future__ import annotations

import pytest

from harness.engine import after_call, device_memory, forkserver, heavy_gate, isolation, precheck
from harness.engine.perform import execute_repeated, failure_text, row_context
from harness.engine.row import case_row
from harness.engine.session import RUN, ROW_KEY, Run, default_profile, get_run


# The worker's stage while a forked child runs its case (the child has stages of its own).
FORKED_STAGE = "forked child"


def worker_state(run: Run) -> isolation.WorkerState:
    if run.state is None:
        state_dir = run.state_dir or isolation.state_tempdir()
        run.state_dir = state_dir
        run.state = isolation.WorkerState(state_dir, run.worker)
    return run.state


def run_case(request, case) -> dict:
    """The test body: execute the case, attach its row, fail when it fails."""
    run = get_run(request.config)
    item = request.node
    # A rerun must never report the previous attempt's row if this attempt raises.
    item.user_properties[:] = [p for p in item.user_properties if p[0] != ROW_KEY]
    try:
        row = _case_row(run, case)
    except BaseException:
        # Ours (a harness or adapter bug): the controller writes its harness_error row. A
        # device that is sick now still retires the worker before its next case.
        late = after_call.probe()
        if late is not None:
            run.retire_reason = late.text
        raise
    item.user_properties.append((ROW_KEY, row))
    if run.retire_reason and not run.is_worker:
        # No worker to retire (no xdist): every later case would run on the dead device and
        # take its crash. This case's row is written, then the run stops (pytest checks
        # shouldstop after each item); --resume goes on in a fresh process.
        item.session.shouldstop = (f"the device is unusable after {case.id} "
                                   f"({run.retire_reason}); the run stopped with its rows "
                                   f"kept: continue with --resume")
    if not row["pass"]:
        pytest.fail(failure_text(row), pytrace=False)
    return row


def _case_row(run: Run, case) -> dict:
    state = worker_state(run)
    target = run.target()
    if run.context is None:
        run.context = row_context(target)
    if state.data.get("context") is None:
        state.set_context(run.context)
    shares = device_memory.shares_for(case.params, device_memory.total_device_bytes(),
                                      extra=precheck.adapter_bytes(case, target))
    late = None
    timeout = run.timeout_for(case)
    forked = forkserver.forks_each(target, case)   # never for a case skipped before the call
    if forked:
        # Started before the case's timer: its start-up is no part of the case. The child's
        # own timer (the case's timeout) then fires first and names the child's stage.
        forkserver.server_for(run.opt("target"))
    # Inside the shares, never around them (heavy_gate: no worker waits for shares while
    # holding the gate); both before the hang timer starts.
    gate = heavy_gate.for_case(run.state_dir, case, precheck.adapter_bytes(case, target))
    with device_memory.held(run.state_dir, shares), heavy_gate.held(gate):
        state.begin(case.id, forkserver.worker_timeout(timeout) if forked else timeout)
        row = None
        try:
            if forked:
                state.stage(FORKED_STAGE)
                row = forkserver.forked_row(case, run.opt("target"), target, run.repeat(),
                                            timeout, run.context)
            else:
                # Our own out-of-memory error while building inputs: once more, alone on the
                # device (heavy_gate.Gate.run); the wait for it is no part of the case's time.
                result, attempts = gate.run(
                    lambda on_stage: execute_repeated(case, target, run.repeat(),
                                                      on_stage=on_stage),
                    on_stage=state.stage, pause=lambda: _pause_timer(state, case.id),
                    resume=lambda: state.begin(case.id, timeout))
        finally:
            state.end(case.id)
            # never raises: judged with the row
            late = after_call.release(shares or gate.release_cache())
    if row is None:
        row = case_row(case, result, attempts=attempts, repeat=run.repeat(),
                       profile=run.opt("profile") or default_profile(), **run.context)
    else:
        row["profile"] = run.opt("profile") or default_profile()
    retire = after_call.judge(row, late, forked)
    if retire is not None:
        run.retire_reason = retire
    return row


def _pause_timer(state: isolation.WorkerState, case_id: str) -> None:
    """Stop the case's hang timer while it waits at the gate: its own timer disarmed, and a
    state with no timeout, which the watchdog passes over (the case is still named, so a
    death while waiting is still this case's)."""
    import faulthandler
    faulthandler.cancel_dump_traceback_later()
    state.begin(case_id, None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    run = item.config.stash.get(RUN, None)
    if run is not None and run.retire_reason and run.state is not None and run.is_worker:
        # The device is unusable: leave before this case starts; the
        # controller reschedules it on a fresh worker.
        run.state.retire(run.retire_reason)


def prepare_device(worker: str) -> None:
    """Spread workers over the host's GPUs (worker gwN runs on device N mod count), and make
    the device context in the background.

    One worker group per device, so `-n 16` on a host of 8 GPUs puts two workers
    on each. Nothing to do on a CPU-only machine (torch.cuda.is_available() does
    not initialize a device context, so the check is free there).
    """
    import torch
    if not worker.startswith("gw") or not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    index = int(worker[2:]) % count if count > 1 else 0
    if count > 1:
        torch.cuda.set_device(index)
    # The device context (0.3 s alone, ~2 s when 16 workers start at once) is made while this
    # worker collects its cases. torch initializes under a lock, so a case that reaches the
    # device first waits for it; one that fails is raised again by the case's first call.
    import threading
    threading.Thread(target=_make_context, args=(index,), name="harness-device-context",
                     daemon=True).start()


def _make_context(index: int) -> None:
    import torch
    try:
        torch.empty(1, device=f"cuda:{index}")   # the first allocation makes the context
    except Exception:  # noqa: BLE001 - the first case's own device call raises it again
        pass
