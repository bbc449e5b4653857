"""Bounded inputs: how many bytes a case's tensors take, and which case files are refused.

Both read params alone (torch-free), so a case over the machine's memory is a `skipped` row
before any tensor is made, and a cases file holding a negative length or a context past
2^31 tokens is one line naming the case and the field, not an allocator's traceback or a
worker killed by the kernel's OOM killer.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from harness.model.sizes import qkv_elements

# Bytes per element of each dtype a case may name (harness/model/problem.py DTYPES); an
# unknown name counts as the widest, so an estimate never undercounts.
DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}
# The reference computes in fp64: its q, k, v copies and one score row per query block.
REFERENCE_BYTES = 8
# Past this many tokens in one request, or elements in a size field, a case is refused.
MAX_TOKENS = 1 << 31
# The share of MemAvailable one case may claim by default (--max-case-bytes).
DEFAULT_SHARE = 0.5

CASE_KEYS = ("route", "family", "variant", "params", "expect", "refuse_words", "seed", "tag",
             "requires")
REQUIRED_KEYS = ("route", "family", "variant", "params")
# Size fields: a whole number, 0 or more, below MAX_TOKENS.
SIZE_FIELDS = ("head_dim", "head_dim_vo", "num_qo_heads", "num_kv_heads", "page_size",
               "num_decodes", "batch_size", "num_pages")
LENGTH_LISTS = ("qo_lens", "kv_lens")


def case_bytes_estimate(params: dict) -> int:
    """Bytes a case's inputs, outputs and fp64 reference take, from its params alone.

    Inputs in the case's dtype (strided views double what they hold), the output and
    its canary bands, and the reference's fp64 copies of q, k, v and o. An estimate for a
    ceiling, not an allocator's count: it errs high.
    """
    elements = qkv_elements(params)
    width = DTYPE_BYTES.get(str(params.get("dtype", "bf16")), 8)
    strided = 2 if params.get("strided") else 1   # a stride-2 view holds twice its elements
    try:
        hq, dv = int(params.get("num_qo_heads", 1)), int(params.get("head_dim_vo")
                                                          or params.get("head_dim", 1))
        out = sum(int(q) for q in params.get("qo_lens", [1])) * hq * dv
    except (TypeError, ValueError):
        out = 0
    inputs = elements * width * strided
    outputs = 2 * out * width            # the output and its canary bands
    reference = (elements + out) * REFERENCE_BYTES
    return int(inputs + outputs + reference)


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_ceiling() -> int | None:
    avail = mem_available()
    return None if avail is None else int(avail * DEFAULT_SHARE)


# Set by the plugin from --max-case-bytes, so every worker (and every child it starts) has
# the run's one ceiling.
CEILING_ENV = "HARNESS_MAX_CASE_BYTES"


def run_ceiling() -> int | None:
    """The run's ceiling: --max-case-bytes (through CEILING_ENV), else default_ceiling()."""
    value = os.environ.get(CEILING_ENV)
    if value:
        try:
            return int(value)
        except ValueError:
            return None
    return default_ceiling()


def over_ceiling(params: dict, ceiling: int | None) -> str | None:
    """The skipped row's message when the case is over `ceiling` bytes; None when it fits."""
    if not ceiling:
        return None
    estimate = case_bytes_estimate(params)
    if estimate <= ceiling:
        return None
    return (f"the case needs about {estimate:,} bytes, over the ceiling of {ceiling:,} bytes "
            f"(--max-case-bytes)")


class CasesFileError(ValueError):
    """A cases file that cannot be a run's cases: one line naming the file, case and field."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load_cases_data(text: str, source: str) -> list[dict]:
    """The case records of a cases file's text, or CasesFileError in one line."""
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        raise CasesFileError(f"{source}: not a JSON list of cases ({e})") from None
    check_cases(data, source)
    return data


def check_cases(data: Any, source: str) -> None:
    if not isinstance(data, list):
        raise CasesFileError(f"{source}: the top level must be a JSON list of case objects, "
                             f"got {type(data).__name__}")
    for i, case in enumerate(data):
        where = f"{source}: case {i}"
        if not isinstance(case, dict):
            raise CasesFileError(f"{where}: must be a case object (Case.to_json), got "
                                 f"{type(case).__name__}")
        unknown = sorted(set(case) - set(CASE_KEYS))
        if unknown:
            raise CasesFileError(f"{where}: unknown key(s) {unknown}; keys are "
                                 f"{', '.join(CASE_KEYS)}")
        for key in REQUIRED_KEYS:
            if key not in case:
                raise CasesFileError(f"{where}: key {key!r} is missing")
        for key in ("route", "family", "variant"):
            if not isinstance(case[key], str):
                raise CasesFileError(f"{where}: {key!r} must be a string")
        params = case["params"]
        if not isinstance(params, dict):
            raise CasesFileError(f"{where}: 'params' must be an object")
        check_sizes(params, where)


def _bad_number(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def check_sizes(params: dict, where: str) -> None:
    """CasesFileError naming the field for a size no real problem has (negative, past
    2^31 tokens, not a whole number), or a NaN or infinity anywhere in params."""
    for key, value in params.items():
        if _bad_number(value):
            raise CasesFileError(f"{where}: params[{key!r}] = {value}: not a finite number")
    for key in SIZE_FIELDS:
        if key in params and params[key] is not None:
            _check_size(params[key], f"{where}: params[{key!r}]")
    for key in LENGTH_LISTS:
        if key not in params:
            continue
        value = params[key]
        if not isinstance(value, list):
            raise CasesFileError(f"{where}: params[{key!r}] must be a list of token counts")
        for j, n in enumerate(value):
            _check_size(n, f"{where}: params[{key!r}][{j}]")
        if sum(value) >= MAX_TOKENS:
            raise CasesFileError(f"{where}: params[{key!r}] sums to {sum(value):,} tokens, at or "
                                 f"past 2^31")


def _check_size(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CasesFileError(f"{what} = {value!r}: must be a whole number")
    if value < 0:
        raise CasesFileError(f"{what} = {value}: must be 0 or more")
    if value >= MAX_TOKENS:
        raise CasesFileError(f"{what} = {value:,}: at or past 2^31")
