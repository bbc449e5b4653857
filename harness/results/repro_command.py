"""The one command that re-runs a case: what reports print, shrink and bisect run."""
from __future__ import annotations

import shlex
from typing import Mapping

from harness.model.routes import DEFAULT_TARGET  # noqa: E402
from harness.model.target_options import as_args, text_of, values_of
from harness.results.table import OPTION_COLUMNS


def repro_args(case_id: str, target: str | None = None, options: Mapping | None = None,
               case_json: str | None = None) -> list[str]:
    """`repro`'s arguments for this case (after the `harness` command); `options` are the
    target's, {name: value} (options_of gives a row's)."""
    args = ["repro", str(case_id)]
    if case_json:
        args += ["--case-json", str(case_json)]
    if target and target != DEFAULT_TARGET:
        args += ["--target", str(target)]
    return args + as_args(options)


def typed(args: list[str]) -> str:
    """As a person types it: the `harness` console script, shell-quoted."""
    return shlex.join(["harness", *args])


def options_of(row: Mapping) -> dict[str, str]:
    """The target options a row ran with, {name: value as its flag takes it}; a column that
    is unset, NaN or missing is an option not given."""
    return {c: text for c in OPTION_COLUMNS if (text := text_of(row.get(c)))}


# A row's option cell as its values (a comma list, a JSON list, a list, or empty); the
# reports read guard names with it.
guard_names = values_of
