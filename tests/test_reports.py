"""Reports from hand-built tables: HTML content, Markdown limits, base-vs-head compare."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

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
        "duration_s": 0.1, "reruns": 0, "flaky": False, "isolation": "", "worker": "gw0",
    }
    base.update(kw)
    return base


class Elements(HTMLParser):
    """Every element's tag and attributes, with the text directly inside it, in document order."""

    def __init__(self):
        super().__init__()
        self.found: list[dict] = []
        self._stack: list[dict] = []

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, **{k: v for k, v in attrs}, "_text": ""}
        self.found.append(el)
        if tag not in ("br", "meta", "input", "link", "img", "hr"):
            self._stack.append(el)

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for el in self._stack:
            el["_text"] += data


def parse(dom: str) -> list[dict]:
    p = Elements()
    p.feed(dom)
    return p.found


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
    assert repro_command(r) == ("harness repro 'a/b.c'\"'\"'d' --target torch-sdpa "
                                "--disable-guards x,y")
    assert repro_command(row("a/b.c", "wrong", False)) == "harness repro a/b.c"


def test_html_is_self_contained_with_matrix_and_drilldown(tmp_path):
    path = render_html(table(), tmp_path / "r.html")
    html = path.read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert 'data-route="fa2.batch_decode" data-family="gqa"' in html
    assert "data-count-silent=\"1\"" in html and "data-count-refused=\"1\"" in html
    assert "harness repro fa2.batch_decode/gqa.h12x8/bf16-d128 " \
           "--disable-guards gqa_divisible" in html
    assert "7503/8192" in html and "[0, 3, 1]" in html and "SIGFPE" in html
    assert html.count('class="failure"') == 3
    assert 'id="cross-target"' not in html


def test_html_arch_columns_and_base_view(tmp_path):
    head = pd.concat([table("gfx942"), table("gfx950")], ignore_index=True)
    head.loc[(head.arch == "gfx950") & (head.outcome == "crash"), ["outcome", "pass"]] = ["match", True]
    html = render_html(head, tmp_path / "r.html", base_df=head).read_text()
    cols = re.findall(r'<th class="xt-col" data-target="(\w+)" data-arch="(\w+)"', html)
    assert cols == [("bundled", "gfx942"), ("bundled", "gfx950")]
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
    # Variants named by letters, not numbers: 1000 causes (numbers alone would be one).
    letters = ["".join(chr(97 + int(d)) for d in f"{i:03d}") for i in range(1_000)]
    rows += [row(f"fa2.batch_decode/gqa.h{name}/bf16", "wrong", False, route="fa2.batch_decode",
                 max_abs_diff=0.5, n_wrong=3, n_total=10, message="m" * 200) for name in letters]
    md = render_markdown(pd.DataFrame(rows))
    assert len(md) < 65_000
    assert "rows left out" in md and "Left out:" in md
    assert md.index("### Failure classes: 1000 distinct causes") < md.index("### Failures: 1000") \
        < md.index("### All cases")


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


def guards_off_table():
    """A guards-off run: one defect on three routes, a crash on two, a clarity refusal."""
    common = dict(disable_guards="all", profile="host", repeat=2, severity="correctness")
    rows = [row(f"{route}/strided.out_stride2/bf16-d128-h4x2", "wrong", False, route=route,
                max_abs_diff=diff, tolerance=0.05, n_wrong=n, n_total=512,
                message=f"o max|diff| {diff} > tol 0.05, {n}/512 wrong, first at o(0, {n % 3}, 1)",
                **common)
            for route, diff, n in (("fa2.single_prefill", 1.5, 500), ("fa2.paged_prefill", 0.9, 17),
                                   ("ll4mi.batch_decode", float("inf"), 512))]
    rows += [row(f"{route}/gqa.kv0/bf16-d128-h8x0", "crash", False, route=route, family="gqa",
                 error_type="SIGFPE", message="worker died: SIGFPE during run", **common)
             for route in ("fa2.single_prefill", "fa2.batch_decode")]
    rows.append(row("fa2.batch_decode/gqa.q12_over_kv8/bf16-d128-h12x8", "refused", False,
                    route="fa2.batch_decode", family="gqa", **dict(common, severity="clarity"),
                    message="refusal does not name 'num_kv_heads' as a word: ValueError: bad"))
    rows += [row(f"fa2.single_prefill/strided.q{i}/bf16-d128", "match", True, max_abs_diff=d,
                 tolerance=0.05, disable_guards="all", profile="host", repeat=2, severity="")
             for i, d in enumerate((0.001, 0.04))]
    return pd.DataFrame(rows)


