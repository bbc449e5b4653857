"""Case reach ("production features"): the ci profile holds the inputs each route's schedule and
contracts switch on, so removing any of these cases fails here.

  each tensor on its own   k alone and v alone in every k/v mismatch; each merge state empty
                           alone; on every route, each input empty on its own in edge_rows
  schedule sizes           q rows over several prefill tiles, a caller's split, the
                           workspace-fitting split (plan() doubles the chunk to fit), head_dim_vo
                           != head_dim_qk, on every route that takes the size
  offsets past 2^31        on every paged route in ci, in lazily allocated pools that the input
                           watch keeps off resident memory; on ragged prefill and the single
                           routes through k or v rows a token stride apart (far_rows)
  round three              a k/v pair's page size and cache dtype on k alone and v alone, pages
                           of 3, 12 and 24, workspaces one byte short of the need and exactly
                           it, empty merge states holding values, and the features x split
                           paths covering rule (every expressible pair meets two dtypes)
"""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from cases import generate
from cases.misplanned import APPLIES, ONLY
from cases.scale import element_offset
from cases.schedule import DEFAULT_CHUNK, TILE_ROWS, fitted_chunk, plan_bytes
from harness.model.problem import normalize
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.targets.block_table.batch import BlockBatch
from harness.targets.block_table.mismatch import perturb as perturb_block
from harness.targets.plan_run.merge import cut
from harness.targets.plan_run.mismatch import perturb, perturb_ragged
from kernels.build import detect

host_only = pytest.mark.skipif(detect()[0] != "host", reason="plans with the host library")
ROUTES_OF = defaultdict(list)
for _r in BUNDLED_ROUTES:
    ROUTES_OF[op_of(_r)].append(_r)


@pytest.fixture(scope="module")
def ci():
    return generate(None, BUNDLED_ROUTES, profile="ci")


def _by(ci, family):
    out = defaultdict(list)
    for c in ci:
        if c.family == family:
            out[c.route].append(c)
    return out


# ---------------------------------------------------------------- each tensor on its own

def test_every_kv_pair_mismatch_has_k_alone_and_v_alone(ci):
    by_route = _by(ci, "misplanned")
    pairs = {"num_kv_heads": ("num_kv_heads_k", "num_kv_heads_v"),
             "kv_rows": ("kv_rows_fewer_k", "kv_rows_fewer_v")}
    for op, fields in APPLIES.items():
        for route in ROUTES_OF[op]:
            got = {(c.variant, c.params["mismatch"].get("only"), c.params["dtype"])
                   for c in by_route[route] if "mismatch" in c.params}
            for field, (k_alone, v_alone) in pairs.items():
                if field not in fields:
                    continue
                for dtype in ("bf16", "fp16", "fp32"):
                    assert (k_alone, "k", dtype) in got, (route, k_alone, dtype)
                    assert (v_alone, "v", dtype) in got, (route, v_alone, dtype)
    for c in (c for cs in by_route.values() for c in cs if c.variant in ONLY):
        assert c.expect == "refuse" and c.refuse_words[0] in ("num_kv_heads", "kv_rows"), c.id
        assert c.params["mismatch"]["only"] == ONLY[c.variant], c.id


def _fake(mismatch, form="tuple"):
    return SimpleNamespace(mismatch=mismatch, params={"cache_form": form}, layout="NHD")


