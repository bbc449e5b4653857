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
hold the run, so configure registers them as objects once the run is settled. The table's
lock and resume (results_table.py) is a helper with no hooks; what a run is, worked out
before it starts, is the engine's (harness/engine/run_plan.py).

The names below stay importable from here (pytest_root/test_matrix.py imports run_case).
"""
from __future__ import annotations

# Each after the plugins it imports: pytest must import a plugin module itself (to rewrite
# its asserts), so none may be imported before its turn.
PLUGINS = (
    "harness.engine.plugins.options",
    "harness.engine.plugins.lifecycle",
    "harness.engine.plugins.schedule",
    "harness.engine.plugins.worker",
    "harness.engine.plugins.configure",
)
pytest_plugins = list(PLUGINS)

# name here -> (module under harness/engine/plugins/, its name there). Resolved on first use
# (PEP 562), never at this module's import, for the same reason.
_EXPORTS = {
    "PARENT_PID_ENV": ("lifecycle", "PARENT_PID_ENV"),
    "STOP_PREFIX": ("lifecycle", "STOP_PREFIX"), "die_with_parent": ("lifecycle", "die_with_parent"),
    "stop_now": ("lifecycle", "stop_now"),
    "KERNEL_PLATFORMS": ("options", "KERNEL_PLATFORMS"), "check_options": ("options", "check_options"),
    "selection_of": ("options", "selection_of"), "setup_errors": ("options", "setup_errors"),
    "HEAVY_WORK": ("schedule", "HEAVY_WORK"), "heaviest_first": ("schedule", "heaviest_first"),
    "_one_case_at_a_time": ("schedule", "one_case_at_a_time"),
    "run_case": ("worker", "run_case"),
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(f"harness.engine.plugins.{module}"), attr)
