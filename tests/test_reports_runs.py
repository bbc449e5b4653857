"""Row anchors, the Markdown header, merging tables of different runs, and compare's scope."""
from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from reports.cli import main
from reports.html import render_html
from reports.markdown import render_markdown
from reports.rows import anchor
from test_report_hostile import hostile_frame
from test_reports import guards_off_table, parse, row, table

TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ------------------------------------------------------------------ 1. anchors

def test_anchor_is_a_safe_token_that_keeps_ids_apart():
    ids = ["a/b c", "a-b-c", "a/b/c", "<script>", '"\' x', "", "é/ü", "a" * 500]
    names = [anchor(i) for i in ids]
    assert len(set(names)) == len(names)
    assert all(TOKEN.match(n) and n.startswith("case-") and len(n) < 70 for n in names)
    assert anchor("fa2.paged_prefill/strided.q") == anchor("fa2.paged_prefill/strided.q")
    assert "fa2-paged-prefill-strided-q" in anchor("fa2.paged_prefill/strided.q")


def _rows_with_anchor(html: str) -> tuple[list[dict], list[dict]]:
    dom = parse(html)
    rows = [e for e in dom if "data-case-id" in e and e["tag"] in ("tr", "details")]
    links = [e for e in dom if e["tag"] == "a" and "self" in e.get("class", "").split()]
    return rows, links


@pytest.mark.parametrize("make", [table, guards_off_table, hostile_frame])
def test_every_html_row_has_a_unique_anchor_and_a_link_to_it(tmp_path, make):
    df = make()
    base = df.copy()
    base["pass"] = ~base["pass"].astype(bool)   # every row a change: the base view has rows too
    html = render_html(df, tmp_path / "r.html", base_df=base).read_text()
    rows, links = _rows_with_anchor(html)
    assert rows
    ids = [e["id"] for e in parse(html) if "id" in e]
    assert len(ids) == len(set(ids))
    hrefs = {e["href"] for e in links}
    for r in rows:
        assert TOKEN.match(r["id"]), r["id"]
        assert "#" + r["id"] in hrefs
    assert len(links) == len(rows)


def test_failing_rows_are_anchored_by_case_id_and_apart_per_arch(tmp_path):
    df = pd.concat([table("gfx942"), table("gfx950")], ignore_index=True)
    html = render_html(df, tmp_path / "r.html").read_text()
    failures = [e for e in parse(html) if e["tag"] == "details" and e.get("class") == "failure"]
    assert len(failures) == 6 and len({e["id"] for e in failures}) == 6
    one = render_html(table(), tmp_path / "one.html").read_text()
    wrong = [e for e in parse(one) if e.get("data-case-id") == "fa2.paged_prefill/strided.k/bf16-d128"
             and e["tag"] == "details"]
    assert wrong[0]["id"] == anchor("fa2.paged_prefill/strided.k/bf16-d128")


# ------------------------------------------------------------------ 2. markdown header

def test_markdown_header_names_target_commit_arch_guards_profile_repeat():
    md = render_markdown(guards_off_table())
    head = md.splitlines()[2]
    assert head == ("target: bundled · target version: 0.1 · library commit: abc · arch: gfx942"
                    " · guards off: all · profile: host · repeat: 2")
    mixed = pd.DataFrame([row("a", "match", True, profile="quick", repeat=1),
                          row("b", "wrong", False, disable_guards="g1,g2", target_version="0.2",
                              library_commit="def", profile="full", repeat=3)])
    head = render_markdown(mixed).splitlines()[2]
    assert "target version: 0.1, 0.2" in head and "library commit: abc, def" in head
    assert "guards on; guards off: g1, g2" in head and "profile: quick, full" in head
    assert "repeat: 1, 3" in head


