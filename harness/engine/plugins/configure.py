"""A session's start: a worker joins its controller's run; the controller (or the lone
process) settles the run: the scheduling, the table, and the controller's hooks
(controller.py, xdist_nodes.py), registered as objects because they hold the run. Under
`harness check` the run was planned before this process started (engine/run_plan.py)."""
from __future__ import annotations

import os
import signal

import pytest

from harness.engine import isolation
from harness.engine.plugins import lifecycle, options, schedule
from harness.engine.plugins.results_table import open_table
from harness.engine.plugins.worker import prepare_device
from harness.engine.session import RUN, Run
from harness.model import budget


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:
        info = worker_input["harness"]
        # A worker whose controller is gone has no one to send its rows to.
        lifecycle.die_with_parent(signal.SIGKILL, info.get("controller_pid"))
        run = Run(config, True, worker=worker_input.get("workerid", "gw?"), run_id=info["run_id"],
                  state_dir=info["state_dir"], done_ids=frozenset(info["done_ids"]))
        config.stash[RUN] = run
        prepare_device(run.worker)
        return
    if os.environ.get(lifecycle.PARENT_PID_ENV) is not None:
        if not lifecycle.started_by_check():
            # Left over in an environment, or its `harness check` has exited already.
            lifecycle.stop_now(config, None, lifecycle.stray_parent_line())
        # SIGTERM (the plugin's handler makes it Ctrl-C): the rows in flight are written and
        # the workers end, whether `harness check` exited or was killed with -9.
        lifecycle.die_with_parent(signal.SIGTERM, lifecycle.parent_pid())
    run = Run(config, False)
    config.stash[RUN] = run
    if config.getoption("collectonly"):
        return
    prepare_workers(config, run)
    settle(config, run)


def prepare_workers(config, run: Run) -> None:
    """What xdist's workers inherit or are sent when they are spawned."""
    options.check_options(config)
    options.hand_down(config)
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxworkerrestart", None) is None:
        # Every crash costs a worker; xdist's default (4 per worker) would end the run.
        config.option.maxworkerrestart = "1000000"
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Host kernels and the CPU reference each use every core by default;
        # N workers doing that oversubscribe the machine N-fold.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    if config.getoption("max_case_bytes"):
        os.environ[budget.CEILING_ENV] = str(config.getoption("max_case_bytes"))
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # SIGTERM ends the run like Ctrl-C: finished rows are on disk already,
        # and sessionfinish still records what is pending.
        signal.signal(signal.SIGTERM, lifecycle.sigterm)
    if not config.getoption("resume"):   # else the run id comes from the table: settle
        name_run(config, run, config.getoption("run_id") or options.new_run_id())


def name_run(config, run: Run, run_id: str) -> None:
    """The run id and the breadcrumb folder, which xdist sends each worker at its spawn."""
    run.run_id = run_id
    run.state_dir = isolation.state_tempdir()
    if config.pluginmanager.hasplugin("xdist"):
        from harness.engine.plugins.xdist_nodes import XdistHooks
        config.pluginmanager.register(XdistHooks(run), "harness-xdist")


def settle(config, run: Run) -> None:
    """The rest: the scheduling, the table, the controller's hooks."""
    schedule.one_case_at_a_time(config, schedule.selected(run))
    resumed_id = open_table(config, run)
    if config.getoption("resume"):
        name_run(config, run, config.getoption("run_id") or resumed_id or options.new_run_id())
    from harness.engine.plugins.controller import Controller
    from harness.engine.plugins.replay import ReplayQueue
    run.replays = ReplayQueue(run)
    controller = Controller(run)
    config.pluginmanager.register(controller, "harness-controller")
    controller.start_watchdog(config)
