"""The results table of a run: its path, its one writer's lock for the run's whole life, and
what --resume keeps of it."""
from __future__ import annotations

import sys
from pathlib import Path

from harness.engine.plugins.lifecycle import started_by_check, stop_now
from harness.engine.plugins.options import selection_of
from harness.engine.session import Run, run_shard
from harness.results import table


def open_table(config, run: Run) -> str | None:
    """Lock the run's table and ready it; with --resume, the run id its rows carry (None
    otherwise, or when it has none). A table that cannot be locked or read stops the run."""
    given = config.getoption("results")
    selection = selection_of(config)
    run.results = Path(given) if given else run.default_table(selection)
    run.default_results = not given and not selection and not run_shard()
    try:
        # For the run's whole life (the descriptor closes with this process): one writer.
        run.table_lock = table.TableLock.acquire(run.results, adopt_parent=started_by_check())
    except table.TableBusy as busy:
        stop_now(config, run, str(busy))
    except OSError as e:
        stop_now(config, run, f"cannot lock the results table {run.results} "
                              f"({e.strerror or e}); choose another --results or --results-dir")
    try:
        if config.getoption("resume"):
            if table.drop_torn_tail(run.results):
                print(f"results: {run.results}: its torn last line was cut off; that case "
                      f"runs again", file=sys.stderr)
            run.done_ids = frozenset(table.done_case_ids(run.results))
            return table.last_run_id(run.results)
        if run.results.exists():
            # A new file renamed over the old: never a moment without a table, and a reader
            # that has the old one open reads it whole.
            table.replace_with(run.results)
    except table.TableError as bad:
        stop_now(config, run, f"{bad}; fix or move the table, or run without --resume")
    except OSError as e:
        stop_now(config, run, f"cannot write the results table {run.results} "
                              f"({e.strerror or e}); choose another --results or --results-dir")
    return None