def test_html_opens_on_failure_classes_grouped_by_severity(tmp_path):
    dom = parse(render_html(guards_off_table(), tmp_path / "r.html").read_text())
    order = [e.get("id") for e in dom if e["tag"] in ("section", "header")]
    assert order[:2] == ["header", "classes"], order
    first_details = next(e for e in dom if e["tag"] == "details")
    assert first_details["class"] == "fclass"
    first_h2 = next(e for e in dom if e["tag"] == "h2")
    assert first_h2["_text"].startswith("Failure classes: 3")
    verdict = next(e for e in dom if e.get("id") == "verdict")
    assert verdict["_text"] == ("FAIL: 3 distinct causes (2 correctness, 1 clarity) across 6 "
                                "failing rows (of 8)")
    assert first_h2["_text"].startswith("Failure classes: 3 distinct causes")
    groups = [e["data-group"] for e in dom if e["tag"] == "h3" and "group" in e.get("class", "")]
    assert groups == ["correctness", "clarity"]
    classes = [e for e in dom if e["tag"] == "details" and e.get("class") == "fclass"]
    assert [(c["data-label"], c["data-outcome"], c["data-rows"], c["data-routes"]) for c in classes] \
        == [("gqa.kv0", "crash", "2", "2"), ("strided.out_stride2", "wrong", "3", "3"),
            ("gqa.q12_over_kv8", "refused", "1", "1")]
    # Each failing row appears once, inside its class.
    assert len([e for e in dom if e["tag"] == "details" and e.get("class") == "failure"]) == 6


def test_html_header_names_guards_profile_repeat_targets(tmp_path):
    df = guards_off_table()
    df.loc[0, "disable_guards"] = "gqa_divisible,strides"
    df.loc[7, "repeat"] = None      # a float column now; counts still read 2, not 2.0
    html = render_html(df, tmp_path / "r.html").read_text()
    assert html.count(", repeat 2, worker gw0") == 6 and "repeat 2.0" not in html
    dom = parse(html)
    facts = {e["id"]: e["_text"] for e in dom if e.get("id", "").startswith("fact-")}
    assert facts == {"fact-targets": "bundled 0.1", "fact-arches": "gfx942",
                     "fact-guards": "gqa_divisible, strides, all", "fact-profile": "host",
                     "fact-repeat": "2"}
    passing = render_html(table().assign(outcome="match", **{"pass": True}), tmp_path / "p.html")
    assert '<p id="verdict" class="verdict pass" data-failing="0">PASS: 5 rows, 0 failing</p>' \
        in passing.read_text()


def test_crash_rows_show_their_signal_collapsed(tmp_path):
    dom = parse(render_html(guards_off_table(), tmp_path / "r.html").read_text())
    crashes = [e for e in dom if e["tag"] == "details" and e.get("data-outcome") == "crash"]
    assert {c.get("data-signal") for c in crashes} == {"SIGFPE", None}   # rows, and their class
    summaries = [e for e in dom if e["tag"] == "summary" and "crash" in e["_text"]]
    assert summaries and all("SIGFPE" in s["_text"].split() for s in summaries)
    sig = [e for e in dom if e["tag"] == "span" and e.get("class") == "sig"]
    assert len(sig) == 3 and {s["_text"] for s in sig} == {"SIGFPE"}


