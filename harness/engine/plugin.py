"""The pytest plugin: one test item per case, one results row per case.

Its concerns are named plugins under harness/engine/plugins/, registered from the one list
below as pytest registers its own default plugins: pytest imports each module named in
`pytest_plugins` when it loads this one (harness/engine/pytest_root/conftest.py names it).

  options      the check's options and the set-up checks made before any case
  lifecycle    a process tied to its parent, a stop in one line, a fast exit
  configure    a session's start: the worker joins, the controller settles the run
  schedule     one item per case, heavy cases first
  worker       the test body (run_case), a worker retired on a sick device

The controller's hooks (controller.py, xdist_nodes.py, watchdog.py, replay.py, rows_out.py)
hold the run, so configure registers them as objects once the run is settled. Held start
(held.py) and the table's lock and resume (results_table.py) are helpers with no hooks.

The names below stay importable from here (pytest_root/test_matrix.py imports run_case).
"""
from __future__ import annotations

PLUGINS = (
    "harness.engine.plugins.options",
    "harness.engine.plugins.lifecycle",
    "harness.engine.plugins.configure",
    "harness.engine.plugins.schedule",
    "harness.engine.plugins.worker",
)
pytest_plugins = list(PLUGINS)

from harness.engine.plugins.held import PARENT_PID_ENV, held_env_error, run_report  # noqa: E402
from harness.engine.plugins.lifecycle import STOP_PREFIX, die_with_parent, stop_now  # noqa: E402
from harness.engine.plugins.options import (  # noqa: E402
    GUARDS_ENV, KERNEL_PLATFORMS, check_guard_names, selection_of, setup_errors)
from harness.engine.plugins.schedule import (  # noqa: E402
    HEAVY_WORK, heaviest_first, one_case_at_a_time as _one_case_at_a_time)
from harness.engine.plugins.worker import run_case  # noqa: E402

__all__ = ["PLUGINS", "PARENT_PID_ENV", "STOP_PREFIX", "GUARDS_ENV", "KERNEL_PLATFORMS",
           "HEAVY_WORK", "check_guard_names", "die_with_parent", "heaviest_first",
           "held_env_error", "run_case", "run_report", "selection_of", "setup_errors",
           "stop_now", "_one_case_at_a_time"]
