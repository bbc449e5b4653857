"""The environment variables that change what a run tests, checked before it starts.

HARNESS_MAX_CASE_BYTES overrides the harness's own size ceiling: `abc` used to turn the
ceiling off without a word, and `1` skipped every case of a selection (a run that tested
nothing). KERNELS_TESTONLY_FAULT picks a planted fault of the bundled library's test-only
build: outside a test build (KERNELS_TESTONLY=1) every call refused, and those refusals
became the library's rows. Each is one line and exit 2 before the first case; the limits
in effect are printed in the run's header and written in its summary JSON.
"""
from __future__ import annotations

import os
from typing import Mapping

MAX_CASE_BYTES_ENV = "HARNESS_MAX_CASE_BYTES"   # harness/model/budget.py CEILING_ENV
FAULT_ENV = "KERNELS_TESTONLY_FAULT"            # kernels/_lib.py FAULT_ENV
TESTONLY_ENV = "KERNELS_TESTONLY"


def environment_error(env: Mapping[str, str] | None = None) -> str | None:
    """Why this environment cannot make a run, in one line; None when it can."""
    env = os.environ if env is None else env
    value = env.get(MAX_CASE_BYTES_ENV)
    if value is not None and value != "":
        try:
            number = int(value.strip())
        except ValueError:
            return (f"{MAX_CASE_BYTES_ENV}={value!r}: must be a whole number of bytes above 0 "
                    f"(the per-case size ceiling); unset it for the default")
        if number <= 0:
            return (f"{MAX_CASE_BYTES_ENV}={value}: must be above 0 bytes (the per-case size "
                    f"ceiling); unset it for the default")
    fault = env.get(FAULT_ENV)
    if fault and env.get(TESTONLY_ENV) != "1":
        return (f"{FAULT_ENV}={fault!r}: plants a fault of the library's test-only build, "
                f"which this run does not use ({TESTONLY_ENV}=1 selects it, for the project's "
                f"own tests); unset {FAULT_ENV}")
    return None


def limits(args=None, env: Mapping[str, str] | None = None) -> dict:
    """The harness limits this run overrides, by name: {"max_case_bytes": {"value": N,
    "from": "--max-case-bytes" | "HARNESS_MAX_CASE_BYTES"}}; {} for the defaults."""
    env = os.environ if env is None else env
    out = {}
    given = getattr(args, "max_case_bytes", None) if args is not None else None
    if given is not None:
        out["max_case_bytes"] = {"value": int(given), "from": "--max-case-bytes"}
    elif env.get(MAX_CASE_BYTES_ENV):
        out["max_case_bytes"] = {"value": int(env[MAX_CASE_BYTES_ENV].strip()),
                                 "from": MAX_CASE_BYTES_ENV}
    timeout = getattr(args, "case_timeout", None) if args is not None else None
    if timeout is not None:
        out["case_timeout_s"] = {"value": float(timeout), "from": "--case-timeout"}
    return out


def limits_text(found: dict) -> str:
    """`max case bytes 1 (HARNESS_MAX_CASE_BYTES)`, ...; "" for the defaults."""
    names = {"max_case_bytes": "max case bytes", "case_timeout_s": "case timeout s"}
    return ", ".join(f"{names.get(k, k)} {v['value']:g} ({v['from']})" if isinstance(v["value"], float)
                     else f"{names.get(k, k)} {v['value']} ({v['from']})" for k, v in found.items())