def test_error_chart_puts_wrong_rows_over_the_tolerance_line(tmp_path):
    df = guards_off_table()
    dom = parse(render_html(df, tmp_path / "r.html").read_text())
    chart = next(e for e in dom if e["tag"] == "svg" and e.get("data-family") == "strided")
    assert chart["data-points"] == "5"      # 3 wrong + 2 passing; the crash rows have no numbers
    assert not any(e["tag"] == "svg" and e.get("data-family") == "gqa" for e in dom)
    line = float(next(e for e in dom if e["tag"] == "line" and e.get("class") == "tol")["data-y"])
    dots = {e["data-case-id"]: (float(e["cy"]), float(e["data-ratio"])) for e in dom
            if e["tag"] == "circle" and "strided" in e.get("data-case-id", "")}
    wrong = dots["fa2.single_prefill/strided.out_stride2/bf16-d128-h4x2"]
    inf = dots["ll4mi.batch_decode/strided.out_stride2/bf16-d128-h4x2"]
    near = dots["fa2.single_prefill/strided.q1/bf16-d128"]
    far = dots["fa2.single_prefill/strided.q0/bf16-d128"]
    assert (wrong[1], near[1], far[1]) == (pytest.approx(30), pytest.approx(0.8), pytest.approx(0.02))
    assert inf[0] < wrong[0] < line < near[0] < far[0]   # SVG y grows downward
    assert near[0] - line < 0.25 * (far[0] - line)        # a near miss hugs the line
    assert "3 above tolerance, 1 near misses (0.5–1×)" in " ".join(
        e["_text"] for e in dom if e["tag"] == "figcaption")


def test_recorded_error_ratio_wins_and_rows_without_numbers_are_left_out(tmp_path):
    df = pd.DataFrame([row("a/strided.x/t", "match", True, max_abs_diff=0.1, tolerance=1.0,
                           error_ratio=0.25),
                       row("b/strided.x/t", "match", True, max_abs_diff=None, tolerance=1.0),
                       row("c/strided.x/t", "match", True, max_abs_diff=0.2)])
    dom = parse(render_html(df, tmp_path / "r.html").read_text())
    dots = [e for e in dom if e["tag"] == "circle"]
    assert [(d["data-case-id"], d["data-ratio"]) for d in dots] == [("a/strided.x/t", "0.25")]
    assert "1 rows plotted, 2 without numbers left out" in " ".join(
        e["_text"] for e in dom if e["tag"] == "figcaption")
    empty = render_html(table(), tmp_path / "e.html").read_text()
    assert 'id="no-charts"' in empty and "<svg" not in empty


def test_nondeterministic_and_flaky_rows_are_shown(tmp_path):
    attempts = [{"outcome": "match", "pass": True, "max_abs_diff": 0.001},
                {"outcome": "wrong", "pass": False, "max_abs_diff": 0.7}]
    df = pd.concat([table(), pd.DataFrame([
        row("fa2.single_prefill/valid.a/bf16", "nondeterministic", False, attempts=attempts,
            severity="correctness", message="attempts disagree: attempt 1 match, attempt 2 wrong"),
        row("fa2.single_prefill/valid.b/bf16", "match", True, flaky=True, reruns=1)])],
        ignore_index=True)
    dom = parse(render_html(df, tmp_path / "r.html").read_text())
    unstable = {e["data-case-id"]: e for e in dom if e["tag"] == "tr" and e.get("class") == "unstable"}
    assert set(unstable) == {"fa2.single_prefill/valid.a/bf16", "fa2.single_prefill/valid.b/bf16"}
    assert re.search(r"match 0\.001\s*wrong 0\.7", unstable["fa2.single_prefill/valid.a/bf16"]["_text"])
    nondet = next(e for e in dom if e["tag"] == "details" and e.get("class") == "fclass"
                  and e["data-outcome"] == "nondeterministic")
    assert nondet["data-group"] == "correctness" and "2 attempts" in nondet["_text"]


def test_markdown_opens_on_failure_classes():
    md = render_markdown(guards_off_table())
    assert md.index("**FAIL: 3 distinct causes (2 correctness, 1 clarity)") \
        < md.index("### Failure classes: 3 distinct causes") \
        < md.index("### Failures: 6") < md.index("### All cases")
    classes = md[md.index("### Failure classes"):md.index("### Failures")]
    assert classes.count("`strided.out_stride2`") == 1
    assert "fa2.paged_prefill, fa2.single_prefill, ll4mi.batch_decode" in classes


# ---- o and lse apart; classes linked to their repro scripts -------------------------------

