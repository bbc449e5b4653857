"""Failing rows grouped into failure classes, and the console text of them."""
from __future__ import annotations

import pandas as pd
import pytest

from harness.results.failure_classes import (classes_text, console_summary, differs_of,
                                             failure_classes, message_shape, normalize_message,
                                             variant_of, variant_shape, verdict)


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
    assert c.message == ("<tensor> max|diff| <n> > tol <n>, <n>/<n> wrong, "
                         "first at <tensor><shape>")
    assert (c.differs, c.variants, c.tensors) == ("o", ["out_stride2"], ["out"])


def test_different_outcomes_severities_and_variants_are_different_classes():
    df = pd.DataFrame([
        row("fa2.single_prefill", "kv0", outcome="crash", family="gqa",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="hang", family="gqa",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="crash", family="gqa", severity="capability",
            message="worker died: SIGFPE during run"),
        row("fa2.batch_decode", "kv0", outcome="crash", family="misplanned",
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
    assert verdict(df) == ("FAIL: 3 distinct causes (1 correctness, 1 clarity, 1 harness error) "
                           "across 4 failing rows (of 5)")
    assert verdict(df[df["pass"]]) == "PASS: 1 rows, 0 failing"
    no_severity = df.drop(columns="severity")
    assert verdict(no_severity).startswith("FAIL: 3 distinct causes (2 unrated, 1 harness error)")
    assert verdict(df.iloc[:2]) == ("FAIL: 1 distinct cause (1 correctness) across 2 failing "
                                    "rows (of 2)")


def test_console_text_prints_each_class_once_with_its_own_message():
    msg = "o max|diff| {} > tol 0.05, 3/64 wrong, first at o(0, 0, 1)"
    df = pd.DataFrame(
        [row(r, "out_stride2", message=msg.format(1.5)) for r in
         ("fa2.single_prefill", "fa2.paged_prefill", "fa2.single_decode", "fa2.ragged_prefill")]
        + [row("fa2.single_prefill", "q_stride2", message=msg.format(9.0)),
           row("fa2.single_prefill", "q_heads", message=msg.format(9.0)),
           row("fa2.batch_decode", "kv0", outcome="crash", family="gqa",
               message="worker died: SIGFPE during run")])
    text = console_summary(df)
    lines = text.splitlines()
    assert lines[0] == "FAIL: 3 distinct causes (3 correctness) across 7 failing rows (of 7)"
    assert lines[1] == "3 failure classes, worst first:"
    body = lines[2:]
    assert [line.split()[0] for line in body] == ["gqa.kv0", "strided.<tensor>_stride<n>",
                                                  "strided.q_heads"]
    assert "4 routes: fa2.paged_prefill, fa2.ragged_prefill, fa2.single_decode, … (+1) (5 rows)" \
        "; 2 variants; tensors: out, q" in body[1]
    assert body[1].split()[1] == "wrong(o)"
    # Each line prints its own class's message: these two differ (1.5 vs 9.0).
    assert body[1].endswith("— o max|diff| 1.5 > tol 0.05, 3/64 wrong, first at o(0, 0, 1)")
    assert body[2].endswith("— o max|diff| 9.0 > tol 0.05, 3/64 wrong, first at o(0, 0, 1)")
    # Only a message printed word for word already says so.
    same = pd.DataFrame([row("fa2.single_prefill", "out_stride2", message=msg.format(9.0)),
                         row("fa2.single_prefill", "q_heads", outcome="corrupt",
                             message=msg.format(9.0))])
    lines = classes_text(failure_classes(same)).splitlines()
    assert lines[2].endswith("— same message as strided.q_heads"), lines   # corrupt first
    assert "crash" in body[0] and "SIGFPE" in body[0]
    assert classes_text([]) == ""
    assert console_summary(df[df["route"] == "nothing"]) == "PASS: 0 rows, 0 failing"


def test_console_text_caps_the_number_of_classes():
    df = pd.DataFrame([row("fa2.single_prefill", f"v{i}", message=f"m{i} x") for i in range(5)])
    text = classes_text(failure_classes(df), max_classes=2)
    assert text.splitlines()[-1] == "  … and 3 more classes"
    assert len(text.splitlines()) == 4


# ---- the key is the defect's signature: no route, tensor or number in it ----------------

STRIDED_TENSORS = ("q", "k", "v", "k_cache", "v_cache", "kv_cache", "out", "s", "v_a", "s_b",
                   "v_other", "partial_state_v", "partial_state_s", "paged_kv_indptr",
                   "kv_indptr", "qo_indptr", "block_table", "seq_lens", "key_cache",
                   "value_cache")


def test_twenty_strided_tensors_with_one_message_shape_are_one_class():
    assert len(STRIDED_TENSORS) == 20
    df = pd.DataFrame([
        row(f"fa2.route{i % 3}", f"{name}_stride2", stage="compare",
            message=wrong_msg(1.5 + i, 3 + i, 512, (0, i, 1)), first_bad_index=["o", 0, i, 1])
        for i, name in enumerate(STRIDED_TENSORS)])
    (c,) = failure_classes(df)
    assert c.n_rows == 20 and c.variant == "<tensor>_stride<n>"
    assert c.label == "strided.<tensor>_stride<n>"
    assert c.tensors == sorted(STRIDED_TENSORS)
    assert c.variants == sorted(f"{t}_stride2" for t in STRIDED_TENSORS)
    assert c.routes == ["fa2.route0", "fa2.route1", "fa2.route2"]
    assert (c.stage, c.differs) == ("compare", "o")


def test_window_variants_differing_only_in_numbers_are_one_class():
    df = pd.DataFrame([row(f"ll4mi.batch_decode", f"d{d}_window{w}", family="small_head",
                           message=wrong_msg(0.3 * d, d, 4 * d, (0, 1, d)))
                       for d, w in ((32, 15), (48, 15), (64, 7), (128, 15), (256, 1))])
    (c,) = failure_classes(df)
    assert (c.n_rows, c.variant, len(c.variants)) == (5, "d<n>_window<n>", 5)
    assert variant_shape("fp8_e4m3_window_hnd") == variant_shape("fp8_e5m2_window_hnd")


def test_o_wrong_with_or_without_lse_is_one_class_lse_alone_another():
    o_wrong = dict(o_max_abs_diff=1.5, o_tolerance=0.05, o_error_ratio=30.0,
                   lse_max_abs_diff=0.001, lse_tolerance=0.01, lse_error_ratio=0.1)
    lse_wrong = dict(o_max_abs_diff=0.01, o_tolerance=0.05, o_error_ratio=0.2,
                     lse_max_abs_diff=6.6, lse_tolerance=0.001, lse_error_ratio=6600.0)
    both = dict(o_wrong, lse_max_abs_diff=6.6, lse_error_ratio=660.0)
    df = pd.DataFrame([
        row("fa2.single_prefill", "out_stride2", message=wrong_msg(1.5, 3, 64, (0, 0, 1)),
            **o_wrong),
        row("fa2.single_prefill", "lse_stride2", message="lse max|diff| 6.6 > tol 0.001, 3/8 "
            "wrong, first at lse(0, 1)", **lse_wrong),
        row("fa2.paged_prefill", "lse_stride2", message="lse max|diff| 2 > tol 0.002, 1/8 "
            "wrong, first at lse(1, 1)", **lse_wrong),
        row("fa2.single_prefill", "q_stride2", message=wrong_msg(1.5, 3, 64, (0, 0, 1)),
            **both),
    ])
    classes = failure_classes(df)
    # o's defect seen with the LSE wrong too (q_stride2) and without (out_stride2): one class
    # that says both outputs differ somewhere; an LSE alone wrong is another defect.
    assert sorted((c.differs, c.n_rows) for c in classes) == [("lse", 2), ("o+lse", 2)]
    assert len({c.key for c in classes}) == len({c.slug for c in classes}) == 2


def test_what_differs_in_a_table_from_before_the_per_output_columns():
    assert differs_of({"first_bad_index": ["lse", 0, 1]}) == "lse"
    assert differs_of({"first_bad_index": '["o", 0, 1]'}) == "o"
    assert differs_of({"message": "ran without error; the case must be refused (lse max|diff| "
                                  "3 > tol 0.01, 1/4 wrong, first at lse(0, 1))"}) == "lse"
    assert differs_of({"message": "worker died: SIGSEGV during run"}) == ""
    # A missing output: an inf diff and no tolerance.
    assert differs_of({"o_max_abs_diff": float("inf"), "o_tolerance": None,
                       "lse_max_abs_diff": 0.0, "lse_tolerance": 0.01}) == "o"


def test_crash_signals_and_stages_split_classes():
    df = pd.DataFrame([
        row("fa2.single_prefill", "kv0", outcome="crash", family="gqa", stage="run",
            message="worker died: SIGSEGV during run"),
        row("fa2.batch_decode", "kv0", outcome="crash", family="gqa", stage="run",
            message="worker died: SIGFPE during run"),
        row("fa2.paged_prefill", "kv0", outcome="crash", family="gqa", stage="run",
            message="worker died: SIGFPE during run"),
        row("fa2.paged_prefill", "kv1", outcome="crash", family="gqa", stage="plan",
            message="worker died: SIGFPE during plan"),
    ])
    classes = failure_classes(df)
    assert sorted((c.stage, c.n_rows, c.example_message.split()[2]) for c in classes) == [
        ("plan", 1, "SIGFPE"), ("run", 1, "SIGSEGV"), ("run", 2, "SIGFPE")]


def test_different_families_and_defects_stay_apart():
    msg = wrong_msg(1.5, 3, 64, (0, 0, 1))
    df = pd.DataFrame([row("fa2.single_prefill", "q_stride2", message=msg),
                       row("fa2.single_prefill", "q_stride2", family="misplanned", message=msg),
                       row("fa2.single_prefill", "q_heads", message=msg),
                       row("fa2.single_prefill", "head_dim_vo", family="misplanned",
                           outcome="silent", message="ran without error; the case must be "
                           "refused (values match the reference)"),
                       row("fa2.paged_prefill", "head_dim_vo", family="misplanned",
                           outcome="silent", message="ran without error; the case must be "
                           "refused (" + msg + ")"),
                       row("fa2.single_prefill", "rank", family="misplanned", outcome="silent",
                           message="ran without error; the case must be refused")])
    classes = failure_classes(df)
    # A silent row's values do not split its cause (the refusal that did not happen).
    assert sorted((c.label, c.n_rows) for c in classes) == [
        ("misplanned.head_dim_vo", 2), ("misplanned.q_stride2", 1), ("misplanned.rank", 1),
        ("strided.q_heads", 1), ("strided.q_stride2", 1)]


def test_message_shape_takes_out_tensor_names_and_the_route_but_not_english():
    assert message_shape("refusal does not name k_cache as a word") == \
        message_shape("refusal does not name paged_kv_indptr as a word")
    assert message_shape("canary after out: 3 elements changed") == \
        "canary after <tensor>: <n> elements changed"
    assert message_shape("timed out after 30 s; read out of bounds") == \
        "timed out after <n> s; read out of bounds"
    assert message_shape("fa2.single_prefill refused", route="fa2.single_prefill") == \
        message_shape("fa2.batch_decode refused", route="fa2.batch_decode")


def test_slug_is_derived_from_the_key_and_file_name_safe():
    msg = wrong_msg(1.5, 3, 64, (0, 0, 1))
    one = failure_classes(pd.DataFrame([row("a.b", "q_stride2", message=msg)]))[0]
    two = failure_classes(pd.DataFrame([row("c.d", "k_cache_stride2", message=msg),
                                        row("a.b", "v_stride2", message=msg)]))[0]
    assert one.key == two.key and one.slug == two.slug
    assert one.slug.startswith("wrong-strided.T_strideN-")
    assert all(ch.isalnum() or ch in "._-" for ch in one.slug)


def test_a_possessive_s_is_not_a_tensor_named_s():
    # "the adapter's" must not read as merge-state tensor `s` in a message's shape.
    text = "the adapter never read params['k_scale'] = 0.5: every perturbation is the adapter's"
    assert "<tensor>" not in message_shape(text)
    assert message_shape("s is wrong at s(0)").count("<tensor>") == 2


def _feature_row(route, variant, form, message, expect="match", outcome="wrong", **numbers):
    """A row of a features case in one call form (the tag says which, as cases do)."""
    import json
    lse = form.endswith("+lse")
    params = {"return_lse": lse, **({"out_form": "library"} if form.startswith("lib") else {})}
    tag = "bf16-d128-h4x4" + {"out+lse": "", "out": "-nolse", "lib+lse": "-lib",
                              "lib": "-lib-nolse"}[form]
    return {**row(route, variant, outcome=outcome, family="features", tag=tag,
                  message=message), "expect": expect, "params": json.dumps(params), **numbers}


def test_one_planted_defect_across_variants_and_call_forms_is_one_class():
    # A soft cap applied wrong: seen in every softcap scenario, through four routes, with and
    # without the LSE, with the caller's out= and the library's; one defect, one class.
    o_and_lse = dict(o_max_abs_diff=0.8, o_tolerance=0.01, lse_max_abs_diff=0.5,
                     lse_tolerance=0.01)
    o_only = dict(o_max_abs_diff=0.8, o_tolerance=0.01)
    rows = []
    for variant in ("softcap.cap2_basic0", "softcap.cap50_large_logits", "softcap.cap2_window",
                    "softcap.cap30_large_logits_fp32"):
        for route in ("fa2.single_prefill", "fa2.paged_prefill", "fa2.batch_decode",
                      "ll4mi.batch_decode"):
            for form in ("out+lse", "out", "lib+lse", "lib"):
                lse = form.endswith("+lse")
                message = wrong_msg(0.8, 7, 64, (0, 1, 2))
                if lse and route == "ll4mi.batch_decode":
                    # this route returns no LSE: only o compared, and the row says so
                    message += "; lse not compared: ll4mi returns no LSE"
                    numbers = o_only
                else:
                    numbers = o_and_lse if lse else o_only
                rows.append(_feature_row(route, variant, form, message, **numbers))
    # Two other defects stay apart: a sinks bug with the same message, and two missing checks.
    rows.append(_feature_row("fa2.single_prefill", "sinks.basic0", "out",
                             wrong_msg(0.8, 7, 64, (0, 1, 2)), **o_only))
    for variant in ("refuse.sinks_too_long", "refuse.alibi_per_kv_head"):
        rows.append(_feature_row("fa2.single_prefill", variant, "out",
                                 "ran without error; the case must be refused "
                                 "(values match the reference)", expect="refuse",
                                 outcome="silent"))
    classes = failure_classes(pd.DataFrame(rows))
    labels = sorted(c.label for c in classes)
    assert labels == ["features.refuse.alibi_per_kv_head", "features.refuse.sinks_too_long",
                      "features.sinks.basic0", "features.softcap.*"], labels
    (softcap,) = [c for c in classes if c.label == "features.softcap.*"]
    assert softcap.n_rows == 64 and len(softcap.variants) == 4 and len(softcap.routes) == 4
    assert softcap.call_forms == ["out+lse", "out", "lib+lse", "lib"]
    assert softcap.differs == "o+lse"
    text = classes_text(classes)
    assert "call forms: out+lse, out, lib+lse, lib" in text and "4 variants" in text


def test_a_row_whose_lse_was_not_compared_joins_its_output_only_class():
    msg = wrong_msg(0.8, 7, 64, (0, 1, 2))
    df = pd.DataFrame([
        row("fa2.single_prefill", "out_stride2", message=msg, o_max_abs_diff=0.8,
            o_tolerance=0.01),
        row("aiter.batch_decode", "out_stride2",
            message=msg + "; lse not compared: the target returns no LSE (its call forms: "
                          "out)", o_max_abs_diff=0.8, o_tolerance=0.01),
        row("fa2.single_decode", "q_stride2",
            message=msg + "; lse not compared: the target returns no LSE (its call forms: "
                          "out)", o_max_abs_diff=0.8, o_tolerance=0.01)])
    (cls,) = failure_classes(df)
    assert cls.n_rows == 3
    assert cls.routes == ["aiter.batch_decode", "fa2.single_decode", "fa2.single_prefill"]
    # The note names what was not judged, not a tensor of the failure.
    assert cls.tensors == ["out", "q"]


def test_a_canary_of_the_lse_beside_os_is_the_same_corruption_a_harness_error_one_bug():
    df = pd.DataFrame([
        row("fa2.paged_prefill", "q_rows_fewer", outcome="corrupt", family="misplanned",
            message="canary after out: 1024 elements changed, first at +0"),
        row("fa2.ragged_prefill", "q_rows_fewer", outcome="corrupt", family="misplanned",
            message="canary after out: 512 elements changed, first at +0; canary after lse: "
                    "8 elements changed, first at +0"),
        row("fa2.paged_prefill", "q_rows_fewer", outcome="corrupt", family="misplanned",
            tag="other", message="input q changed"),
        *[row("aiter.batch_decode", v, outcome="harness_error", family="misplanned",
              severity="harness", message="harness error in the case: AttributeError: 'X' "
                                          "object has no attribute 'y'")
          for v in ("rank", "page_size", "num_qo_heads")]])
    classes = failure_classes(df)
    assert sorted((c.outcome, c.n_rows) for c in classes) == [
        ("corrupt", 1), ("corrupt", 2), ("harness_error", 3)]
    (harness,) = [c for c in classes if c.outcome == "harness_error"]
    assert harness.label == "misplanned.*" and len(harness.variants) == 3
