"""Options a target declares (its descriptor's OPTIONS), and how the engine carries them.

An option belongs to the target that declares it: its name is the row column it is recorded
in and the dest of its flag (`--` and the name with dashes) on every command that runs cases;
its `env`, when it has one, is the process variable the target's library reads. The engine
never names an option: it carries one mapping {name: value} in a child's spec, in the
environment (ENV, one JSON object) and in the row, and the target judges and applies it
(harness/targets/base.py). Values are text (a comma list where an option takes several).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

ENV = "HARNESS_TARGET_OPTIONS"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class TargetOption:
    name: str                 # the row column and the flag's dest
    help: str
    label: str = ""           # how a run's summary says it is set ("<label>: <value>")
    env: str = ""             # the process variable the library reads, if any
    metavar: str = "VALUE"

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"target option name {self.name!r}: lowercase letters, digits "
                             f"and _ only, starting with a letter")

    @property
    def flag(self) -> str:
        return flag_of(self.name)

    def said(self, value: str) -> str:
        return f"{self.label or self.name}: {value}"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def given(options: Mapping | None) -> dict[str, str]:
    """The options that are set (a None or empty value is an option not given)."""
    return {str(k): str(v) for k, v in (options or {}).items() if v not in (None, "")}


def merged(declared: Iterable[TargetOption]) -> tuple[TargetOption, ...]:
    """Several targets' options as one list, each name once; two targets may share an
    option only as one declaration (one flag cannot mean two things)."""
    out: dict[str, TargetOption] = {}
    for opt in declared:
        if out.setdefault(opt.name, opt) != opt:
            raise ValueError(f"target option {opt.name!r} is declared twice, differently")
    return tuple(out.values())


def as_args(options: Mapping | None) -> list[str]:
    """Options as command-line arguments: `--name value`, in name order."""
    return [a for name, value in sorted(given(options).items()) for a in (flag_of(name), value)]


def to_env(options: Mapping | None) -> str:
    return json.dumps(given(options), sort_keys=True)


def from_env(environ: Mapping | None = None) -> dict[str, str]:
    """The options this process was handed through ENV ({} when unset)."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV}={raw!r}: not a JSON object of option names and values")
    return given(data)


def values_of(value) -> list[str]:
    """An option's cell (a comma list, a JSON list, a list, or empty) as its values.
    Tables are hostile: a NaN, a lone "[" or a JSON scalar are read as what they spell."""
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, str):
        try:   # a JSON list, or values joined by commas; a lone "[" is the latter
            value = json.loads(value) if value.startswith("[") else value.split(",")
        except ValueError:
            value = value.split(",")
        if not isinstance(value, list):
            value = [value]
    elif not isinstance(value, (list, tuple)):
        value = [value]
    return [str(v).strip() for v in value if str(v).strip()]


def text_of(value) -> str:
    """An option's cell as the text its flag takes ('' when not set)."""
    return ",".join(values_of(value))
