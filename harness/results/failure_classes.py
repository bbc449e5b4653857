"""Failing rows grouped into failure classes: one defect, however many routes show it.

A class is keyed by the defect's signature, which no route, tensor or number enters:

- outcome and severity;
- stage: where the row failed (the `stage` column: build inputs, plan, run, compare, ...);
- what differs: whether o is wrong (with or without the LSE: one defect of o seen through
  the call forms that ask for the LSE and those that do not) or the LSE alone, from the
  per-output columns (o_max_abs_diff / o_tolerance, lse_...), or in a table from before them
  from first_bad_index and the message; empty for an outcome that compared no values, and
  for `silent` (its cause is the refusal that did not happen, whatever the values were);
- the family (`strided`, `gqa`, ...);
- the cause the variant names (cause_variant): the part of the case id after `<family>.`
  and before the next `/`, its tensor names (TENSORS) and numbers replaced by placeholders,
  so `strided.q_stride2`, `strided.k_cache_stride2` and `strided.out_stride2` are all
  `strided.<tensor>_stride<n>`; a feature's scenarios are one cause (`softcap.cap2_basic0`
  and `softcap.cap50_large_logits` are `softcap.*`), except in a must-refuse case, whose
  variant is the check it is about;
- the message's shape: numbers, hex addresses, tensor shapes, quoted values, tensor names
  and the row's own route replaced by placeholders, and the harness's "lse not compared"
  note left out (a row that could not compare an output joins the class of the rows that
  compared only the other).

So the same wrong kernel seen through nine routes, three dtypes, twenty tensors, every
scenario of a feature and every call form (out= given or returned, the LSE asked for or
not) is one class, and each class lists where it appears: its routes, variants, call forms
and tensors. Two defects stay two classes: o wrong vs the LSE alone wrong, SIGSEGV vs SIGFPE
(the signal is a word of the message), a crash in plan vs in run, two families, two
features, two missing checks.

Pure pandas: the console summary and the reports both read it.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field

import pandas as pd

from harness.results.numbers import finite_number

# Worst first; a row without a severity (tables written before the column) is
# "unrated", and a harness error is the harness's own bug, never the library's.
GROUPS = ("correctness", "capability", "clarity", "unrated", "harness")
OUTCOME_ORDER = ("crash", "corrupt", "hang", "wrong", "nondeterministic", "silent",
                 "unexpected_refusal", "refused", "harness_error", "skipped", "match")

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
    text = _text(text)
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return text.strip()


def message_shape(text, route: str = "", case_id: str = "") -> str:
    """The message as a class key holds it: normalize_message, then the row's own case id
    and route, and every tensor name (TENSORS), replaced by placeholders."""
    text = _text(text)
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


def _named_by_family(case_id: str, family: str) -> bool:
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
    text = _text(message)
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


def _form_rank(form: str) -> int:
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
    text = _FIRST_AT.sub("", _SUMMARY_OUTPUT.sub("", normalize_message(message)))
    for name in _MESSAGE_TENSOR.findall(text):
        found.setdefault(name, None)
    return list(found)


_number = finite_number   # one reader of a hostile table's numbers

_SIGNAL = re.compile(r"\b(SIG[A-Z0-9]{2,10})\b")


def signal_of(message) -> str:
    """The signal a crash row's message names (`worker died: SIGSEGV during run`), or ''."""
    found = _SIGNAL.search(_text(message))
    return found.group(1) if found else ""


def label_of(row) -> str:
    """`misplanned.dtype`: the row's `family.variant`, as a report names where it failed."""
    family = _text(row.get("family"))
    variant = variant_of(_text(row.get("case_id")), family)
    return f"{family}.{variant}" if family else variant


def cause_labels(row) -> set[str]:
    """The names a row's failure class goes by, as the reports label a class and the ledger
    names one: `family.variant` and `family.<variant's shape>`."""
    family = _text(row.get("family"))
    variant = variant_of(_text(row.get("case_id")), family)
    names = {variant, variant_shape(variant),
             cause_variant(variant, _text(row.get("expect")),
                           _named_by_family(row.get("case_id"), family))}
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
    found = _SUMMARY_OUTPUT.search(_text(get("message")))
    return found.group(1) if found else ""


