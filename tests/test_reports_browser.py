"""The HTML report as a browser sees it: headless Chromium's DOM after scripts ran.

Installs nothing: `make browser-deps` installs Debian's chromium.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pandas as pd
import pytest

from reports.html import render_html
from test_reports import parse, row, table

CHROMIUM = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")
pytestmark = [pytest.mark.system,   # a real browser renders every page here
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                                          "(make browser-deps installs it)")]


def dump_dom(path, tmp_path, fragment: str = "") -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
           path.resolve().as_uri() + (f"#{fragment}" if fragment else "")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def dom(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    head = pd.concat([table("gfx942"), table("gfx950")], ignore_index=True)
    head.loc[(head.arch == "gfx950") & (head.outcome == "crash"), ["outcome", "pass"]] = ["match", True]
    base = pd.concat([table("gfx942"), table("gfx950")], ignore_index=True)
    base.loc[base.outcome == "wrong", ["outcome", "pass"]] = ["match", True]
    path = render_html(head, tmp / "report.html", base_df=base)
    return parse(dump_dom(path, tmp))


def test_scripts_ran(dom):
    body = next(e for e in dom if e["tag"] == "body")
    assert body.get("data-ready") == "1"


def test_matrix_cells_and_counts(dom):
    cells = {(e["data-route"], e["data-family"]): e for e in dom
             if e["tag"] == "td" and "cell" in e.get("class", "")}
    # 3 routes x 3 families, occupied or not.
    assert len(cells) == 9
    strided = cells[("fa2.paged_prefill", "strided")]
    assert strided["data-total"] == "4" and strided["data-fail"] == "2"
    assert strided["data-count-wrong"] == "2" and strided["data-count-match"] == "2"
    assert strided["data-worst"] == "wrong" and "fail" in strided["class"]
    assert re.search(r"wrong\s*2", strided["_text"])
    ll4mi = cells[("ll4mi.batch_decode", "small_head")]
    assert ll4mi["data-count-crash"] == "1" and ll4mi["data-count-match"] == "1"
    empty = cells[("fa2.batch_decode", "strided")]
    assert empty["data-total"] == "0" and "empty" in empty["class"]


def test_summary_counts(dom):
    summary = next(e for e in dom if e.get("id") == "summary")
    assert (summary["data-total"], summary["data-pass"], summary["data-fail"]) == ("10", "5", "5")
    counts = {e["data-outcome"]: e["data-count"] for e in dom
              if e["tag"] == "span" and "count" in e.get("class", "").split()}
    assert counts["wrong"] == "2" and counts["silent"] == "2" and counts["crash"] == "1"
    assert counts["match"] == "3" and counts["hang"] == "0"


def test_failures_arch_columns_and_regressions(dom):
    failures = [e for e in dom if e["tag"] == "details" and "failure" in e.get("class", "")]
    assert len(failures) == 5
    crash = next(e for e in failures if e["data-outcome"] == "crash")
    assert crash["data-arch"] == "gfx942"
    assert "harness repro ll4mi.batch_decode/small_head.d32/bf16" in crash["_text"]
    per_arch = [e for e in dom if e["tag"] == "td" and e.get("data-arch") == "gfx950"
                and e.get("data-outcome")]
    assert {e["data-outcome"] for e in per_arch} >= {"match", "wrong", "silent"}
    regressions = [e for e in dom if e["tag"] == "tr" and e.get("data-change") == "regression"]
    assert len(regressions) == 2
    assert {e["data-case-id"] for e in regressions} == {"fa2.paged_prefill/strided.k/bf16-d128"}


Q = "single_prefill/strided.q_stride2/bf16-d128"
GRID = "single_prefill/valid.grid/bf16-d128"
GQA = "batch_decode/gqa.q12_over_kv8/bf16-d128"
MERGE = "merge_state/strided.s_stride2/bf16-d128"


@pytest.fixture(scope="module")
def cross_page(tmp_path_factory):
    from test_cross_target import three_targets
    tmp = tmp_path_factory.mktemp("cross")
    return render_html(three_targets(), tmp / "cross.html"), tmp


def shown_rows(dom) -> set[str]:
    return {e["data-case-id"] for e in dom if e["tag"] == "tr"
            and "xt-row" in e.get("class", "").split() and "hidden" not in e["class"].split()}


def test_cross_target_page_renders_every_case_once(cross_page):
    dom = parse(dump_dom(*cross_page))
    assert next(e for e in dom if e["tag"] == "body").get("data-ready") == "1"
    assert shown_rows(dom) == {Q, GRID, GQA, MERGE}
    shown = next(e for e in dom if e.get("id") == "xt-shown")
    assert shown["_text"] == "4 of 4 rows shown" and shown["data-shown"] == "4"
    odd = [e for e in dom if e["tag"] == "td" and "odd" in e.get("class", "").split()]
    assert [(e["data-target"], e["data-outcome"]) for e in odd] == [("bundled", "wrong")]


@pytest.mark.parametrize("fragment,expected", [
    ("family=strided", {Q, MERGE}),
    ("severity=clarity", {GQA}),
    ("severity=passing", {GRID, MERGE}),
    ("differs=1", {Q, GQA}),
    ("family=strided&severity=correctness", {Q}),
    ("family=gqa&severity=correctness", set()),
])
def test_cross_target_filter(cross_page, fragment, expected):
    dom = parse(dump_dom(*cross_page, fragment=fragment))
    assert shown_rows(dom) == expected
    shown = next(e for e in dom if e.get("id") == "xt-shown")
    assert shown["data-shown"] == str(len(expected))
