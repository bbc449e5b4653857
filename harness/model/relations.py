"""The adversarial relations derived from a call signature (harness/model/signature.py).

Every argument role bounds or is bounded by another: an index lies within what it indexes,
a length within what holds it, an offset list starts at 0, never decreases and ends within
the rows, a stated maximum is at least every length, a count stated by the description
equals the tensors' (fewer and more). Each RELATIONS row breaks exactly one of them, in one
direction, on one metadata field (capabilities.METADATA_FIELDS), with the contract that
input carries and the reason. The misplanned family generates a case per row and op
(cases/misplanned.py); a case reaches every target whose signature carries the field and
whose core performs it (Signature.metadata).

One input, one contract: `violations(values)` reads the arguments a call is handed (plain
numbers and lists, after the adapter's mapping) and names every relation they break. A case
whose handed arguments break none is a valid (if padded) problem and must be `match`; one
that breaks any has no defined answer and must be `refuse` (tests/test_relations.py holds
every family's catalogue to it).

Pure data and plain functions: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

TORCH_NAME = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
OTHER_DTYPE = {"bf16": "fp16", "fp16": "bf16", "fp32": "bf16"}


def rows(p) -> int:
    return sum(p["qo_lens"])


def blocks_wide(p) -> int:
    """The block table's width: the most blocks any request holds."""
    return max(-(-k // p["page_size"]) for k in p["kv_lens"])


def pool_blocks(p) -> int:
    """Blocks in the pool: every request's, plus the one spare past them (the cores build it
    so, from id page_id_offset)."""
    return sum(-(-k // p["page_size"]) for k in p["kv_lens"]) + 1 + int(p.get("page_id_offset", 0))


def qo_offsets(p) -> list:
    out = [0]
    for n in p["qo_lens"]:
        out.append(out[-1] + n)
    return out


def decreasing_offsets(p) -> list:
    """The query offsets with two inner entries swapped: every entry within 0..rows, the
    first 0 and the last the rows, but one request's length negative."""
    o = qo_offsets(p)
    o[1], o[2] = o[2], o[1]
    return o


def last_pages(p) -> list:
    return [(k - 1) % p["page_size"] + 1 if k else 0 for k in p["kv_lens"]]


@dataclass(frozen=True)
class Relation:
    """One broken relation: the case variant, the metadata field it bends, the value handed
    (or a function of the problem's params), the contract, the word a refusal names, the
    planned value (None: the refusal names the field and the given value only), the ops it
    applies to (None: every op the field applies to), a k/v side, and why."""
    variant: str
    field: str
    value: object
    expect: str
    word: str
    planned: Callable | None
    reason: str
    ops: tuple | None = None
    only: str | None = None
    given: Callable | None = None      # the value a refusal names as given (default: value)

    def value_for(self, p):
        return self.value(p) if callable(self.value) else self.value


_PAGED = ("paged_prefill", "batch_decode")
_q = lambda p: p["num_qo_heads"]           # noqa: E731
_kv = lambda p: p["num_kv_heads"]          # noqa: E731
_kvrows = lambda p: sum(p["kv_lens"])      # noqa: E731

RELATIONS = (
    # counts planned vs given, both directions
    Relation("num_qo_heads", "num_qo_heads", 4, "refuse", "num_qo_heads", _q,
             "q has fewer heads than stated: the heads past q's are read from past it"),
    Relation("num_qo_heads_more", "num_qo_heads", lambda p: 2 * p["num_qo_heads"], "refuse",
             "num_qo_heads", _q,
             "q has more heads than stated: scratch sized by the plan overflows, or the "
             "extra heads go unwritten"),
    Relation("num_kv_heads", "num_kv_heads", 1, "refuse", "num_kv_heads", _kv,
             "the kv heads stated and held disagree (fewer held)"),
    Relation("num_kv_heads_more", "num_kv_heads", lambda p: 2 * p["num_kv_heads"], "refuse",
             "num_kv_heads", _kv, "the kv heads stated and held disagree (more held)"),
    Relation("head_dim_qk", "head_dim_qk", 64, "refuse", "head_dim_qk",
             lambda p: p["head_dim"], "q's head dim is not the one stated"),
    Relation("head_dim_vo", "head_dim_vo", 64, "refuse", "head_dim_vo",
             lambda p: p.get("head_dim_vo", p["head_dim"]), "v's head dim is not the one stated"),
    Relation("page_size", "page_size", 8, "refuse", "page_size", lambda p: p["page_size"],
             "the cache's pages are not the size stated"),
    Relation("rank", "rank", 2, "refuse", "rank", lambda p: 3,
             "q of another rank than the call reads"),
    Relation("q_rows_fewer", "q_rows", lambda p: rows(p) - 1, "refuse", "rows", rows,
             "q holds fewer rows than the query offsets cover: the last rows are read past q"),
    Relation("q_rows_padded", "q_rows", lambda p: rows(p) + 5, "match", "", None,
             "q padded past the rows the offsets cover (CUDA-graph callers do): valid"),
    Relation("kv_rows_fewer", "kv_rows", lambda p: _kvrows(p) - 1, "refuse", "kv_rows",
             _kvrows, "k/v hold fewer rows than the kv offsets cover"),
    Relation("num_kv_heads_k", "num_kv_heads", 1, "refuse", "num_kv_heads", _kv,
             "k alone holds other kv heads", only="k"),
    Relation("num_kv_heads_v", "num_kv_heads", 1, "refuse", "num_kv_heads", _kv,
             "v alone holds other kv heads", only="v"),
    Relation("kv_rows_fewer_k", "kv_rows", lambda p: _kvrows(p) - 1, "refuse", "kv_rows",
             _kvrows, "k alone holds fewer rows than the kv offsets cover", only="k"),
    Relation("kv_rows_fewer_v", "kv_rows", lambda p: _kvrows(p) - 1, "refuse", "kv_rows",
             _kvrows, "v alone holds fewer rows than the kv offsets cover", only="v"),
    Relation("dtype", "dtype", lambda p: OTHER_DTYPE[p["dtype"]], "refuse", "dtype",
             lambda p: TORCH_NAME[p["dtype"]], "q's dtype is not the one stated"),
    Relation("batch_size", "batch_size", lambda p: len(p["qo_lens"]) + 1, "refuse",
             "batch_size", lambda p: len(p["qo_lens"]),
             "more requests stated than the per-request tensors hold: read past them"),
    Relation("batch_size_fewer", "batch_size", lambda p: len(p["qo_lens"]) - 1, "refuse",
             "batch_size", lambda p: len(p["qo_lens"]),
             "fewer requests stated than the tensors describe: the last is never written"),
    # each length within what holds it
    Relation("kv_lens_past_table", "kv_lens", lambda p: (blocks_wide(p) + 1) * p["page_size"],
             "refuse", "kv_lens", None,
             "a kv length past what its block-table row holds: blocks read past the row"),
    Relation("kv_lens_negative", "kv_lens", -1, "refuse", "kv_lens", None,
             "a negative kv length"),
    # each index within what it indexes
    Relation("block_table_past_pool", "block_table", lambda p: pool_blocks(p) + 7, "refuse",
             "block_table", None, "a block id far past the pool of blocks"),
    Relation("block_table_one_past", "block_table", pool_blocks, "refuse", "block_table",
             None, "a block id one past the pool's last"),
    Relation("block_table_negative", "block_table", -1, "refuse", "block_table", None,
             "a negative block id: read before the pool (a wrap-around)"),
    # each offset list consistent
    # The offsets' last entry past q's rows is q_rows_fewer's input seen from the offsets:
    # the same words (the rows the offsets cover, the rows q has).
    Relation("query_start_loc_past", "query_start_loc", lambda p: rows(p) + 1, "refuse",
             "rows", lambda p: rows(p) + 1,
             "the query offsets' last entry past q's rows: the last request read past q",
             given=rows),
    Relation("query_start_loc_negative", "query_start_loc", lambda p: [-1] + qo_offsets(p)[1:],
             "refuse", "query_start_loc", None,
             "the query offsets' first entry negative: rows read before q"),
    Relation("query_start_loc_decreasing", "query_start_loc", decreasing_offsets, "refuse",
             "query_start_loc", None,
             "query offsets that decrease: a request of negative length", ops=("batch_decode",)),
    Relation("last_page_len_zero", "last_page_len", 0, "refuse", "last_page_len", None,
             "a request with pages whose last holds no token"),
    Relation("last_page_len_past", "last_page_len", lambda p: p["page_size"] + 1, "refuse",
             "last_page_len", None, "a last page holding more tokens than a page"),
    # each stated maximum against the lengths, below and above
    Relation("max_seqlen_q_below", "max_seqlen_q", lambda p: max(p["qo_lens"]) - 1, "refuse",
             "max_seqlen_q", lambda p: max(p["qo_lens"]),
             "a stated maximum query length below the longest request's"),
    Relation("max_seqlen_q_above", "max_seqlen_q", lambda p: max(p["qo_lens"]) + 5, "match",
             "", None, "a stated maximum above every length is a bound, not a length: valid"),
    Relation("max_seqlen_k_below", "max_seqlen_k", lambda p: max(p["kv_lens"]) - 1, "refuse",
             "max_seqlen_k", lambda p: max(p["kv_lens"]),
             "a stated maximum kv length below the longest request's"),
    # the plan handle from another plan: the run of one batch handed the metadata call's
    # result for another (the same requests regrouped, restage.first_batch). As the
    # restaged class: compute the run's batch (its tensors say it) or refuse naming it.
    Relation("plan_handle_other_batch", "plan_handle", "other_batch", "match_or_refuse",
             "plan_handle", None,
             "the run handed a plan made for another batch (its requests regrouped)",
             ops=_PAGED),
    # the plan handle damaged: what the metadata call returned, cut short or zeroed. The
    # run's own tensors still define the answer (the handle is a schedule, not the data):
    # compute it, or refuse naming the handle; a read past a short handle is a crash.
    Relation("plan_handle_truncated", "plan_handle", "truncated", "match_or_refuse",
             "plan_handle", None,
             "the run handed the metadata call's handle cut to half its entries", ops=_PAGED),
    Relation("plan_handle_zeroed", "plan_handle", "zeroed", "match_or_refuse", "plan_handle",
             None, "the run handed the metadata call's handle zeroed", ops=_PAGED),
    # each scalar the metadata call reads against the run's: the metadata call told the
    # other causal flag / another window. As the plan handle: compute what the run is
    # handed (its own flag and window: the reference's) or refuse naming the field.
    Relation("causal", "causal", lambda p: not p["causal"], "match_or_refuse", "causal",
             None, "the metadata call told the other causal flag than the run: a schedule "
             "made for one mask, run with the other", ops=_PAGED),
    Relation("window", "window", lambda p: 8 if p["window_left"] < 0 else -1,
             "match_or_refuse", "window", None,
             "the metadata call told another sliding window than the run (one where the run "
             "has none, or none where it has one)", ops=_PAGED),
    Relation("max_seqlen_k_above", "max_seqlen_k", lambda p: max(p["kv_lens"]) + 5, "match",
             "", None, "a stated maximum above every length is a bound: valid"),
)
BY_VARIANT = {r.variant: r for r in RELATIONS}


def refuse_words(r: Relation, p, value) -> tuple:
    """The words a refusal of relation r on params p must name: the field, the planned
    value where there is one, and the value given (a list: its first entry that breaks)."""
    if r.expect == "match_or_refuse" or r.field == "plan_handle":
        return (r.word,)               # a refusal names the field (a handle has no value)
    if r.expect != "refuse":
        return ()
    if r.given is not None:
        value = r.given(p)
    given = TORCH_NAME[value] if r.field == "dtype" else value
    if isinstance(given, list):
        given = _breaking_entry(r, p, given)
    return (r.word,) + ((str(r.planned(p)),) if r.planned is not None else ()) + (str(given),)


def _breaking_entry(r, p, offsets):
    if offsets and offsets[0] < 0:
        return offsets[0]
    for a, b in zip(offsets, offsets[1:]):
        if b < a:
            return b
    return offsets[-1]


# ---- one input, one contract --------------------------------------------------------------

# Broken relations the run's own arguments resolve: the metadata call was told another
# causal flag or window, but the run is handed its own, so its input has one answer (compute
# it, or refuse naming the field): match_or_refuse. Any other broken relation: refuse.
RUN_DEFINED = frozenset({"scalar.causal", "scalar.window"})


def contract_of(broken: frozenset) -> str:
    """The contract an input that breaks `broken` (violations()) carries."""
    if not broken:
        return "match"
    return "match_or_refuse" if broken <= RUN_DEFINED else "refuse"


def violations(v: dict) -> frozenset:
    """The relations the arguments a call is handed break.

    v: plain values, each key optional (a key absent is a relation not checked):
      q_rows, q_heads, q_dim, q_rank, q_dtype      the query tensor as handed
      num_qo_heads, num_kv_heads, head_dim, dtype  what the description states
      k_heads, v_heads, v_dim, kv_rows_k, kv_rows_v  the key/value (cache) tensors as handed
      head_dim_vo, page_size_stated, page_size_held
      batch_size                                   the requests stated
      qo_offsets, kv_offsets                       offset lists
      kv_lens, block_table, num_blocks, block_size per-request lengths, the table, the pool
      last_page_len                                per-request last-page lengths
      max_seqlen_q, max_seqlen_k                   stated maxima
      causal_planned, causal_run, window_planned, window_run  scalars both calls read
    """
    out = set()
    g = v.get

    def differ(a, b, name):
        if a in v and b in v and v[a] != v[b]:
            out.add(name)
    differ("q_heads", "num_qo_heads", "count.q_heads")
    differ("k_heads", "num_kv_heads", "count.kv_heads")
    differ("v_heads", "num_kv_heads", "count.kv_heads")
    differ("q_dim", "head_dim", "dim.q")
    differ("v_dim", "head_dim_vo", "dim.v")
    differ("q_dtype", "dtype", "dtype.q")
    differ("page_size_held", "page_size_stated", "count.page_size")
    differ("causal_planned", "causal_run", "scalar.causal")
    differ("window_planned", "window_run", "scalar.window")
    if "q_rank" in v and v["q_rank"] != 3:
        out.add("rank.q")
    qo = g("qo_offsets")
    if qo is not None:
        if qo and qo[0] < 0:
            out.add("offsets.first")
        if any(b < a for a, b in zip(qo, qo[1:])):
            out.add("offsets.monotone")
        if "q_rows" in v and qo and qo[-1] > v["q_rows"]:
            out.add("offsets.last_past_rows")
        if "batch_size" in v and len(qo) != v["batch_size"] + 1:
            out.add("count.batch")
    kvo = g("kv_offsets")
    if kvo is not None:
        for side in ("kv_rows_k", "kv_rows_v"):
            if side in v and kvo and kvo[-1] > v[side]:
                out.add("offsets.kv_last_past_rows")
    lens = g("kv_lens")
    if lens is not None:
        if "batch_size" in v and len(lens) != v["batch_size"]:
            out.add("count.batch")
        if any(n < 0 for n in lens):
            out.add("lengths.negative")
        table, bs = g("block_table"), g("block_size")
        if table is not None and bs:
            for n, row in zip(lens, table):
                if n > len(row) * bs:
                    out.add("lengths.past_table")
        if g("max_seqlen_k") is not None and lens and g("max_seqlen_k") < max(lens):
            out.add("maxima.kv")
    if g("max_seqlen_q") is not None and qo and len(qo) > 1:
        if g("max_seqlen_q") < max(b - a for a, b in zip(qo, qo[1:])):
            out.add("maxima.q")
    table, pool = g("block_table"), g("num_blocks")
    if table is not None and pool is not None:
        bs = g("block_size") or 1
        for i, row in enumerate(table):
            used = row
            if lens is not None and i < len(lens):
                used = row[:max(0, -(-max(0, lens[i]) // bs))]
            if any(b < 0 for b in used):
                out.add("index.negative")
            if any(b >= pool for b in used):
                out.add("index.past_pool")
    lp, bs = g("last_page_len"), g("page_size_stated")
    if lp is not None and bs:
        if any(not 1 <= n <= bs for n in lp):
            out.add("lengths.last_page")
    return frozenset(out)
