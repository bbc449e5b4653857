"""Bounded inputs: how many bytes a case allocates, and which case files are refused.

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


def case_bytes_estimate(params: dict, op: str | None = None) -> int:
    """Bytes a case allocates at its peak, from its params alone: case_bytes_parts and the
    op's own (op_bytes; without an op, as if it built a paged cache and a workspace).

    An estimate for a ceiling, not an allocator's count: it errs high (every part is
    counted as if all were alive at once), never low."""
    return sum(case_bytes_parts(params).values()) + sum(op_bytes(op, params).values())


# The reference's logits block (harness/model/reference.py _LOGITS_BUDGET, elements): its
# fp64 logits, their masked copy, logsumexp's and exp's temporaries and the weights P are
# alive together, and the fp32 baseline repeats it at half the width.
LOGITS_BLOCK = 1 << 24
LOGITS_LIVE = 6
# The float workspace a plan()/run() route hands the library (harness/targets/plan_run/
# call.py WORKSPACE_BYTES), unless the case names its own.
WORKSPACE_BYTES = 32 << 20
# Small tensors, index lists and the allocator's slack around them, whatever the case.
FIXED_BYTES = 16 << 20
INPUT_COPIES = 3
# Ops whose adapters build a paged cache (harness/targets/layout.py build_paged).
PAGED_OPS = ("paged_prefill", "batch_decode", "mixed_batch")
PLANNED_OPS = ("paged_prefill", "ragged_prefill", "batch_decode", "mixed_batch")
# A page pool past this many elements is poisoned only around the pages a request owns
# (layout.py FULL_POISON_ELEMS, _NEIGHBOURS): the untouched pages never become memory.
FULL_POISON_ELEMS = 1 << 26
POISONED_PER_PAGE = 5


def _int(params: dict, key: str, default: int) -> int:
    value = params.get(key)
    if value is None or isinstance(value, bool):
        return default
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default


def _lens(params: dict, key: str) -> list[int]:
    value = params.get(key, [1])
    if not isinstance(value, list):
        return [1]
    try:
        return [max(0, int(n)) for n in value]
    except (TypeError, ValueError):
        return [1]


def case_bytes_parts(params: dict) -> dict[str, int]:
    """What a case allocates, by part, in bytes (from its params alone):

    fixed      small tensors and the allocator's slack
    inputs     q, k, v in the case's dtype (a strided view holds twice its elements): the
               problem's, the adapter's copies and the input snapshots
    outputs    the output in its canary bands, the fp32 LSE
    reference  the fp64 copies of q, k, v and o, k and v expanded to every q head (GQA)
    masks      each request's [qo, kv] visibility mask and the temporary `&=` makes, a
               custom mask's draws (fp32 uniforms, a tree's [qo, qo] ancestors)
    logits     the reference's bounded logits blocks (LOGITS_LIVE fp64 copies alive)
    pages      the paged cache's k and v pools ([pages, page_size, Hkv, D], padding
               pages and page_id_offset's unreferenced ones included; an HND copy; the
               snapshot), as resident memory: a pool past FULL_POISON_ELEMS is touched only
               around the pages the requests own
    workspace  the float workspace of a plan()/run() route
    """
    qo, kv = _lens(params, "qo_lens"), _lens(params, "kv_lens")
    pairs = list(zip(qo, kv))
    hq = _int(params, "num_qo_heads", 1)
    hkv = _int(params, "num_kv_heads", 0) or hq
    d = _int(params, "head_dim", 1)
    dv = _int(params, "head_dim_vo", 0) or d
    width = DTYPE_BYTES.get(str(params.get("dtype", "bf16")), 8)
    strided = 2 if params.get("strided") else 1
    elements = qkv_elements(params)
    rows = sum(qo)
    out = rows * hq * dv
    kv_rows = sum(kv)
    parts = {
        "fixed": FIXED_BYTES,
        # the problem's tensors, the adapter's copies it hands the library, and the
        # snapshot that tells a changed input (builders.Buffers.watch)
        "inputs": INPUT_COPIES * elements * width * strided,
        "outputs": 2 * out * width + 2 * rows * hq * 4,
        # k and v expanded to every q head, and einsum's permuted copy of each
        "reference": (elements + out) * REFERENCE_BYTES
        + 2 * max(kv or [0]) * hq * (d + dv) * REFERENCE_BYTES,
    }
    biggest = max((q * k for q, k in pairs), default=0)
    masks = 2 * biggest
    custom = params.get("custom_mask")
    if custom:
        masks += sum(q * k * 5 + q * q for q, k in pairs)     # bool + fp32 draws, tree
    parts["masks"] = masks
    block = max((min(q, max(1, LOGITS_BLOCK // max(1, hq * k))) * hq * k for q, k in pairs),
                default=0)
    parts["logits"] = LOGITS_LIVE * block * REFERENCE_BYTES
    return parts


def op_bytes(op: str | None, params: dict) -> dict[str, int]:
    """What the op's adapter adds to case_bytes_parts: the paged cache and the workspace."""
    out = {"pages": 0, "workspace": 0}
    if op is None or op in PLANNED_OPS:
        out["workspace"] = _int(params, "workspace_bytes", WORKSPACE_BYTES)
    if op is None or op in PAGED_OPS:
        out["pages"] = page_pool_bytes(params)
    return out


