"""The contract of a case, what it must do: (expect, refusal words) from its op and params
alone, by the families' rules. Families write their cases' contracts with it, explore's
strategies judge every drawn case with it (harness/tools/strategies.py) and shrink gives a
shrunk case the contract of its new params with it (harness/tools/shrink.py), so a family
case, a drawn one and a shrunk one with the same params expect the same.

  misplanned  run() off its plan must be refused, naming the field, the planned value and
              the given one; q rows padded past the plan must match.
  gqa         a group that does not divide, or no kv heads, must be refused naming the counts.
  strided     a defined answer a library may not support: match or a refusal naming the
              tensor (under any name strided's WORDS gives it); int64 index tensors likewise.
  scale       k or v rows a token stride apart, the last past element 2^31 (k_far, v_far):
              each row is packed, a layout every library takes: match.
  graph_replan  partial_state without an lse: match or a refusal naming lse.
  valid, small_head  a head_dim outside valid's common ones: match or refuse.
  short_output  a caller's out or lse one row short of the answer: refuse, naming it.
  Everything else: match.

A family whose cases carry another contract (a scenario's, a malformed input's) says so
where it writes them. No torch here: families are imported where no library is.
"""
from __future__ import annotations

from typing import Any, Mapping

# scale's views whose packed rows lie a token stride apart (harness/model/params.py strided).
FAR_ROWS = ("k_far", "v_far")


def heads(hq: int, hkv: int) -> tuple[str, tuple[str, ...]]:
    """The GQA rule: a head count pair without a whole group must be refused, naming them."""
    if hkv == 0:
        return "refuse", ("num_kv_heads", "0")
    if hq % hkv:
        return "refuse", ("num_qo_heads", str(hq), "num_kv_heads", str(hkv))
    return "match", ()


def strided_words(op: str, tensor: str) -> tuple[str, ...]:
    """The names a refusal of a strided view of `tensor` may give it on `op`."""
    from cases import strided     # the family's tables (it imports this module)
    # A head-sliced q is still packed along head_dim: a refusal of it names q.
    named = "q" if tensor == "q_heads" else tensor
    return tuple(strided.WORDS_BY_OP.get(op, {}).get(named) or strided.WORDS.get(named, (named,)))


def expect(op: str, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(expect, refuse_words) of a case on `op` with these params."""
    from cases import graph_replan, misplanned, valid   # families import this module
    if params.get("mismatch"):
        r = misplanned.relation_of(op, params)
        return r.expect, tuple(misplanned.words_of(op, r, params))
    hq = params["num_qo_heads"]
    hkv = params.get("num_kv_heads")
    hkv = hq if hkv is None else hkv
    rule = heads(hq, hkv)
    if rule[0] != "match":
        return rule
    if params.get("short_output"):
        # No buffer that cannot hold the answer has a defined result: refuse, naming it.
        return "refuse", (params["short_output"],)
    if params.get("strided") in FAR_ROWS:
        return "match", ()
    if params.get("strided"):
        return "match_or_refuse", strided_words(op, params["strided"])
    if params.get("index_dtype"):
        return "match_or_refuse", tuple(sorted(params["index_dtype"]))
    if params.get("partial_state") and not params.get("return_lse"):
        row = next(r for r in graph_replan.ROWS if r[0] == "partial_state_without_lse")
        return row[7], tuple(row[8])
    d = params["head_dim"]
    vo = params.get("head_dim_vo")
    if any(x not in valid.COMMON_HEAD_DIMS for x in (d, d if vo is None else vo)):
        return "match_or_refuse", ()
    return "match", ()


def of_case(op: str, params: Mapping[str, Any]) -> dict:
    """expect() as Case's keyword arguments (expect=, refuse_words=)."""
    must, words = expect(op, params)
    return {"expect": must, "refuse_words": words}


def follow(case, params: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The contract of `case` moved to new params (shrink): expect()'s for them where the
    case's own contract is expect()'s for its params; a case whose family states another (a
    scenario's, a malformed input's, a cases file's own) keeps it."""
    try:
        if expect(case.op, case.params) != (case.expect, tuple(case.refuse_words)):
            return case.expect, tuple(case.refuse_words)
        return expect(case.op, params)
    except (KeyError, ValueError):   # params the families' rules do not read
        return case.expect, tuple(case.refuse_words)