def test_a_passing_runs_markdown_is_a_few_lines():
    rows = [row(f"fa2.paged_prefill/strided.v{i}/bf16", "match", True) for i in range(500)]
    md = render_markdown(pd.DataFrame(rows))
    lines = [line for line in md.splitlines() if line]
    assert len(lines) == 4, md
    assert "guards on" in lines[1] and lines[2].startswith("**PASS")
    assert lines[3].startswith("500 cases, 500 pass, 0 fail")
    assert "|" not in md and "### All cases" not in md
    failing = render_markdown(table())
    assert "### All cases" in failing


def test_the_markdown_header_of_a_hostile_table_stays_text():
    md = render_markdown(hostile_frame())
    head = md.splitlines()[2]
    assert "<script" not in head and "<img" not in head and "](" not in head


# ------------------------------------------------------------------ 3. merging different runs

def _two(tmp_path, **second):
    first = table().assign(disable_guards="")
    a = _write(tmp_path / "a.jsonl", first.to_dict("records"))
    other = first.assign(run_id="run-2", **second)
    b = _write(tmp_path / "b.jsonl", other.to_dict("records"))
    return a, b


@pytest.mark.parametrize("second,column", [
    ({"target": "torch-sdpa"}, "target"),
    ({"library_commit": "def"}, "library_commit"),
    ({"disable_guards": "all"}, "disable_guards"),
])
def test_report_refuses_to_merge_tables_of_different_runs(tmp_path, capsys, second, column):
    a, b = _two(tmp_path, **second)
    out = tmp_path / "r.html"
    # Exit 2, a usage error, as for a table that cannot be read.
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--results", a, b, "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and column in err[0] and "--merge-different" in err[0]
    assert not out.exists()


def test_report_merges_tables_of_one_run_on_two_arches(tmp_path):
    a = _write(tmp_path / "a.jsonl", table("gfx942").to_dict("records"))
    b = _write(tmp_path / "b.jsonl", table("gfx950").to_dict("records"))
    out = tmp_path / "r.html"
    assert main(["report", "--results", a, b, "--out", str(out)]) == 0
    assert 'id="groups"' not in out.read_text()


def test_merge_different_shows_each_group_side_by_side(tmp_path):
    a, b = _two(tmp_path, library_commit="def", outcome="match", **{"pass": True})
    out, md = tmp_path / "r.html", tmp_path / "r.md"
    from harness.cli import main as harness_main
    assert harness_main(["report", "--results", a, b, "--out", str(out), "--markdown", str(md),
                         "--merge-different"]) == 0
    dom = parse(out.read_text())
    cols = [e for e in dom if e.get("class") == "group-col"]
    assert [e["data-commit"] for e in cols] == ["abc", "def"]
    counts = {e["data-label"]: [c["_text"] for c in dom[dom.index(e) + 2:dom.index(e) + 4]]
              for e in dom if e.get("class") == "group-row"}
    # The same five cases in each table count once in each column, not once in all.
    assert counts["cases"] == ["5", "5"] and counts["fail"] == ["3", "0"]
    assert counts["match"] == ["1", "5"]
    text = md.read_text()
    assert "### Runs side by side: 2 groups" in text
    assert "| fail | 3 | 0 |" in text


# ------------------------------------------------------------------ 4. compare's scope

def test_compare_compares_shared_cases_and_says_what_it_left_out(tmp_path, capsys):
    rows = table().to_dict("records")
    base = _write(tmp_path / "base.jsonl", rows[:4])
    head_rows = [dict(r) for r in rows[1:]]
    head_rows.append(row("fa2.paged_prefill/strided.extra/bf16", "match", True))
    head_rows.append(row("fa2.paged_prefill/strided.extra2/bf16", "wrong", False))
    head = _write(tmp_path / "head.jsonl", head_rows)
    assert main(["compare", "--base", base, "--head", head]) == 0
    out = capsys.readouterr().out
    assert "compare: left out 1 only in base, 3 only in head" in out
    assert "removed" not in out and "new" not in out
    assert "compare: 0 regression, 0 fix, 0 changed, 3 unchanged" in out
    assert out.count("\n") == 2