@dataclass
class FailureClass:
    family: str
    variant: str                      # the variants' shape (variant_shape)
    outcome: str
    severity: str
    message: str                      # the messages' shape (message_shape)
    routes: list[str]
    targets: list[str]
    rows: pd.DataFrame = field(repr=False)
    stage: str = ""
    differs: str = ""                 # which outputs are wrong: o, lse, o+lse or ''
    variants: list[str] = field(default_factory=list)   # the variants it appears in
    tensors: list[str] = field(default_factory=list)    # the tensors its rows name
    call_forms: list[str] = field(default_factory=list)  # out+lse, out, lib+lse, lib

    @property
    def label(self) -> str:
        """`strided.q_stride2` for a class of one variant, else its shape:
        `strided.<tensor>_stride<n>`."""
        variant = self.variants[0] if len(self.variants) == 1 else self.variant
        return f"{self.family}.{variant}" if self.family else variant

    @property
    def key(self) -> tuple:
        """What makes two failing rows one class (failure_classes groups by it): the defect's
        signature, with no route, tensor, number or call form in it."""
        return (self.outcome, self.severity, self.stage, differs_key(self.differs),
                self.family, self.variant, self.message)

    @property
    def slug(self) -> str:
        """A file-name-safe name, stable for the same key: `report --repros` names the
        class's script `<slug>.py` and the HTML report links to it by that name."""
        shape = self.variant.replace(TENSOR, "T").replace("<n>", "N")
        name = f"{self.family}.{shape}" if self.family else shape
        head = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.outcome}-{name}").strip("-.")[:60]
        digest = hashlib.sha1(repr(self.key).encode()).hexdigest()[:8]
        return f"{head or 'class'}-{digest}"

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    @property
    def example(self) -> str:
        """One case id that shows the class (`harness repro` takes it)."""
        return str(self.rows["case_id"].iloc[0])

    @property
    def example_message(self) -> str:
        return _text(self.rows["message"].iloc[0])

    @property
    def group(self) -> str:
        return group_of(self.outcome, self.severity)


def group_of(outcome: str, severity: str) -> str:
    """The severity heading a failing row sits under (GROUPS)."""
    if outcome == "harness_error":
        return "harness"
    return severity if severity in GROUPS else "unrated"


def _text(value) -> str:
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    return str(value)


def _rank(order, value) -> int:
    return order.index(value) if value in order else len(order)


def failure_classes(df: pd.DataFrame) -> list[FailureClass]:
    """The failing rows of `df` as classes (keyed by FailureClass.key), worst first.

    Order: severity group (GROUPS), outcome (OUTCOME_ORDER), most rows, label.
    Each class's rows are sorted by route and case id; its first row is the
    example.
    """
    if not len(df):
        return []
    failing = df[~df["pass"].astype(bool)].copy()
    if not len(failing):
        return []
    for col in ("family", "outcome", "severity", "message", "route", "target", "stage"):
        values = failing[col] if col in failing.columns else pd.Series("", index=failing.index)
        failing[col] = [_text(v) for v in values]
    records = failing.to_dict("records")
    failing["_variant"] = [variant_of(c, f) for c, f in zip(failing["case_id"], failing["family"])]
    # A harness error is our bug: its message is its cause, whatever case it hit.
    failing["_shape"] = [
        "*" if o == "harness_error" else
        cause_variant(v, _text(r.get("expect")), _named_by_family(r.get("case_id"), f))
        for v, r, o, f in zip(failing["_variant"], records, failing["outcome"], failing["family"])]
    silent = failing["outcome"] == "silent"
    failing["_message"] = [message_key(m, r, c, s)
                           for m, r, c, s in zip(failing["message"], failing["route"],
                                                 failing["case_id"], silent)]
    failing["_outputs"] = ["" if s else differs_of(r) for r, s in zip(records, silent)]
    failing["_differs"] = [differs_key(d) for d in failing["_outputs"]]
    failing["_form"] = [call_form(r) for r in records]
    key = ["outcome", "severity", "stage", "_differs", "family", "_shape", "_message"]
    temp = ["_variant", "_shape", "_message", "_differs", "_outputs", "_form"]
    classes = []
    for (outcome, severity, stage, _, family, shape, message), part in \
            failing.groupby(key, sort=False):
        part = part.sort_values(["route", "case_id"], kind="stable")
        tensors: dict[str, None] = {}
        for variant, msg in zip(part["_variant"], part["message"]):
            tensors.update(dict.fromkeys(tensors_of(variant, msg)))
        # Which outputs differ anywhere in the class: o's defect seen with the LSE asked for
        # (o+lse) and without it (o) is one class whose outputs are o+lse.
        seen = {name for d in part["_outputs"] for name in d.split("+") if name}
        classes.append(FailureClass(
            family, shape, outcome, severity, message,
            routes=sorted(set(part["route"]) - {""}), targets=sorted(set(part["target"]) - {""}),
            rows=part.drop(columns=temp), stage=stage,
            differs="+".join(n for n in OUTPUTS if n in seen),
            variants=sorted(set(part["_variant"])), tensors=sorted(tensors),
            call_forms=sorted(set(part["_form"]) - {""}, key=_form_rank)))
    classes.sort(key=lambda c: (_rank(GROUPS, c.group), _rank(OUTCOME_ORDER, c.outcome),
                                -c.n_rows, c.label, c.message))
    return classes