def page_pool_bytes(params: dict) -> int:
    """The k and v page pools build_paged makes for the case, as resident bytes."""
    page = _int(params, "page_size", 16) or 1
    kv = _lens(params, "kv_lens")
    hq = _int(params, "num_qo_heads", 1)
    hkv = _int(params, "num_kv_heads", 0) or hq
    d = _int(params, "head_dim", 1)
    dv = _int(params, "head_dim_vo", 0) or d
    width = DTYPE_BYTES.get(str(params.get("dtype", "bf16")), 8)
    total = sum(-(-n // page) for n in kv)
    pool = max(_int(params, "page_id_offset", 0) + total, 1)
    copies = 2 if str(params.get("layout", "NHD")) == "HND" else 1
    resident = 0
    for dim in (d, dv):
        per_page = page * hkv * dim
        if pool * per_page <= FULL_POISON_ELEMS:
            pages = pool
        else:   # only the owned pages, their neighbours and the first two are touched
            pages = min(pool, 2 + POISONED_PER_PAGE * max(total, 1))
        resident += pages * per_page * width * copies
    return 2 * resident      # and its snapshot (builders.Buffers.watch)


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


def over_ceiling(params: dict, ceiling: int | None, op: str | None = None) -> str | None:
    """The skipped row's message when the case is over `ceiling` bytes; None when it fits."""
    if not ceiling:
        return None
    estimate = case_bytes_estimate(params, op)
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


# far_rows (harness/targets/layout.py): the last FAR_ROWS_PAST rows of a "k_far" / "v_far"
# view start past element 2^31 of one buffer.
FAR_ROWS_PAST = 4


def device_bytes_estimate(params: dict, op: str | None = None) -> int:
    """case_bytes_estimate on a GPU, where every allocation is resident whole: a page pool
    past FULL_POISON_ELEMS counts in full (its page_id_offset pages too) and a far-rows
    view counts its whole buffer, each twice (a device input past builders.SNAPSHOT_ELEMS
    is snapshotted by a device copy). What the host's lazy pages save does not apply."""
    total = case_bytes_estimate(params, op)
    if op is None or op in PAGED_OPS:
        total += 2 * _whole_pool_bytes(params) - page_pool_bytes(params)
    return total + 2 * far_rows_bytes(params)


def _whole_pool_bytes(params: dict) -> int:
    """The k and v pools build_paged allocates, every page counted (an HND layout's copy too)."""
    page = _int(params, "page_size", 16) or 1
    hkv = _int(params, "num_kv_heads", 0) or _int(params, "num_qo_heads", 1)
    d = _int(params, "head_dim", 1)
    dv = _int(params, "head_dim_vo", 0) or d
    width = DTYPE_BYTES.get(str(params.get("dtype", "bf16")), 8)
    pool = max(_int(params, "page_id_offset", 0)
               + sum(-(-n // page) for n in _lens(params, "kv_lens")), 1)
    copies = 2 if str(params.get("layout", "NHD")) == "HND" else 1
    return pool * page * hkv * (d + dv) * width * copies


def far_rows_bytes(params: dict) -> int:
    """The buffer under a "k_far" / "v_far" view: (rows - 1) token strides and a row, the
    stride putting the last FAR_ROWS_PAST rows past element 2^31; 0 for any other case."""
    side = {"k_far": "head_dim", "v_far": "head_dim_vo"}.get(str(params.get("strided")))
    if side is None:
        return 0
    rows = sum(_lens(params, "kv_lens"))
    if rows <= FAR_ROWS_PAST:
        return 0      # far_rows refuses it (a Skip): nothing allocated
    hkv = _int(params, "num_kv_heads", 0) or _int(params, "num_qo_heads", 1)
    dim = _int(params, side, 0) or _int(params, "head_dim", 1)
    row = hkv * dim
    stride = max(-(-(1 << 31) // (rows - FAR_ROWS_PAST)), row)
    width = DTYPE_BYTES.get(str(params.get("dtype", "bf16")), 8)
    return ((rows - 1) * stride + row) * width
