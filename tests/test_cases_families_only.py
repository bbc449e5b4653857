"""cases/ holds case families only: no test entry point, no backend name, one op table.

A family writes inputs against an op; where a route's kernel reaches other code for the
same op, the family asks the route's declared traits (harness/model/routes.py), so the
same family serves every target, and a new target's routes need no family edit.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cases
from cases import _tags
from cases._expect import expect
from cases._per_op import makers, per_route
from harness.model import routes as route_model
from harness.model.routes import OPS, TRAITS, RouteTraits, traits
from harness.targets.descriptors import bundled, flaggems, flashinfer

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "cases"


def backend_names() -> set[str]:
    """Every backend an in-tree route names: the bundled descriptor's, the torch-free
    descriptors' and the routes that declare traits."""
    routes = (*bundled.ROUTES, *flashinfer.ROUTES_FA2, *flashinfer.ROUTES_FA3,
              *flaggems.ROUTES, *TRAITS)
    return {r.split(".", 1)[0] for r in routes}


def family_sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(CASES.glob("*.py"))}


def test_backend_names_are_read_from_the_descriptors():
    names = backend_names()
    assert {"fa2", "fa2_tc", "aiter", "ll4mi", "vllm"} <= names, names


def test_no_family_names_a_backend():
    names = backend_names()
    found = [(f, node.lineno, node.value) for f, tree in family_sources().items()
             for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value in names]
    assert not found, f"backend names in cases/ (ask harness/model/routes.py traits): {found}"


def test_no_family_reads_a_backend_out_of_a_route():
    found = []
    for f, tree in family_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "backend":
                found.append((f, node.lineno, ".backend"))
            # route.split(".", 1)[0] or route.partition(".")[0]: the backend by another name
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) \
                    and isinstance(node.value.func, ast.Attribute) \
                    and node.value.func.attr in ("split", "partition") \
                    and isinstance(node.slice, ast.Constant) and node.slice.value == 0:
                found.append((f, node.lineno, node.value.func.attr))
    assert not found, found


def test_no_test_entry_point_in_cases():
    stray = sorted(p.name for p in CASES.iterdir()
                   if p.name == "conftest.py" or (p.name.startswith("test_") and p.suffix == ".py"))
    assert not stray, stray


def by_op_assignments() -> list[tuple[str, int]]:
    out = []
    for path in [*CASES.glob("*.py"), *(ROOT / "harness").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            out += [(str(path.relative_to(ROOT)), node.lineno) for t in targets
                    if isinstance(t, ast.Name) and t.id == "_BY_OP"]
    return out


def test_the_per_op_table_is_defined_at_most_once():
    assert len(by_op_assignments()) <= 1, by_op_assignments()


def test_a_family_finds_its_generators_by_op_name():
    def _batch_decode(route):
        return route
    found = makers({"_batch_decode": _batch_decode, "_not_an_op": _batch_decode,
                    "_merge_state": "not callable"})
    assert found == {"batch_decode": _batch_decode}
    got = list(per_route(["x.single_prefill", "ll4mi.batch_decode", "y.batch_decode"],
                         {"_batch_decode": _batch_decode}))
    assert [(r, op) for r, op, _, _ in got] == [("ll4mi.batch_decode", "batch_decode"),
                                               ("y.batch_decode", "batch_decode")]
    assert got[0][3] == TRAITS["ll4mi.batch_decode"] and got[1][3] == RouteTraits()


def test_traits_are_declared_on_known_routes_and_default_elsewhere():
    for route in TRAITS:
        route_model.op_of(route)            # an unknown op would be a typo never asked
    assert traits("someone.batch_decode") == RouteTraits()
    assert not traits("ll4mi.batch_decode").decode_lse
    assert traits("aiter.batch_decode").lse_shadow_plan
    assert all(traits(f"vllm.{op}").eager_pools for op in OPS)
    with pytest.raises(ValueError):
        traits("fa2.no_such_op")


def test_a_route_that_declares_no_decode_lse_gets_cases_without_it():
    # The same scale case on a route whose kernel writes no LSE reaches that kernel (no
    # LSE asked for); on an undeclared route it asks for the LSE.
    def long_kv(route):
        return next(c for c in cases.generate(["scale"], routes=[route]) if c.variant == "long_kv")
    assert long_kv("someone.batch_decode").params["return_lse"] is True
    assert long_kv("ll4mi.batch_decode").params["return_lse"] is False


def test_a_route_whose_graph_plan_splits_gets_the_graph_value_cases():
    def graphs(route):
        return {c.variant for c in cases.generate(["values"], routes=[route])
                if c.params.get("use_cuda_graph")}
    assert graphs("fa2_tc.batch_decode") and not graphs("someone.batch_decode")


def test_a_route_with_eager_pools_gets_no_host_case_past_2_31():
    variants = {c.variant for c in cases.generate(["scale"], routes=["vllm.mixed_batch"])}
    others = {c.variant for c in cases.generate(["scale"], routes=["someone.mixed_batch"])}
    assert "offset_past_2_31_host" in others - variants


def test_an_unknown_tag_bit_is_an_error_not_a_shorter_id():
    params = {"dtype": "fp16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
              "qo_lens": [1, 2], "kv_lens": [3, 4], "page_size": 16, "return_lse": True}
    assert _tags.tag(params, "dims", "batch", "page", "lse", extra=("x", "")) == \
        "fp16-d64-h4x2-b2-p16-lse-x"
    with pytest.raises(KeyError, match="pgae"):
        _tags.tag(params, "pgae")


def test_the_contract_is_the_families():
    base = {"dtype": "fp16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [3], "kv_lens": [9]}
    assert expect("ragged_prefill", base) == ("match", ())
    assert expect("ragged_prefill", {**base, "num_qo_heads": 3}) == \
        ("refuse", ("num_qo_heads", "3", "num_kv_heads", "2"))
    assert expect("ragged_prefill", {**base, "num_kv_heads": 0}) == ("refuse", ("num_kv_heads", "0"))
    assert expect("ragged_prefill", {**base, "head_dim": 48}) == ("match_or_refuse", ())
    assert expect("mixed_batch", {**base, "strided": "q"}) == ("match_or_refuse", ("query",))
    # The family's own cases carry it (gqa's rows; valid's sweep of head sizes).
    for c in cases.generate(["gqa", "valid"], routes=["someone.single_prefill"]):
        assert expect(c.op, c.params) == (c.expect, c.refuse_words), c.id


def test_a_shrunk_contract_follows_the_rule_only_where_the_case_followed_it():
    from cases._expect import follow
    from harness.model.case import Case
    params = {"dtype": "bf16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
              "qo_lens": [9], "kv_lens": [9]}
    plain = Case(route="x.single_prefill", family="values", variant="v", params=params)
    # valid's rule: a head size outside the common ones may be refused.
    assert follow(plain, {**params, "head_dim": 16}) == ("match_or_refuse", ())
    assert follow(plain, {**params, "num_qo_heads": 3}) == \
        ("refuse", ("num_qo_heads", "3", "num_kv_heads", "2"))
    # A case whose family states its own contract keeps it.
    own = Case(route="x.single_prefill", family="features", variant="v", params=params,
               expect="refuse", refuse_words=("sinks",))
    assert follow(own, {**params, "head_dim": 16}) == ("refuse", ("sinks",))