def lse_wrong_row(**kw):
    """lse wrong by 6.6 against its tolerance 0.001, o right: the row the old report showed as
    `max |diff| 6.6 (6.58e+03× tol)`, lse's diff beside o's tolerance."""
    return row("fa2.single_prefill/strided.lse_stride2/bf16", "wrong", False,
               route="fa2.single_prefill", max_abs_diff=6.6, tolerance=0.05, error_ratio=6600.0,
               o_max_abs_diff=0.01, o_tolerance=0.05, o_error_ratio=0.2,
               lse_max_abs_diff=6.6, lse_tolerance=0.001, lse_error_ratio=6600.0,
               n_wrong=3, n_total=520, severity="correctness",
               message="lse max|diff| 6.6 > tol 0.001, 3/520 wrong, first at lse(0, 1)", **kw)


def test_o_and_lse_are_shown_apart_each_against_its_own_tolerance(tmp_path):
    df = pd.DataFrame([lse_wrong_row()])
    html = render_html(df, tmp_path / "r.html").read_text()
    dom = parse(html)
    shown = {(e.get("data-output"), " ".join(e["_text"].split())) for e in dom
             if "odiff" in e.get("class", "")}
    assert ("o", "o max |diff| 0.01 (0.2× its tol)") in shown
    assert ("lse", "lse max |diff| 6.6 (6.6e+03× its tol)") in shown
    assert ("lse", "6.6 (tolerance 0.001, 6.6e+03×)") in shown
    assert ("o", "0.01 (tolerance 0.05, 0.2×)") in shown
    # Never lse's diff over o's tolerance, nor a ratio beside the max over both.
    assert "6.6 (6.6e+03× tol)" not in html and "(tolerance 0.05, 6.6e+03×)" not in html
    md = render_markdown(df)
    failures = md[md.index("### Failures"):md.index("### Route")]
    assert "o 0.01 (0.2× tol 0.05); lse 6.6 (6.6e+03× tol 0.001)" in failures
    from harness.results.junit import failure_text
    text = failure_text(df.iloc[0].to_dict(), "repro")
    assert "o: 0.01 (0.2× tol 0.05)" in text and "lse: 6.6 (6.6e+03× tol 0.001)" in text
    assert "\ntolerance:" not in text


def test_a_row_from_before_the_per_output_columns_shows_its_max_bare(tmp_path):
    old = {k: v for k, v in lse_wrong_row().items() if not k.startswith(("o_", "lse_"))}
    dom = parse(render_html(pd.DataFrame([old]), tmp_path / "r.html").read_text())
    (summary,) = [e for e in dom if e["tag"] == "summary" and "strided.lse_stride2/bf16" in
                  e["_text"]]
    assert "max |diff| 6.6" in summary["_text"] and "tol" not in summary["_text"]


def test_classes_link_to_their_repro_scripts(tmp_path):
    from harness.results.failure_classes import failure_classes
    from reports.cli import main
    df = guards_off_table()
    results = tmp_path / "t.jsonl"
    results.write_text("".join(json.dumps(r, allow_nan=True) + "\n"
                               for r in df.to_dict("records")))
    classes = failure_classes(df)
    repros = tmp_path / "repros"
    repros.mkdir()
    (repros / f"{classes[0].slug}.py").write_text("# a dummy repro\n")   # only the first class
    out, md = tmp_path / "out" / "r.html", tmp_path / "r.md"
    assert main(["report", "--results", str(results), "--out", str(out), "--markdown", str(md),
                 "--repros", str(repros)]) == 0
    dom = parse(out.read_text())
    links = [e for e in dom if e["tag"] == "a" and e.get("class") == "repro-script"]
    assert [e["href"] for e in links] == [f"../repros/{classes[0].slug}.py"]
    assert (out.parent / links[0]["href"]).is_file()
    fclass = [e for e in dom if e["tag"] == "details" and e.get("class") == "fclass"]
    assert [e["data-slug"] for e in fclass] == [c.slug for c in classes]
    text = md.read_text()
    assert f"[{classes[0].slug}.py](repros/{classes[0].slug}.py)" in text
    assert text.count("](repros/") == 1
    # Without --repros, no link and no script column.
    render_html(df, tmp_path / "plain.html")
    assert "repro-script" not in (tmp_path / "plain.html").read_text()
    assert "| script |" not in render_markdown(df)