def test_only_moves_the_one_side():
    q = torch.zeros(5, 4, 8)
    k, v = torch.zeros(7, 2, 8), torch.ones(7, 2, 8)
    for only, moved in (("k", 0), ("v", 1)):
        got = perturb_ragged(_fake({"field": "num_kv_heads", "value": 1, "only": only}), q, k, v)
        assert [t.shape[1] for t in got[1:]] == [1 if i == moved else 2 for i in (0, 1)]
        got = perturb_ragged(_fake({"field": "kv_rows", "value": 6, "only": only}), q, k, v)
        assert [t.shape[0] for t in got[1:]] == [6 if i == moved else 7 for i in (0, 1)]
        cache = (torch.zeros(3, 16, 2, 8), torch.zeros(3, 16, 2, 8))
        _, got = perturb(_fake({"field": "num_kv_heads", "value": 1, "only": only}), q, cache)
        assert [t.shape[2] for t in got] == [1 if i == moved else 2 for i in (0, 1)]
    both = perturb_ragged(_fake({"field": "num_kv_heads", "value": 1}), q, k, v)
    assert [t.shape[1] for t in both[1:]] == [1, 1]
    batch = BlockBatch(query=q, key=k, value=v, query_start_loc=[0, 5], seq_lens=[7],
                       block_table=[[0]], slot_mapping=list(range(7)), num_blocks=2,
                       block_size=16, num_reqs=1, num_qo_heads=4, num_kv_heads=2, head_dim=8,
                       rows=5)
    out = perturb_block(batch, {"field": "num_kv_heads", "value": 1, "only": "v"})
    assert (out.key.shape[1], out.value.shape[1], out.num_kv_heads) == (2, 1, 2)


def test_each_merge_state_empty_alone(ci):
    by_route = _by(ci, "edge_rows")
    for route in ROUTES_OF["merge_state"]:
        for merge in ("out_of_place", "in_place"):
            mine = [c for c in by_route[route] if c.params.get("merge") == merge]
            for side in ("a", "b"):
                alone = [c for c in mine if c.params.get("merge_empty") == side
                         and all(k > 0 for k in c.params["kv_lens"])]
                assert alone, (route, merge, side)
                # The empty state is over no key, the other over every key of each request.
                for c in alone:
                    for k in c.params["kv_lens"]:
                        at = cut(c.params, k)
                        assert (at, k - at) == ((0, k) if side == "a" else (k, 0))
            assert any(c.params.get("merge_empty") and 0 in c.params["kv_lens"]
                       and any(c.params["kv_lens"]) for c in mine), (route, merge, "both")


def test_every_route_has_each_input_empty_alone(ci):
    by_route = _by(ci, "edge_rows")
    for route in BUNDLED_ROUTES:
        op = op_of(route)
        ps = [normalize(c.params) for c in by_route[route]]
        assert ps, route
        if op == "merge_state":
            continue           # the states: test_each_merge_state_empty_alone
        # kv empty with rows to write, kv empty in a batch with non-empty requests.
        assert any(all(k == 0 for k in p["kv_lens"]) and sum(p["qo_lens"]) for p in ps), route
        if len(ps[0]["qo_lens"]) > 1 or op not in ("single_prefill", "single_decode"):
            assert any(0 in p["kv_lens"] and any(p["kv_lens"]) for p in ps), route
        if op in ("single_prefill", "paged_prefill", "ragged_prefill"):
            # q empty alone: a request with no rows over a non-empty kv.
            assert any(q == 0 and k > 0 for p in ps for q, k in zip(p["qo_lens"], p["kv_lens"])), route
        if op == "mixed_batch":
            nd = [c.params["num_decodes"] for c in by_route[route]]
            def prefill_kv_empty(p, n):
                return any(q > 0 and k == 0 for q, k in
                           zip(p["qo_lens"][n:], p["kv_lens"][n:]))
            def decode_kv_empty(p, n):
                return 0 in p["kv_lens"][:n] and any(p["kv_lens"])
            assert any(prefill_kv_empty(p, n) for p, n in zip(ps, nd)), route
            assert any(decode_kv_empty(p, n) for p, n in zip(ps, nd)), route


# ---------------------------------------------------------------- schedule sizes

def _ops_with(ci, pred):
    return {c.route for c in ci if pred(c.params)}


def test_q_rows_over_several_tiles_on_every_prefill_route(ci):
    def several(p):
        qo = p["qo_lens"][p.get("num_decodes", 0):]
        return max([0, *qo]) > 2 * TILE_ROWS
    reached = _ops_with(ci, several)
    for op in ("single_prefill", "paged_prefill", "ragged_prefill", "mixed_batch",
               "merge_state"):
        for route in ROUTES_OF[op]:
            assert route in reached, route
    # And one just past a tile (the second tile holds one row).
    assert _ops_with(ci, lambda p: max(p["qo_lens"]) == TILE_ROWS + 1)


