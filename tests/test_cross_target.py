"""The cross-target view: tables of several targets (and arches) side by side."""
from __future__ import annotations

import json

import pandas as pd

from reports.cross import cross_target
from reports.html import render_html
from test_reports import parse, row


def target_row(target, route, variant, outcome, ok, family="strided", tag="bf16-d128",
               arch="sm90", **kw):
    return row(f"{route}/{family}.{variant}/{tag}", outcome, ok, arch=arch, route=route,
               family=family, target=target, target_version={"bundled": "0.1.0",
                                                             "torch-sdpa": "2.5.1",
                                                             "flashinfer": "0.2.3"}[target],
               severity="" if ok else kw.pop("severity", "correctness"), **kw)


def three_targets() -> pd.DataFrame:
    """bundled, torch-sdpa and flashinfer rows; three cases shared, one bundled only."""
    rows = [
        # Shared by all three: bundled computes a wrong answer, the others refuse.
        target_row("bundled", "fa2.single_prefill", "q_stride2", "wrong", False, max_abs_diff=2.0),
        target_row("torch-sdpa", "sdpa_math.single_prefill", "q_stride2", "refused", True),
        target_row("torch-sdpa", "sdpa_flash.single_prefill", "q_stride2", "refused", True),
        target_row("flashinfer", "fi_fa2.single_prefill", "q_stride2", "refused", True),
        # Shared by all three, the same everywhere (a skipped route is not a difference).
        target_row("bundled", "fa2.single_prefill", "grid", "match", True, family="valid"),
        target_row("torch-sdpa", "sdpa_math.single_prefill", "grid", "match", True,
                   family="valid"),
        target_row("torch-sdpa", "sdpa_flash.single_prefill", "grid", "skipped", True,
                   family="valid"),
        target_row("flashinfer", "fi_fa2.single_prefill", "grid", "match", True, family="valid"),
        # Shared by two: a refusal that does not name the field on flashinfer only.
        target_row("bundled", "fa2.batch_decode", "q12_over_kv8", "refused", True, family="gqa"),
        target_row("flashinfer", "fi_fa2.batch_decode", "q12_over_kv8", "refused", False,
                   family="gqa", severity="clarity", message="refusal does not name 'kv'"),
        # bundled only.
        target_row("bundled", "fa2.merge_state", "s_stride2", "match", True),
    ]
    return pd.DataFrame(rows)


def test_one_row_per_case_and_differences_marked():
    view = cross_target(three_targets())
    assert [c["name"] for c in view["columns"]] == ["bundled", "flashinfer", "torch-sdpa"]
    assert view["keyed_by"] == "operation and case"
    rows = {r["key"]: r for r in view["rows"]}
    assert set(rows) == {"single_prefill/strided.q_stride2/bf16-d128",
                         "single_prefill/valid.grid/bf16-d128",
                         "batch_decode/gqa.q12_over_kv8/bf16-d128",
                         "merge_state/strided.s_stride2/bf16-d128"}
    q = rows["single_prefill/strided.q_stride2/bf16-d128"]
    assert q["differs"] and q["severities"] == "correctness"
    assert [c["odd"] for c in q["cells"]] == [True, False, False]
    assert [e["route"] for e in q["cells"][2]["entries"]] == ["sdpa_flash.single_prefill",
                                                              "sdpa_math.single_prefill"]
    assert not rows["single_prefill/valid.grid/bf16-d128"]["differs"]
    gqa = rows["batch_decode/gqa.q12_over_kv8/bf16-d128"]
    # Two cells that disagree and no majority: the row differs, no cell is singled out.
    assert gqa["differs"] and [c["odd"] for c in gqa["cells"]] == [False, False, False]
    assert gqa["cells"][2]["empty"] and gqa["severities"] == "clarity"
    assert not rows["merge_state/strided.s_stride2/bf16-d128"]["differs"]
    assert view["n_differs"] == 2
    # Differing rows first.
    assert {r["key"] for r in view["rows"][:2]} == {q["key"], gqa["key"]}


