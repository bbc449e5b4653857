"""The valid, strided, misplanned and gqa families: well-formed data, full route coverage."""
from __future__ import annotations

import re
from collections import defaultdict

import pytest

from cases import generate, load_family
from cases.valid import PAGED_FORMS
from harness.model.case import EXPECTS
from harness.model.problem import normalize
from harness.model.routes import BUNDLED_ROUTES, op_of

FAMILIES = ("valid", "strided", "misplanned", "gqa")
# route / family.variant / tag: lower-case words, digits, '_', '-' (and '.' in the tag).
ID = re.compile(r"^[a-z0-9_]+\.[a-z_]+/[a-z]+\.[a-z0-9_]+/[a-z0-9_.-]+$")


@pytest.fixture(scope="module")
def all_cases():
    return generate(FAMILIES, BUNDLED_ROUTES)


def test_ids_unique_and_readable(all_cases):
    ids = [c.id for c in all_cases]
    assert len(ids) == len(set(ids))
    unreadable = [i for i in ids if not ID.match(i) or len(i) > 120]
    assert not unreadable, unreadable[:5]


def test_expectations_legal(all_cases):
    for c in all_cases:
        assert c.expect in EXPECTS, c.id
        if c.expect == "refuse":
            assert c.refuse_words, f"{c.id}: a refusal must name the field its message names"
        normalize(c.params)   # every case's params are a valid problem


@pytest.mark.parametrize("family", FAMILIES)
def test_family_covers_every_route_of_its_ops(family):
    module = load_family(family)
    by_route = defaultdict(int)
    for c in module.cases(BUNDLED_ROUTES):
        assert op_of(c.route) in module.OPS, c.id
        assert c.family == family
        by_route[c.route] += 1
    for route in BUNDLED_ROUTES:
        if op_of(route) in module.OPS:
            assert by_route[route] > 0, f"{family} yields nothing for {route}"


def test_valid_covers_every_route_and_factor(all_cases):
    valid = [c for c in all_cases if c.family == "valid"]
    assert {c.route for c in valid} == set(BUNDLED_ROUTES)
    # Only the head sizes outside the common ones may be refused.
    assert all(c.expect == "match" or c.variant.startswith("head_dim") for c in valid)
    levels = defaultdict(set)
    for c in valid:
        if c.variant.startswith(("group", "head_dim")):
            continue   # the sweeps: checked below
        p = c.params
        levels["dtype"].add(p["dtype"])
        levels["head_dim"].add(p["head_dim"])
        levels["ratio"].add(p["num_qo_heads"] // p["num_kv_heads"])
        levels["pair"].add((p["dtype"], p["head_dim"]))
        levels["mask"].add((p["causal"], p["window_left"] >= 0))
        if c.op == "paged_prefill":
            levels["paged"].add((p["page_size"], p["layout"], p["cache_form"]))
            levels["batch"].add(len(p["qo_lens"]))
            levels["order"].add(p["page_order"])
        levels["qo_len_1"].add(1 in p["qo_lens"])
        levels["split"].add("max_kv_chunk" in p)
        levels["past_64k"].add(p.get("page_id_offset", 0) >= 65536)
        levels["vo"].add(p.get("head_dim_vo", p["head_dim"]) != p["head_dim"])
    assert levels["dtype"] == {"fp16", "bf16", "fp32"}
    assert levels["head_dim"] == {32, 64, 128, 256}
    assert levels["ratio"] >= {1, 4, 8}
    assert len(levels["pair"]) == 12
    assert len(levels["mask"]) == 4
    assert levels["paged"] >= {(ps, lay, form) for ps, lay, form in PAGED_FORMS}
    assert levels["batch"] >= {1, 7, 64}
    assert levels["order"] == {"shuffled", "sequential"}
    for key in ("qo_len_1", "split", "past_64k", "vo"):
        assert levels[key] == {True, False}, key
    for route in BUNDLED_ROUTES:
        sweep = [c for c in valid if c.route == route and c.variant.startswith("group")]
        assert sorted(c.params["num_qo_heads"] // c.params["num_kv_heads"] for c in sweep) == \
            list(range(1, 17)), route
        sizes = {c.params["head_dim"]: c.expect for c in valid
                 if c.route == route and c.variant.startswith("head_dim")}
        assert sizes[48] == "match_or_refuse" and sizes[64] == sizes[256] == "match", route


def test_contracts_are_target_neutral(all_cases):
    # A strided view has a defined answer a library may not support: computing it right
    # or refusing it by name both pass, for every tensor. A mis-planned run() and a GQA
    # group that does not divide have no answer: they must be refused.
    for c in all_cases:
        if c.family == "strided":
            assert c.expect == "match_or_refuse" and c.refuse_words, c.id
        # (the valid relations: q padded past its offsets, a stated maximum above every length)
        if c.family == "misplanned" and c.variant not in ("q_rows_padded", "plan_rejected_first",
                                                          "max_seqlen_q_above",
                                                          "max_seqlen_k_above",
                                                          "plan_handle_other_batch",
                                                          "plan_handle_truncated",
                                                          "plan_handle_zeroed",
                                                          "causal", "window"):
            assert c.expect == "refuse", c.id
        # the run handed everything it needs (another plan's handle, its own causal flag or
        # window): compute what it is handed, or refuse naming the field
        if c.family == "misplanned" and (c.variant.startswith("plan_handle_")
                                         or c.variant in ("causal", "window")):
            assert c.expect == "match_or_refuse" and c.refuse_words, c.id
        if c.family == "gqa" and c.variant in ("q12_over_kv8", "q4_over_kv8", "kv0"):
            assert c.expect == "refuse" and "num_kv_heads" in c.refuse_words, c.id


def test_valid_sample_matches_on_host(all_cases):
    """The first valid case of every route, end to end through the bundled adapter."""
    from harness.engine.execute import execute_case
    from harness.targets import load_target

    target = load_target("bundled")
    firsts = {}
    for c in all_cases:
        if c.family == "valid" and c.route not in firsts:
            firsts[c.route] = c
    failures = []
    for c in firsts.values():
        r = execute_case(c, target, "cpu")
        if r.outcome != "match":
            failures.append(f"{c.id}: {r.outcome} {r.message}")
    assert not failures, failures


def test_every_param_key_is_declared_and_a_typo_fails_where_it_is_written():
    from harness.model.case import Case
    from harness.model.params import SCHEMA
    used = {k for c in generate() for k in c.params}
    assert used <= set(SCHEMA), used - set(SCHEMA)
    with pytest.raises(ValueError, match="'page_sise'.*unknown key"):
        Case("fa2.paged_prefill", "t", "typo", {"head_dim": 8, "num_qo_heads": 1,
                                               "qo_lens": [1], "kv_lens": [1], "page_sise": 16})
    with pytest.raises(ValueError, match=r"'causal'\] = 1: must be bool"):
        Case("fa2.single_prefill", "t", "type", {"head_dim": 8, "num_qo_heads": 1,
                                                "qo_lens": [1], "kv_lens": [1], "causal": 1})