def causes_text(n: int) -> str:
    """`1 distinct cause`, `12 distinct causes`: how the reports count failure classes."""
    return f"{n} distinct cause{'s' if n != 1 else ''}"


def verdict(df: pd.DataFrame, classes: list[FailureClass] | None = None) -> str:
    """One line: `FAIL: 15 distinct causes (12 correctness, 3 clarity) across 198 failing
    rows (of 615)`; a cause is a failure class."""
    classes = failure_classes(df) if classes is None else classes
    n_known = known_count(df)
    known = f", {n_known} known (ledger)" if n_known else ""
    if not classes:
        return f"PASS: {len(df)} rows, 0 failing{known}"
    counts = {g: sum(c.group == g for c in classes) for g in GROUPS}
    named = [f"{n} {g}" for g, n in counts.items() if n and g != "harness"]
    if counts["harness"]:
        named.append(f"{counts['harness']} harness error")
    n_failing = sum(c.n_rows for c in classes)
    return (f"FAIL: {causes_text(len(classes))} ({', '.join(named)}) across {n_failing} "
            f"failing rows (of {len(df)}){known}")


def known_count(df: pd.DataFrame) -> int:
    """Rows the known-failures ledger excused (a reason in `ledger`): counted apart from
    passes and from new failures."""
    if "ledger" not in df.columns or not len(df):
        return 0
    return int(sum(bool(_text(v)) and bool(p) for v, p in zip(df["ledger"], df["pass"])))


def _routes_text(routes: list[str], shown: int = 3) -> str:
    head = ", ".join(routes[:shown])
    more = f", … (+{len(routes) - shown})" if len(routes) > shown else ""
    return f"{len(routes)} route{'s' if len(routes) != 1 else ''}: {head}{more}"


def _some(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f", … (+{len(names) - shown})" if len(names) > shown else "")


def where_text(cls: FailureClass) -> str:
    """`; 8 variants; tensors: k, k_cache, … (+6)` for a class seen in several variants or
    naming tensors; '' for a class of one variant that names none."""
    text = f"; {len(cls.variants)} variants" if len(cls.variants) > 1 else ""
    if len(cls.call_forms) > 1:
        text += f"; call forms: {', '.join(cls.call_forms)}"
    if cls.tensors:
        text += f"; tensor{'s' if len(cls.tensors) != 1 else ''}: {_some(cls.tensors)}"
    return text


def classes_text(classes: list[FailureClass], max_classes: int = 60,
                 max_message: int = 140) -> str:
    """The classes for a console, one line each, worst first; a message is printed once.

    `strided.<tensor>_stride<n>  wrong(o)  correctness  9 routes: fa2.single_prefill, …;
    12 variants; tensors: k, k_cache, … (+10)  — o max|diff| inf, …`
    Each line prints its own class's example message; only a message that an earlier line
    printed word for word says `same message as <that class>`.
    """
    if not classes:
        return ""
    shown = classes[:max_classes]
    cells = [(c.label, c.outcome + (f"({c.differs})" if c.differs else ""), c.severity or "-",
              _routes_text(c.routes) + (f" ({c.n_rows} rows)" if c.n_rows != len(c.routes) else "")
              + where_text(c))
             for c in shown]
    widths = [max(len(cell[i]) for cell in cells) for i in range(3)]
    seen: dict[str, str] = {}
    lines = [f"{len(classes)} failure class{'es' if len(classes) != 1 else ''}, worst first:"]
    for c, cell in zip(shown, cells):
        line = "  " + "  ".join(text.ljust(w) for text, w in zip(cell, widths)) + "  " + cell[3]
        msg = " ".join(c.example_message.split())
        if msg in seen:
            line += f"  — same message as {seen[msg]}"
        elif msg:
            line += "  — " + (msg if len(msg) <= max_message else msg[:max_message - 1] + "…")
            seen[msg] = c.label
        lines.append(line)
    if len(classes) > max_classes:
        lines.append(f"  … and {len(classes) - max_classes} more classes")
    return "\n".join(lines)


def console_summary(df: pd.DataFrame, max_classes: int = 60) -> str:
    """The verdict line, then the failure classes: what `harness check` prints first."""
    classes = failure_classes(df)
    text = verdict(df, classes)
    if classes:
        text += "\n" + classes_text(classes, max_classes=max_classes)
    return text
