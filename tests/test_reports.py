"""Reports from hand-built tables: HTML content, Markdown limits, base-vs-head compare."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from reports import repro_command
from reports.compare import by_arch, compare
from reports.html import render_html
from reports.markdown import render_markdown


def row(case_id, outcome, ok, arch="gfx942", route="fa2.paged_prefill", family="strided", **kw):
    base = {
        "run_id": f"run-{arch}", "timestamp": "2026-01-01T00:00:00", "arch": arch,
        "platform": "host", "target": "bundled", "target_version": "0.1", "library_commit": "abc",
        "build_hash": "b1", "route": route, "family": family, "case_id": case_id,
        "params": json.dumps({"head_dim": 128, "batch_size": 2}), "expect": "match",
        "outcome": outcome, "pass": ok, "max_abs_diff": None, "n_wrong": None, "n_total": None,
        "first_bad_index": None, "message": "", "error_type": "", "stage": "run",
        "duration_s": 0.1, "reruns": 0, "flaky": False, "isolation": "xdist", "worker": "gw0",
    }
    base.update(kw)
    return base


def table(arch="gfx942"):
    return pd.DataFrame([
        row("fa2.paged_prefill/strided.q/bf16-d128", "match", True, arch),
        row("fa2.paged_prefill/strided.k/bf16-d128", "wrong", False, arch, max_abs_diff=1.22,
            n_wrong=7503, n_total=8192, first_bad_index="[0, 3, 1]", message="max |diff| 1.22"),
        row("fa2.batch_decode/gqa.h12x8/bf16-d128", "silent", False, arch, route="fa2.batch_decode",
            family="gqa", expect="refuse", disable_guards="gqa_divisible"),
        row("fa2.batch_decode/gqa.h16x8/bf16-d128", "refused", True, arch, route="fa2.batch_decode",
            family="gqa", expect="match_or_refuse"),
        row("ll4mi.batch_decode/small_head.d32/bf16", "crash", False, arch, route="ll4mi.batch_decode",
            family="small_head", message="SIGFPE", error_type="signal", stage="run"),
    ])


def test_repro_command_carries_target_and_guards():
    r = row("a/b.c'd", "wrong", False, target="torch-sdpa", disable_guards="x,y")
    assert repro_command(r) == ("python -m harness repro 'a/b.c'\"'\"'d' --target 'torch-sdpa' "
                                "--disable-guards x,y")
    assert repro_command(row("a/b.c", "wrong", False)) == "python -m harness repro 'a/b.c'"


def test_html_is_self_contained_with_matrix_and_drilldown(tmp_path):
    path = render_html(table(), tmp_path / "r.html")
    html = path.read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert 'data-route="fa2.batch_decode" data-family="gqa"' in html
    assert "data-count-silent=\"1\"" in html and "data-count-refused=\"1\"" in html
    assert "python -m harness repro &#39;fa2.batch_decode/gqa.h12x8/bf16-d128&#39; " \
           "--disable-guards gqa_divisible" in html
    assert "7503/8192" in html and "[0, 3, 1]" in html and "SIGFPE" in html
    assert html.count('class="failure"') == 3
    assert 'id="arches"' not in html


def test_html_arch_columns_and_base_view(tmp_path):
    head = pd.concat([table("gfx942"), table("gfx950")], ignore_index=True)
    head.loc[(head.arch == "gfx950") & (head.outcome == "crash"), ["outcome", "pass"]] = ["match", True]
    html = render_html(head, tmp_path / "r.html", base_df=head).read_text()
    assert '<th>gfx942</th><th>gfx950</th>' in html
    assert 'data-arch="gfx950" data-outcome="match"' in html
    assert 'data-regression="0"' in html


def test_compare_classifies_regression_fix_new_removed():
    base = pd.DataFrame([row("a", "match", True), row("b", "wrong", False), row("d", "match", True),
                         row("e", "wrong", False)])
    head = pd.DataFrame([row("a", "crash", False), row("b", "match", True), row("c", "silent", False),
                         row("e", "crash", False)])
    changes = compare(base, head).set_index("case_id")["change"].to_dict()
    assert changes == {"a": "regression", "b": "fix", "c": "new", "d": "removed", "e": "changed"}


def test_compare_keys_by_arch_when_tables_span_arches():
    base = pd.DataFrame([row("a", "match", True, "gfx942"), row("a", "match", True, "gfx950")])
    head = pd.DataFrame([row("a", "match", True, "gfx942"), row("a", "wrong", False, "gfx950")])
    changes = compare(base, head)
    assert changes.set_index("arch")["change"].to_dict() == {"gfx950": "regression",
                                                             "gfx942": "unchanged"}


def test_by_arch_outcome_per_arch():
    merged = pd.concat([table("gfx942"), table("gfx950").iloc[:2]], ignore_index=True)
    t = by_arch(merged).set_index("case_id")
    assert t.loc["ll4mi.batch_decode/small_head.d32/bf16", "outcome:gfx942"] == "crash"
    assert pd.isna(t.loc["ll4mi.batch_decode/small_head.d32/bf16", "outcome:gfx950"])
    assert t.loc["fa2.paged_prefill/strided.k/bf16-d128", "wrong:gfx950"] == "7503/8192"


def test_markdown_failures_first_and_regressions():
    base = table()
    head = table()
    head.loc[0, ["outcome", "pass", "max_abs_diff"]] = ["wrong", False, 0.98]
    md = render_markdown(head, base)
    assert md.index("Regressions") < md.index("### Failures") < md.index("Route × outcome")
    assert md.index("### Failures") < md.index("### All cases")
    all_cases = md[md.index("### All cases"):]
    assert all_cases.index("crash") < all_cases.index("| refused")


def test_markdown_stays_under_limit_with_20000_rows():
    rows = [row(f"fa2.paged_prefill/strided.v{i}/bf16-d128-p16-with-a-long-tail", "match", True)
            for i in range(19_000)]
    rows += [row(f"fa2.batch_decode/gqa.h{i}/bf16", "wrong", False, route="fa2.batch_decode",
                 max_abs_diff=0.5, n_wrong=3, n_total=10, message="m" * 200) for i in range(1_000)]
    md = render_markdown(pd.DataFrame(rows))
    assert len(md) < 65_000
    assert "rows left out" in md and "Left out:" in md
    assert md.index("### Failures: 1000") < md.index("gqa.h0/")


def test_report_and_compare_cli(tmp_path, capsys):
    from reports.cli import main
    base, head = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    rows = table().to_dict("records")
    base.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[0].update(outcome="wrong", max_abs_diff=0.5)
    rows[0]["pass"] = False
    head.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, md = tmp_path / "out" / "r.html", tmp_path / "r.md"
    assert main(["report", "--results", str(head), "--out", str(out), "--markdown", str(md),
                 "--disable-guards", "g1"]) == 0
    assert "--disable-guards g1" in out.read_text() and "### Failures: 4" in md.read_text()
    assert main(["report", "--results", str(head), "--out", str(out),
                 "--fail-on-failures"]) == 1
    assert main(["compare", "--base", str(base), "--head", str(base)]) == 0
    assert main(["compare", "--base", str(base), "--head", str(head)]) == 1
    assert "regression fa2.paged_prefill/strided.q/bf16-d128: match -> wrong" in \
        " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv,words", [
    (["report", "--results", "{missing}"], ["--results", "{missing}"]),
    (["report", "--results", "{good}", "--base", "{corrupt}"], ["--base", "{corrupt}", ":1:"]),
    (["compare", "--base", "{missing}", "--head", "{good}"], ["--base", "{missing}"]),
    (["compare", "--base", "{good}", "--head", "{corrupt}"], ["--head", "{corrupt}", ":1:"]),
], ids=["report-missing", "report-corrupt-base", "compare-missing", "compare-corrupt"])
def test_report_and_compare_name_the_option_and_file_of_a_bad_table(argv, words, tmp_path,
                                                                      capsys):
    # Exit 2: compare's exit 1 means a regression, which a missing table is not.
    from harness.cli import main
    files = {"missing": str(tmp_path / "missing.jsonl"), "good": str(tmp_path / "good.jsonl"),
             "corrupt": str(tmp_path / "corrupt.jsonl")}
    (tmp_path / "good.jsonl").write_text(json.dumps(row("a", "match", True)) + "\n")
    (tmp_path / "corrupt.jsonl").write_text("not json\n")
    with pytest.raises(SystemExit) as exit_:
        main([a.format(**files) for a in argv] + ["--out", str(tmp_path / "r.html")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word.format(**files) in err, err
