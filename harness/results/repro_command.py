"""The one command that re-runs a case: what reports print, shrink and bisect run."""
from __future__ import annotations

import json
import shlex

from harness.model.routes import DEFAULT_TARGET  # noqa: E402


def repro_args(case_id: str, target: str | None = None, disable_guards: str | None = None,
               case_json: str | None = None) -> list[str]:
    """`repro`'s arguments for this case (after the `harness` command)."""
    args = ["repro", str(case_id)]
    if case_json:
        args += ["--case-json", str(case_json)]
    if target and target != DEFAULT_TARGET:
        args += ["--target", str(target)]
    if disable_guards:
        args += ["--disable-guards", str(disable_guards)]
    return args


def typed(args: list[str]) -> str:
    """As a person types it: the `harness` console script, shell-quoted."""
    return shlex.join(["harness", *args])


def guard_names(value) -> list[str]:
    """A row's disable_guards (a comma list, a JSON list, a list, or empty) as guard names.
    Tables are hostile: a NaN, a lone "[" or a JSON scalar are read as what they spell."""
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, str):
        try:   # a JSON list, or names joined by commas; a lone "[" is the latter
            value = json.loads(value) if value.startswith("[") else value.split(",")
        except ValueError:
            value = value.split(",")
        if not isinstance(value, list):
            value = [value]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    return [str(g).strip() for g in value if str(g).strip()]