def test_one_target_two_arches_keys_by_case_id():
    df = pd.DataFrame([
        target_row("bundled", "fa2.single_prefill", "q_stride2", "wrong", False, arch="gfx942"),
        target_row("bundled", "fa2.single_prefill", "q_stride2", "refused", True, arch="gfx950"),
        target_row("bundled", "fa2_tc.single_prefill", "q_stride2", "refused", True, arch="gfx950"),
    ])
    view = cross_target(df)
    assert view["keyed_by"] == "case id"
    assert [c["name"] for c in view["columns"]] == ["gfx942", "gfx950"]
    assert [r["key"] for r in view["rows"]] == ["fa2.single_prefill/strided.q_stride2/bf16-d128",
                                                "fa2_tc.single_prefill/strided.q_stride2/bf16-d128"]
    assert cross_target(df[df["arch"] == "gfx950"]) is None


def test_html_cross_target_section(tmp_path):
    dom = parse(render_html(three_targets(), tmp_path / "r.html").read_text())
    section = [e["id"] for e in dom if e["tag"] == "section"]
    assert section.index("classes") < section.index("cross-target")
    cols = [(e["data-target"], e["data-arch"]) for e in dom
            if e["tag"] == "th" and e.get("class") == "xt-col"]
    assert cols == [("bundled", "sm90"), ("flashinfer", "sm90"), ("torch-sdpa", "sm90")]
    trs = [e for e in dom if e["tag"] == "tr" and "xt-row" in e.get("class", "")]
    keys = [e["data-case-id"] for e in trs]
    assert len(keys) == len(set(keys)) == 4
    differs = {e["data-case-id"] for e in trs if "differs" in e["class"].split()}
    assert differs == {"single_prefill/strided.q_stride2/bf16-d128",
                       "batch_decode/gqa.q12_over_kv8/bf16-d128"}
    odd = [e for e in dom if e["tag"] == "td" and "odd" in e.get("class", "").split()]
    assert [(e["data-target"], e["data-outcome"]) for e in odd] == [("bundled", "wrong")]
    sdpa_cells = [e for e in dom if e["tag"] == "td" and e.get("data-target") == "torch-sdpa"
                  and "xt-slot" in e.get("class", "")]
    sdpa = sdpa_cells[keys.index("single_prefill/strided.q_stride2/bf16-d128")]
    assert sdpa_cells[keys.index("batch_decode/gqa.q12_over_kv8/bf16-d128")]["_text"].strip() == "—"
    assert "sdpa_flash: refused" in sdpa["_text"] and "sdpa_math: refused" in sdpa["_text"]
    gqa_cells = [e for e in dom if e["tag"] == "td" and "xt-slot" in e.get("class", "")][
        3 * keys.index("batch_decode/gqa.q12_over_kv8/bf16-d128"):][:3]
    assert [c["_text"].strip() for c in gqa_cells] == ["fa2: refused", "fi_fa2: refused ✗", "—"]
    options = {e["value"] for e in dom if e["tag"] == "option"}
    assert {"strided", "valid", "gqa", "correctness", "clarity", "passing"} <= options


def test_report_cli_with_three_tables_adds_the_cross_target_section(tmp_path, capsys):
    from reports.cli import main
    paths = []
    for target, part in three_targets().groupby("target"):
        path = tmp_path / f"{target}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part.to_dict("records")))
        paths.append(str(path))
    out = tmp_path / "x.html"
    assert main(["report", "--results", *paths, "--out", str(out), "--merge-different"]) == 0
    html = out.read_text()
    assert html.count('class="xt-row') == 4 and 'id="cross-target"' in html
    assert ("cross-target section (#cross-target) over 3 (target, arch) columns: bundled/sm90, "
            "flashinfer/sm90, torch-sdpa/sm90") in capsys.readouterr().out
    single = tmp_path / "one.html"
    assert main(["report", "--results", paths[0], "--out", str(single)]) == 0
    assert 'id="cross-target"' not in single.read_text()
