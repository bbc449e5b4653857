"""The controller's side of the plugin, by its old name: the hooks now live in
harness/engine/plugins/ (controller, xdist_nodes, watchdog, replay, rows_out)."""
from harness.engine.plugins.controller import Controller
from harness.engine.plugins.replay import ReplayQueue
from harness.engine.plugins.rows_out import write_row
from harness.engine.plugins.watchdog import (VERDICT_SUFFIX, WATCHDOG_GRACE_S, WATCHDOG_POLL_S,
                                             Watchdog, diagnose, watchdog_grace)
from harness.engine.plugins.xdist_nodes import XdistHooks, no_replacement_after_the_end

__all__ = ["Controller", "ReplayQueue", "VERDICT_SUFFIX", "WATCHDOG_GRACE_S", "WATCHDOG_POLL_S",
           "Watchdog", "XdistHooks", "diagnose", "no_replacement_after_the_end",
           "watchdog_grace", "write_row"]