def test_caller_split_with_rows_over_tiles(ci):
    reached = _ops_with(ci, lambda p: p.get("max_kv_chunk") and max(p["qo_lens"]) > 2 * TILE_ROWS
                        and max(p["kv_lens"]) > p["max_kv_chunk"])
    for op in ("paged_prefill", "ragged_prefill"):
        for route in ROUTES_OF[op]:
            assert route in reached, route
    splits = _ops_with(ci, lambda p: p.get("max_kv_chunk") and max(p["kv_lens"]) > p["max_kv_chunk"])
    for op in ("paged_prefill", "ragged_prefill", "batch_decode"):
        for route in ROUTES_OF[op]:
            assert route in splits, route


def _ws_fit(c) -> bool:
    p = normalize(c.params)
    if "workspace_bytes" not in c.params or c.params.get("max_kv_chunk") or c.params.get("scenario"):
        return False
    ws, hq, dv = c.params["workspace_bytes"], p["num_qo_heads"], p["head_dim_vo"]
    default = plan_bytes(p["qo_lens"], p["kv_lens"], hq, dv, DEFAULT_CHUNK)
    chunk = fitted_chunk(p["qo_lens"], p["kv_lens"], hq, dv, ws)
    return default > ws and chunk > DEFAULT_CHUNK and \
        0 < plan_bytes(p["qo_lens"], p["kv_lens"], hq, dv, chunk) <= ws


def test_workspace_fitting_split_in_ci_on_every_planned_route(ci):
    fits = [c for c in ci if _ws_fit(c)]
    for op in ("paged_prefill", "ragged_prefill", "batch_decode"):
        for route in ROUTES_OF[op]:
            assert any(c.route == route for c in fits), route
    assert any(c.params.get("head_dim_vo") for c in fits)


