"""A failing row's cause signature: the parts of a row that say what went wrong, with what
varies between routes, tensors, shapes, scenarios and call forms taken out
(harness/results/failure_classes.py groups rows by it; the known-failures ledger names a
class by the labels it gives)."""
from __future__ import annotations

import json
import math
import re

import pandas as pd

from harness.results.numbers import finite_number

# The tensor names routes and targets give their inputs, outputs and index tensors: the
# case buffers' names (harness/targets/layout.py Views.input/index/output, Buffers.watch/
# output in harness/model/builders.py), cases/strided.py's TENSORS and INDEX, and the names
# the adapters' libraries use for the same tensors (FlashInfer's paged_kv_*, vLLM's
# key_cache / value_cache / query_start_loc / seq_lens / block_table, merge-state's v_a, s_b).
TENSORS = (
    "q", "k", "v", "o", "lse", "out", "s",
    "k_cache", "v_cache", "kv_cache", "key_cache", "value_cache", "paged_kv_cache",
    "qo_indptr", "kv_indptr", "kv_indices", "last_page_len", "kv_last_page_len",
    "indptr", "indices", "mask_indptr", "custom_mask", "alibi_slopes",
    "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
    "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf",
    "paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer",
    "query_start_loc", "seq_lens", "block_table",
    "v_a", "s_a", "v_b", "s_b", "v_other", "s_other", "state", "partial_state",
    "partial_state_v", "partial_state_s",
)
OUTPUTS = ("o", "lse")            # the outputs compared against the reference
TENSOR = "<tensor>"
# Longest first, so `k_cache_stride2` reads as k_cache, not k; a name is a whole token
# between non-alphanumerics (`_` and `.` separate tokens in a variant).
_NAMES = "|".join(sorted(map(re.escape, TENSORS), key=len, reverse=True))
_VARIANT_TENSOR = re.compile(rf"(?<![A-Za-z0-9])(?:{_NAMES})(?![A-Za-z0-9])")
_VARIANT_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# In a message a name is a whole word; `out` and `s` are English too (`timed out`, `out of
# bounds`, `30 s`), and those are left alone.
_MESSAGE_TENSOR = re.compile(
    rf"(?<![\w<.'’])(?<!timed )(?<!ran )(?<!run )(?<!runs )(?<!time )(?<!<n> )"
    rf"(?:{_NAMES})(?![\w>]|\s+of\b)")
_SUMMARY_OUTPUT = re.compile(r"(?<![\w.])(o|lse) max\|diff\|")
_FIRST_AT = re.compile(r"\bfirst at (?:o|lse)(?![\w])")
# A silent row's cause is the refusal that did not happen; whether its values then matched
# (`(values match the reference)` or `(o max|diff| ...)`) is the route's, not the cause's.
_SILENT_VALUES = re.compile(r"(must be refused) \((?:[^()]|\([^()]*\))*\)")

