"""Failing rows grouped into failure classes, and the console text of them."""
from __future__ import annotations

import pandas as pd
import pytest

from harness.results.failure_classes import (classes_text, console_summary, failure_classes,
                                     normalize_message, variant_of, verdict)


def row(route, variant, outcome="wrong", ok=False, family="strided", tag="bf16-d128-h4x2",
        message="", severity="correctness", **kw):
    return {"route": route, "family": family, "case_id": f"{route}/{family}.{variant}/{tag}",
            "outcome": outcome, "pass": ok, "message": message,
            "severity": "" if ok else severity, "target": "bundled", **kw}


def wrong_msg(diff, n, total, index):
    return f"o max|diff| {diff} > tol 0.05, {n}/{total} wrong, first at o{index}"


def test_the_same_defect_on_three_routes_is_one_class():
    df = pd.DataFrame([
        row("fa2.single_prefill", "out_stride2", message=wrong_msg("inf", 6577, 6708, (0, 0, 1))),
        row("fa2.paged_prefill", "out_stride2", tag="bf16-d128-h4x2-p16-nhd",
            message=wrong_msg(1.66, 12, 8256, (1, 3, 0))),
        row("ll4mi.batch_decode", "out_stride2", tag="fp16-d64-h8x1",
            message=wrong_msg("1.5e-02", 3, 64, (0, 2, 7))),
        row("fa2.single_prefill", "q_stride2", outcome="match", ok=True),
    ])
    classes = failure_classes(df)
    assert len(classes) == 1
    (c,) = classes
    assert (c.label, c.outcome, c.severity, c.n_rows) == ("strided.out_stride2", "wrong",
                                                           "correctness", 3)
    assert c.routes == ["fa2.paged_prefill", "fa2.single_prefill", "ll4mi.batch_decode"]
    assert c.example == "fa2.paged_prefill/strided.out_stride2/bf16-d128-h4x2-p16-nhd"
    assert list(c.rows["case_id"]) == sorted(df["case_id"][:3])
    assert c.message == "o max|diff| <n> > tol <n>, <n>/<n> wrong, first at o<shape>"


def test_different_outcomes_severities_and_variants_are_different_classes():
    df = pd.DataFrame([
        row("fa2.single_prefill", "kv0", outcome="crash", family="gqa",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="hang", family="gqa",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="crash", family="gqa", severity="capability",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv1", outcome="crash", family="gqa",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="crash", family="gqa",
            message="worker died: SIGSEGV during run"),
    ])
    classes = failure_classes(df)
    assert len(classes) == 5
    assert all(c.n_rows == 1 for c in classes)
    # Worst first: correctness before capability; crash before hang.
    assert [(c.severity, c.outcome) for c in classes][:4] == [
        ("correctness", "crash"), ("correctness", "crash"), ("correctness", "crash"),
        ("correctness", "hang")]
    assert classes[-1].severity == "capability"


@pytest.mark.parametrize("a,b", [
    ("o max|diff| inf > tol 0.0608, 7697/8256 wrong, first at o(0, 0, 1)",
     "o max|diff| 2.5e-01 > tol 0.07, 3/64 wrong, first at o(1, 2, 3)"),
    ("shape torch.Size([2, 4, 128]) != expected (2, 8, 128)",
     "shape torch.Size([1, 16, 64]) != expected (1, 2, 64)"),
    ("illegal address 0x7f3a2c001000 in kernel", "illegal address 0xdeadbeef in kernel"),
    ("refusal does not name 'num_kv_heads': planned 12 heads, got 8",
     "refusal does not name 'page_size': planned 4 heads, got 16"),
    ("q is 4x128x64 with stride -1", "q is 2x32 with stride 3"),
    ("worker died: SIGFPE during run [replay: fails alone in a fresh process (SIGFPE)]",
     "worker died: SIGFPE during run"),
])
def test_numbers_shapes_addresses_and_quotes_do_not_split_a_class(a, b):
    assert normalize_message(a) == normalize_message(b)
    df = pd.DataFrame([row("fa2.single_prefill", "x", message=a),
                       row("fa2.paged_prefill", "x", message=b)])
    assert [c.n_rows for c in failure_classes(df)] == [2]


@pytest.mark.parametrize("a,b", [
    ("first at o(0, 0, 1)", "first at lse(0, 1)"),
    ("worker died: SIGFPE during run", "worker died: SIGFPE during partial"),
    ("needs fp16", "needs bf16"),
])
def test_words_still_split_classes(a, b):
    assert normalize_message(a) != normalize_message(b)


def test_variant_is_the_part_after_the_family():
    assert variant_of("fa2.paged_prefill/strided.q_stride2/bf16-d128-h4x2-p16-nhd", "strided") \
        == "q_stride2"
    assert variant_of("fa2.batch_decode/gqa.q12_over_kv8/bf16", "gqa") == "q12_over_kv8"
    assert variant_of("odd-id", "") == "odd-id"


def test_verdict_counts_classes_by_severity():
    df = pd.DataFrame([
        row("fa2.single_prefill", "out_stride2"), row("fa2.paged_prefill", "out_stride2"),
        row("fa2.single_prefill", "q_stride2", outcome="refused", severity="clarity",
            message="refusal does not name 'q'"),
        row("fa2.single_prefill", "v", outcome="harness_error", severity="harness"),
        row("fa2.single_prefill", "k", outcome="match", ok=True),
    ])
    assert verdict(df) == ("FAIL: 1 correctness, 1 clarity classes, 1 harness error class "
                           "across 4 failing rows (of 5)")
    assert verdict(df[df["pass"]]) == "PASS: 1 rows, 0 failing"
    no_severity = df.drop(columns="severity")
    assert verdict(no_severity).startswith("FAIL: 2 unrated classes, 1 harness error class")


def test_console_text_prints_each_class_once_and_each_message_once():
    msg = "o max|diff| {} > tol 0.05, 3/64 wrong, first at o(0, 0, 1)"
    df = pd.DataFrame(
        [row(r, "out_stride2", message=msg.format(1.5)) for r in
         ("fa2.single_prefill", "fa2.paged_prefill", "fa2.single_decode", "fa2.ragged_prefill")]
        + [row("fa2.single_prefill", "q_stride2", message=msg.format(9.0)),
           row("fa2.batch_decode", "kv0", outcome="crash", family="gqa",
               message="worker died: SIGFPE during run")])
    text = console_summary(df)
    lines = text.splitlines()
    assert lines[0] == "FAIL: 3 correctness classes across 6 failing rows (of 6)"
    assert lines[1] == "3 failure classes, worst first:"
    body = lines[2:]
    assert [line.split()[0] for line in body] == ["gqa.kv0", "strided.out_stride2",
                                                  "strided.q_stride2"]
    assert "4 routes: fa2.paged_prefill, fa2.ragged_prefill, fa2.single_decode, … (+1)" in body[1]
    assert text.count("wrong, first at") == 1
    assert body[2].endswith("— same message as strided.out_stride2")
    assert "crash" in body[0] and "SIGFPE" in body[0]
    assert classes_text([]) == ""
    assert console_summary(df[df["route"] == "nothing"]) == "PASS: 0 rows, 0 failing"


def test_console_text_caps_the_number_of_classes():
    df = pd.DataFrame([row("fa2.single_prefill", f"v{i}", message=f"m{i} x") for i in range(5)])
    text = classes_text(failure_classes(df), max_classes=2)
    assert text.splitlines()[-1] == "  … and 3 more classes"
    assert len(text.splitlines()) == 4