@host_only
def test_the_library_plans_those_splits_as_computed(ci):
    """The bundled scheduler itself: the default chunk does not fit, the doubled one splits."""
    import kernels
    seen = set()
    for c in ci:
        if not _ws_fit(c):
            continue
        p = normalize(c.params)
        key = (tuple(p["qo_lens"]), tuple(p["kv_lens"]), p["num_qo_heads"], p["head_dim_vo"],
               c.params["workspace_bytes"])
        if key in seen:
            continue
        seen.add(key)
        ws = torch.empty(c.params["workspace_bytes"], dtype=torch.uint8)
        qo, kv = p["qo_lens"], p["kv_lens"]

        def plan(**kw):
            # The scheduler every batch wrapper shares (kernels/_plan.py), through the paged
            # prefill wrapper's plan(): decode rows are one a request.
            w = kernels.BatchPrefillWithPagedKVCacheWrapper(ws)
            pages = [-(-n // 16) for n in kv]
            indptr = torch.tensor([0, *torch.tensor(pages).cumsum(0).tolist()], dtype=torch.int32)
            last = torch.tensor([n - (m - 1) * 16 if m else 0 for n, m in zip(kv, pages)],
                                dtype=torch.int32)
            w.plan(torch.tensor([0, *torch.tensor(qo).cumsum(0).tolist()], dtype=torch.int32),
                   indptr, torch.arange(int(indptr[-1]), dtype=torch.int32), last,
                   p["num_qo_heads"], p["num_kv_heads"], p["head_dim"], 16,
                   head_dim_vo=p["head_dim_vo"], causal=False, **kw)
            return w.plan_info
        info = plan()
        assert info.split and info.chunk == fitted_chunk(qo, kv, p["num_qo_heads"],
                                                         p["head_dim_vo"], ws.numel()), c.id
        assert DEFAULT_CHUNK < info.chunk < max(kv), c.id
        with pytest.raises(ValueError, match="float_workspace_buffer"):
            plan(max_kv_chunk=DEFAULT_CHUNK)
    assert len(seen) >= 3


def test_head_dim_vo_on_every_route_that_takes_it(ci):
    reached = _ops_with(ci, lambda p: p.get("head_dim_vo") not in (None, p["head_dim"]))
    for op in ("single_prefill", "single_decode", "paged_prefill", "ragged_prefill",
               "merge_state"):
        for route in ROUTES_OF[op]:
            assert route in reached, route
    # With tiles and with a split on the batch prefills.
    for pred in (lambda p: max(p["qo_lens"]) > 2 * TILE_ROWS,
                 lambda p: p.get("max_kv_chunk")):
        got = _ops_with(ci, lambda p: p.get("head_dim_vo") not in (None, p["head_dim"]) and pred(p))
        for op in ("paged_prefill", "ragged_prefill"):
            for route in ROUTES_OF[op]:
                assert route in got, route


# ---------------------------------------------------------------- offsets past 2^31

PAGED_OPS = ("paged_prefill", "batch_decode", "mixed_batch")


def test_ci_has_element_offsets_past_2_31_on_every_paged_route(ci):
    from harness.targets.layout import page_ids
    past = [c for c in ci if c.params.get("page_id_offset")
            and element_offset(normalize(c.params) | c.params) > 2 ** 31]
    for op in PAGED_OPS:
        for route in ROUTES_OF[op]:
            mine = [c for c in past if c.route == route]
            assert mine, route
            for c in mine:
                p = c.params
                pages = sum(-(-k // p["page_size"]) for k in p["kv_lens"])
                stride = p["page_size"] * p["num_kv_heads"] * p["head_dim"]
                # Every page a request owns starts past 2^31 elements into its pool.
                assert min(page_ids(pages, "shuffled", p["page_id_offset"], c.seed)) * stride \
                    > 2 ** 31, c.id


def _rss_bytes() -> int:
    import os
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="Linux only")
def test_a_pool_past_2_31_stays_lazy_under_the_input_watch():
    """The ci cases' pools: the watch and its check keep them off resident memory, and still
    see a write anywhere in them (a requests' page and one no request owns)."""
    from harness.model.builders import Buffers
    from harness.model.problem import build_problem
    from harness.targets.layout import build_paged
    c = next(c for c in generate(["scale"], ["fa2.paged_prefill"], profile="ci")
             if c.variant == "offset_past_2_31_host")
    p = build_problem(c.params, c.seed)
    before = _rss_bytes()
    paged = build_paged(p, c.params["page_size"], "NHD", "shuffled",
                        c.params["page_id_offset"], c.seed)
    assert paged.k_pages.numel() > 2 ** 31
    b = Buffers("cpu")
    b.watch(paged.k_pages, "k_cache")
    b.watch(paged.v_pages, "v_cache")
    assert b.check() == []
    assert _rss_bytes() - before < (256 << 20)
    paged.v_pages[paged.k_pages.shape[0] // 3, 0, 0, 0] = 1.0        # a page no one owns
    paged.k_pages[paged.indices[0], 0, 0, 0] += 1.0                  # a request's page
    assert b.check() == ["input k_cache changed", "input v_cache changed"]


# ---------------------------------------------------------------- round three: crossings and boundaries

def test_pair_fields_move_k_alone_and_v_alone_on_every_route(ci):
    from cases.pair_fields import TORCH_NAME
    by_route = _by(ci, "pair_fields")
    for op, fields in (("paged_prefill", ("dtype", "page_size")), ("batch_decode",
                       ("dtype", "page_size")), ("ragged_prefill", ("dtype",))):
        for route in ROUTES_OF[op]:
            for field in fields:
                for side in ("k", "v"):
                    mine = [c for c in by_route[route] if c.params["mismatch"]["field"] == field
                            and c.params["mismatch"]["only"] == side]
                    assert len({c.params["dtype"] for c in mine}) >= 2, (route, field, side)
                    assert len({c.params["head_dim"] for c in mine}) >= 2, (route, field, side)
                    for c in mine:
                        given = c.params["mismatch"]["value"]
                        planned = c.params["page_size"] if field == "page_size" else \
                            c.params["dtype"]
                        assert given != planned and c.expect == "refuse", c.id
                        if field == "dtype":
                            # Never narrower than planned: a run that reads it as planned
                            # stays inside it.
                            width = {"fp16": 2, "bf16": 2, "fp32": 4}
                            assert width[given] >= width[planned], c.id
                            assert c.refuse_words == ("dtype", TORCH_NAME[planned],
                                                      TORCH_NAME[given])
                        else:
                            assert planned % given == 0, c.id     # the same pool, re-viewed


def _pow2(n):
    return n & (n - 1) == 0


def test_pages_that_are_not_powers_of_two_on_every_paged_route(ci):
    for op in ("paged_prefill", "batch_decode", "mixed_batch"):
        for route in ROUTES_OF[op]:
            odd = [c for c in ci if c.route == route and c.expect == "match"
                   and not _pow2(c.params.get("page_size", 16))]
            assert {c.params["page_size"] for c in odd} >= {3, 12, 24}, route
            # Requests over several pages, their last one partial.
            assert any(max(c.params["kv_lens"]) > 2 * c.params["page_size"]
                       and any(k % c.params["page_size"] for k in c.params["kv_lens"])
                       for c in odd), route


def test_workspaces_at_the_byte_boundary_on_every_split_route(ci):
    for op in ("paged_prefill", "ragged_prefill", "batch_decode"):
        for route in ROUTES_OF[op]:
            seen = set()
            for c in ci:
                if c.route != route or not c.variant.startswith("ws_edge_"):
                    continue
                p = normalize(c.params)
                chunk = c.params.get("max_kv_chunk") or DEFAULT_CHUNK
                need = plan_bytes(p["qo_lens"], p["kv_lens"], p["num_qo_heads"],
                                  p["head_dim_vo"], chunk)
                assert need > 0, c.id
                edge = {need: "exact", need - 1: "short"}[c.params["workspace_bytes"]]
                seen.add((edge, bool(c.params.get("max_kv_chunk")), p["dtype"]))
            for edge in ("exact", "short"):
                for caller in (False, True):
                    assert len({d for e, k, d in seen if (e, k) == (edge, caller)}) >= 2, \
                        (route, edge, caller)


def test_empty_states_that_hold_values_in_both_merges(ci):
    held = [c for c in ci if c.params.get("empty_state_values")]
    for merge in ("out_of_place", "in_place"):
        mine = [c for c in held if c.params["merge"] == merge]
        for side in ("a", "b"):
            # That state empty beside the other over all of a request's kv ...
            assert any(c.params["merge_empty"] == side and any(c.params["kv_lens"])
                       for c in mine), (merge, side)
        # ... and both empty (a kv_len 0 request), in every dtype.
        assert {c.params["dtype"] for c in mine if 0 in c.params["kv_lens"]} == \
            {"fp16", "bf16", "fp32"}, merge


def test_token_offsets_past_2_31_on_the_ragged_and_single_routes(ci):
    from harness.targets.layout import FAR_ROWS_PAST
    for op in ("ragged_prefill", "single_prefill", "single_decode"):
        for route in ROUTES_OF[op]:
            far = [c for c in ci if c.route == route and
                   str(c.params.get("strided", "")).endswith("_far")]
            assert {c.params["strided"] for c in far} == {"k_far", "v_far"}, route
            assert len({c.params["dtype"] for c in far}) == 2, route
            assert all(sum(c.params["kv_lens"]) > FAR_ROWS_PAST for c in far), route


def test_far_rows_sit_past_2_31_in_a_lazy_buffer():
    from harness.targets.layout import FAR_ROWS_PAST, far_rows
    t = torch.randn(9, 2, 8).to(torch.float16)
    before = _rss_bytes()
    v = far_rows(t)
    assert torch.equal(v, t) and v.stride()[1:] == (8, 1)
    assert (9 - FAR_ROWS_PAST) * v.stride(0) >= 2 ** 31 > (8 - FAR_ROWS_PAST) * v.stride(0)
    assert _rss_bytes() - before < (64 << 20)
    base = v.as_strided((v.stride(0) * 8 + 16,), (1,), 0)
    assert torch.isnan(base[16:32].float()).all()      # where a stride-ignoring read lands


# The factor levels a covering row's params show, read back from the params themselves.
def _cover_levels(c) -> dict:
    from cases.features import FEATURE_PARAMS
    p = normalize(c.params)
    feature = next(f for f, kw in FEATURE_PARAMS.items()
                   if all(c.params.get(k) == v for k, v in kw.items())
                   and set(requires(c.params)) - {"custom_mask"} == set(requires(kw)))
    split = ("graph" if c.params.get("use_cuda_graph") else "chunk" if
             c.params.get("max_kv_chunk") else "fitted" if c.params.get("workspace_bytes")
             else "none")
    dims = ("eq" if p["head_dim_vo"] == p["head_dim"] else
            "vo_lt_qk" if p["head_dim_vo"] < p["head_dim"] else "vo_gt_qk")
    return {"feature": feature, "split": split, "dims": dims,
            "window": "on" if p["window_left"] >= 0 else "off",
            "mask": "custom" if c.params.get("custom_mask") else "none",
            "rows": "tiles" if max(p["qo_lens"]) > 2 * TILE_ROWS else "one_tile"}


def requires(params):
    from cases.features import requires as feature_requires
    return feature_requires(params)


def test_features_cross_every_split_path_by_the_covering_rule(ci):
    """Every pair of levels an op's route can express meets two dtypes, read from the cases'
    params; and the split paths, head-dim relations and tiles really are what the levels say."""
    import itertools
    from cases.features import COVER_OPS, _levels
    for op in COVER_OPS:
        levels = {f: v for f, v in _levels(op).items() if f != "dtype"}
        for route in ROUTES_OF[op]:
            rows = [c for c in ci if c.route == route and c.variant.startswith("cover.")]
            met = defaultdict(set)
            for c in rows:
                lv = _cover_levels(c)
                for a, b in itertools.combinations(sorted(lv), 2):
                    met[(a, lv[a], b, lv[b])].add(c.params["dtype"])
                if lv["split"] == "fitted":
                    p = normalize(c.params)
                    assert plan_bytes(p["qo_lens"], p["kv_lens"], p["num_qo_heads"],
                                      p["head_dim_vo"], DEFAULT_CHUNK) > \
                        c.params["workspace_bytes"], c.id
                    # ... and the chunk plan() fits still splits the long request.
                    assert fitted_chunk(p["qo_lens"], p["kv_lens"], p["num_qo_heads"],
                                        p["head_dim_vo"], c.params["workspace_bytes"]) < \
                        max(p["kv_lens"]), c.id
                if lv["split"] == "chunk":
                    assert max(c.params["kv_lens"]) > 2 * c.params["max_kv_chunk"], c.id
            for a, b in itertools.combinations(sorted(levels), 2):
                for la in levels[a]:
                    for lb in levels[b]:
                        assert len(met[(a, la, b, lb)]) >= 2, (route, a, la, b, lb)


def test_a_new_feature_level_is_crossed_with_every_split_path(monkeypatch):
    from cases import features
    monkeypatch.setitem(features.COVER_FACTORS, "feature",
                        features.COVER_FACTORS["feature"] + ("new_feature",))
    features.covering_rows.cache_clear()
    try:
        rows = features.covering_rows("paged_prefill")
        for split in features.COVER_FACTORS["split"]:
            for dims in features.COVER_FACTORS["dims"]:
                assert any(r["feature"] == "new_feature" and r["split"] == split for r in rows)
                assert any(r["feature"] == "new_feature" and r["dims"] == dims for r in rows)
    finally:
        monkeypatch.undo()
        features.covering_rows.cache_clear()