_RULES = (
    # The controller's isolation note says where a row failed, not what failed.
    (re.compile(r"\s*\[replay:.*\]\s*$"), ""),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"(?<![\w'\"])(['\"])(?:(?!\1).){0,200}?\1(?!\w)"), "<q>"),
    (re.compile(r"torch\.Size\(\[[^\]]*\]\)"), "<shape>"),
    (re.compile(r"[(\[]\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*[)\]]|[(\[]\s*-?\d+\s*,\s*[)\]]"),
     "<shape>"),
    (re.compile(r"\b\d+(?:x\d+)+\b"), "<shape>"),
    (re.compile(r"(?<![\w.])-?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\w]|\.\d)"), "<n>"),
    (re.compile(r"(?<![\w.])-?(?:inf|infinity|nan)\b", re.IGNORECASE), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalize_message(text) -> str:
    """The message with what varies between routes and shapes replaced by placeholders
    (tensor names stay: message_shape takes them out too)."""
    text = cell_text(text)
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text.strip()


def message_shape(text, route: str = "", case_id: str = "") -> str:
    """The message as a class key holds it: normalize_message, then the row's own case id
    and route, and every tensor name (TENSORS), replaced by placeholders."""
    text = cell_text(text)
    if case_id:
        text = text.replace(case_id, "<case>")
    if route:
        text = text.replace(route, "<route>")
    return _MESSAGE_TENSOR.sub(TENSOR, normalize_message(text))


def variant_of(case_id: str, family: str) -> str:
    """`out_stride2` for `<route>/strided.out_stride2/<tag>` and family `strided`."""
    parts = str(case_id).split("/")
    middle = parts[1] if len(parts) > 1 else parts[0]
    prefix = f"{family}."
    return middle[len(prefix):] if family and middle.startswith(prefix) else middle


def variant_shape(variant: str) -> str:
    """`<tensor>_stride<n>` for `k_cache_stride2`, `d<n>_window<n>` for `d32_window15`."""
    return _VARIANT_NUMBER.sub("<n>", _VARIANT_TENSOR.sub(TENSOR, str(variant)))


def named_by_family(case_id: str, family: str) -> bool:
    """Whether the case id's variant part starts with its family (`features.softcap...`):
    only then is a dot inside the variant the family's own sub-division."""
    parts = str(case_id).split("/")
    middle = parts[1] if len(parts) > 1 else parts[0]
    return bool(family) and middle.startswith(f"{family}.")


def cause_variant(variant: str, expect: str = "", scenarios: bool = True) -> str:
    """The part of a variant that names the cause: `softcap.*` for `softcap.cap2_basic0`
    (a feature's scenarios are where one defect of the feature shows), the variant's shape
    otherwise (`<tensor>_stride<n>`). A must-refuse case's variant is the check it is about
    (`refuse.sinks_too_long`, `refuse.alibi_per_kv_head`: two missing checks), so it stays
    whole."""
    shape = variant_shape(variant)
    if scenarios and expect != "refuse" and "." in shape:
        return shape.split(".", 1)[0] + ".*"
    return shape


# The harness's note that an output the case asks for was not returned, so not compared:
# it says what the row could not judge, not what failed (the same row without it is the class).
_NOT_COMPARED = re.compile(r";?\s*\b\w+ not compared: [^;]*")


def message_key(message, route: str = "", case_id: str = "", silent: bool = False) -> str:
    """The message as a class key holds it (message_shape): a silent row's values and the
    "not compared" notes left out."""
    text = cell_text(message)
    if silent:
        text = _SILENT_VALUES.sub(r"\1", text)
    text = _NOT_COMPARED.sub("", text)
    # A message that says the same of several tensors (`canary after out: ...; canary after
    # lse: ...`) has the shape of one such clause: the LSE's canary beside o's is the call
    # form that hands an lse, not another defect.
    clauses = message_shape(text, route, case_id).split("; ")
    return "; ".join(dict.fromkeys(clauses))


def differs_key(differs: str) -> str:
    """A class's key for which outputs differ: o's defect is one class whether the LSE was
    also asked for (o+lse) or not (o); an LSE alone wrong is another."""
    return "o" if "o" in str(differs).split("+") else str(differs)


_FORMS = ("out+lse", "out", "lib+lse", "lib")


def form_rank(form: str) -> int:
    return _FORMS.index(form) if form in _FORMS else len(_FORMS)


def call_form(row) -> str:
    """`out+lse`, `out`, `lib+lse` or `lib`: whether the caller handed out= (else the
    library allocated it) and asked for the LSE (params out_form and return_lse); ''
    when the row's params do not say."""
    params = row.get("params")
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            return ""
    if not isinstance(params, dict) or "return_lse" not in params:
        return ""
    base = "lib" if params.get("out_form") == "library" else "out"
    return base + ("+lse" if params.get("return_lse") else "")


def tensors_of(variant: str, message="") -> list[str]:
    """The tensor names a row names: in its variant, and in its message other than the
    compared outputs' own (`o max|diff| ...` says what differs, not which tensor)."""
    found = dict.fromkeys(_VARIANT_TENSOR.findall(str(variant)))
    # The harness's "lse not compared: ... (its call forms: out)" note names what it could
    # not judge, not a tensor of the failure.
    text = _NOT_COMPARED.sub("", cell_text(message))
    text = _FIRST_AT.sub("", _SUMMARY_OUTPUT.sub("", normalize_message(text)))
    for name in _MESSAGE_TENSOR.findall(text):
        found.setdefault(name, None)
    return list(found)


_number = finite_number   # one reader of a hostile table's numbers

_SIGNAL = re.compile(r"\b(SIG[A-Z0-9]{2,10})\b")


def signal_of(message) -> str:
    """The signal a crash row's message names (`worker died: SIGSEGV during run`), or ''."""
    found = _SIGNAL.search(cell_text(message))
    return found.group(1) if found else ""


def label_of(row) -> str:
    """`misplanned.dtype`: the row's `family.variant`, as a report names where it failed."""
    family = cell_text(row.get("family"))
    variant = variant_of(cell_text(row.get("case_id")), family)
    return f"{family}.{variant}" if family else variant


def cause_labels(row) -> set[str]:
    """The names a row's failure class goes by, as the reports label a class and the ledger
    names one: `family.variant` and `family.<variant's shape>`."""
    family = cell_text(row.get("family"))
    variant = variant_of(cell_text(row.get("case_id")), family)
    names = {variant, variant_shape(variant),
             cause_variant(variant, cell_text(row.get("expect")),
                           named_by_family(row.get("case_id"), family))}
    return {f"{family}.{n}" if family else n for n in names}


def _over(diff, tol) -> bool:
    """Whether one output's own max |diff| is past its own tolerance (a missing output is
    an inf diff and no tolerance)."""
    diff, tol = _number(diff), _number(tol)
    if diff is None:
        return False
    return diff == math.inf if tol is None else diff > tol


def _index_name(value) -> str:
    if isinstance(value, str) and value.startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return ""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], str):
        return value[0]
    return value if isinstance(value, str) else ""


def differs_of(row) -> str:
    """Which outputs are wrong: `o`, `lse`, `o+lse`, or '' (none, or not known).

    From the per-output columns where the row has them; in a table from before them, the
    output first_bad_index or the message names first (such a row cannot say `o+lse`)."""
    get = row.get
    if any(_number(get(f"{n}_max_abs_diff")) is not None for n in OUTPUTS):
        return "+".join(n for n in OUTPUTS if _over(get(f"{n}_max_abs_diff"),
                                                    get(f"{n}_tolerance")))
    name = _index_name(get("first_bad_index"))
    if name in OUTPUTS:
        return name
    found = _SUMMARY_OUTPUT.search(cell_text(get("message")))
    return found.group(1) if found else ""


def shown(text, keep: str = "") -> str:
    """Text from a table as a reader may see it: every character that is not printable
    (controls, ESC, line separators, bidi and zero-width marks) written as its escape
    (`\\x1b`, `\\u202e`), so nothing in a case id or a message acts on a terminal or
    reorders what is shown; the characters in `keep` (a report's own newlines) stay."""
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in str(text))


def cell_text(value) -> str:
    """A cell as text: '' for a missing value (None, NaN), else str() (the ledger reads it too)."""
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    return str(value)
