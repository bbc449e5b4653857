"""The shrinker with a fake step: no library, no subprocess."""
import json
import os
import sys

import pytest

from harness.model.case import Case
from harness.tools.shrink import LEGAL_HEAD_DIMS, shrink, shrunk_case, write_case_file, load_case_json


def case(**over):
    params = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 24, "num_kv_heads": 16,
              "qo_lens": [7, 30, 5, 64], "kv_lens": [40, 100, 9, 64], "page_size": 16,
              "causal": True}
    params.update(over)
    return Case(route="fa2.batch_decode", family="gqa", variant="h24x16", params=params,
                expect="refuse", tag="bf16-d128-h24x16")


def fake_step(calls):
    """Fails `silent` while the GQA group does not divide and some kv_len >= 17 with d >= 64;
    a trial with head_dim 64 crashes instead (another failure, so not kept)."""
    def step(c):
        calls.append(c)
        p = c.params
        if p["head_dim"] not in LEGAL_HEAD_DIMS:
            return None
        if p["num_qo_heads"] % p["num_kv_heads"] and max(p["kv_lens"]) >= 17 and p["head_dim"] >= 64:
            return ("crash", False) if p["head_dim"] == 64 else ("silent", False)
        return ("refused", True)
    return step


def test_shrinks_to_smallest_failing_case_with_same_outcome():
    calls = []
    small, outcome, trials = shrink(case(), fake_step(calls))
    p = small.params
    assert outcome == "silent" and trials == len(calls)
    assert len(p["qo_lens"]) == 1 and p["kv_lens"] == [17] and p["qo_lens"] == [1]
    assert (p["num_qo_heads"], p["num_kv_heads"]) == (3, 2)  # the 3:2 ratio is kept
    assert p["head_dim"] == 128  # 64 crashes: a different failure, so it stays
    assert p["page_size"] == 16 and p["causal"] is True
    # The family's own rule names and judges the shrunk counts (cases/gqa.py rebuild()).
    assert small.id.startswith("fa2.batch_decode/gqa.q3_over_kv2.shrunk-")
    assert small.id.endswith("/bf16-d128-h3x2") and small.seed == case().seed
    assert small.expect == "refuse"
    assert small.refuse_words == ("num_qo_heads", "3", "num_kv_heads", "2")


def test_a_trial_already_run_is_not_run_again():
    calls = []
    small, _, trials = shrink(case(), fake_step(calls))
    keys = [json.dumps(dict(c.params), sort_keys=True) for c in calls]
    assert len(keys) == len(set(keys)) == trials


def test_derived_fields_follow_the_shrunk_params_in_every_rebuilding_family():
    from cases import generate
    from harness.tools.shrink import candidates
    for family in ("gqa", "strided", "misplanned"):
        generated = generate([family])   # generation is deterministic: made once per family
        ids = {c.id for c in generated}
        for original in [c for c in generated if c.route == "fa2.paged_prefill"][:40]:
            for params in list(candidates(dict(original.params)))[:6]:
                small = shrunk_case(original, params)
                assert small.id not in ids
                # The family's own generator, given these params, writes these fields.
                mod = __import__(f"cases.{family}", fromlist=["rebuild"])
                made = mod.rebuild(original, dict(small.params))
                assert (made.expect, made.refuse_words, made.tag) == \
                    (small.expect, small.refuse_words, small.tag)
                assert small.variant.split(".shrunk-")[0] == made.variant
                assert small.tag.endswith(original.tag[len(original.tag.split("-lib")[0]
                                                           .split("-nolse")[0]):])


def test_a_family_without_rebuild_keeps_its_words():
    c = Case(route="fa2.single_prefill", family="values", variant="v", tag="bf16-d128-h4x4-x",
             params={"dtype": "bf16", "head_dim": 128, "num_qo_heads": 4, "num_kv_heads": 4,
                     "qo_lens": [9], "kv_lens": [9]}, expect="match")
    small = shrunk_case(c, {**c.params, "num_qo_heads": 2, "num_kv_heads": 2})
    assert small.tag == "bf16-d128-h2x2-x" and small.variant.startswith("v.shrunk-")


def test_passing_case_is_refused():
    with pytest.raises(ValueError, match="does not fail"):
        shrink(case(num_qo_heads=32), fake_step([]))


def test_trial_budget_is_respected():
    calls = []
    shrink(case(), fake_step(calls), max_trials=5)
    assert len(calls) == 5


def test_shrunk_ids_are_distinct_and_stable():
    a = shrunk_case(case(), {**case().params, "qo_lens": [1]})
    b = shrunk_case(case(), {**case().params, "qo_lens": [2]})
    assert a.id != b.id and a.id == shrunk_case(case(), {**case().params, "qo_lens": [1]}).id
    # Shrinking a shrunk case replaces the suffix instead of stacking it.
    assert ".shrunk-" not in shrunk_case(a, a.params).variant.split(".shrunk-", 1)[1]


def test_case_file_round_trips(tmp_path):
    small = shrunk_case(case(), {**case().params, "qo_lens": [1, 1, 1, 1]})
    path = write_case_file(small, tmp_path)
    assert json.loads(path.read_text())[0]["variant"] == small.variant
    assert load_case_json(str(path)) == small


@pytest.mark.parametrize("fault, expected", [
    ("wrong", ("wrong", False)), ("none", ("match", True)), ("segv", ("crash", False)),
])
def test_subprocess_step_maps_child_rows(fault, expected, forked_children):
    """Each trial is the one child runner's row: a death is a crash, not the end. The trials
    fork from a warm server (tests/warm_children.py: a child of its own, which still dies of
    its signal)."""
    from harness.tools.shrink import subprocess_step
    sys.path.insert(0, os.path.dirname(__file__))
    from fault_target import fault_case
    step = subprocess_step(target="faults", timeout=60)
    assert step(fault_case(fault)) == expected


def test_a_trial_that_cannot_load_its_target_is_invalid():
    """A harness_error (here: a target that cannot load) says nothing about the library."""
    from harness.tools.shrink import subprocess_step
    sys.path.insert(0, os.path.dirname(__file__))
    from fault_target import fault_case
    assert subprocess_step(target="no_such_module:make_target", timeout=60)(fault_case("wrong")) is None


@pytest.mark.parametrize("argv,words", [
    (["shrink", "x", "--target", "nosuch"], ["shrink:", "--target", "nosuch", "bundled"]),
    (["shrink", "x", "--case-json", "/no/such/case.json"], ["shrink:", "/no/such/case.json"]),
], ids=["target", "case-json"])
def test_bad_target_or_case_file_is_a_usage_error(argv, words, capsys):
    from harness.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def test_the_printed_repro_command_is_the_harness_command_and_files_go_under_cwd(tmp_path,
                                                                              monkeypatch):
    import argparse

    from harness.tools.shrink import add_arguments, repro_command
    small = shrunk_case(case(), {**case().params, "qo_lens": [1, 1, 1, 1]})
    path = write_case_file(small, tmp_path)
    command = repro_command(small, path, "bundled", {"disable_guards": "all"})
    assert command.startswith(f"harness repro {small.id} --case-json {path}"), command
    assert command.endswith("--disable-guards all")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.chdir(tmp_path)
    out_dir = parser.parse_args(["x"]).out_dir
    assert not os.path.isabs(out_dir) and out_dir.startswith("results")


@pytest.mark.system
def test_a_shrunk_guards_off_case_is_a_regression_test(tmp_path):
    """Shrunk with the guards off, saved, then replayed by `check --cases-file`: it fails as
    the library was before its fix and passes with the fix (the guards on), because its
    refusal words name the shrunk head counts."""
    import subprocess
    case_id = "fa2.batch_decode/gqa.q12_over_kv8/bf16-d128-h12x8"
    harness = [sys.executable, "-m", "harness"]
    done = subprocess.run([*harness, "shrink", case_id, "--disable-guards", "all",
                           "--out-dir", str(tmp_path / "shrunk")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    saved = load_case_json(result["case_json"])
    assert result["outcome"] == "silent" and saved.id == result["case_id"] != case_id
    p = saved.params
    assert (p["num_qo_heads"], p["num_kv_heads"]) != (12, 8) and p["num_qo_heads"] % p["num_kv_heads"]
    assert saved.refuse_words == ("num_qo_heads", str(p["num_qo_heads"]),
                                  "num_kv_heads", str(p["num_kv_heads"]))
    assert f"h{p['num_qo_heads']}x{p['num_kv_heads']}" in saved.tag
    assert f"-d{p['head_dim']}-" in saved.tag + "-"
    check = [*harness, "check", "--cases-file", result["case_json"], "-n", "0"]
    off = subprocess.run([*check, "--disable-guards", "all", "--results-dir", str(tmp_path / "off")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    on = subprocess.run([*check, "--results-dir", str(tmp_path / "on")],
                        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert off.returncode == 1, off.stdout[-2000:] + off.stderr[-2000:]
    assert on.returncode == 0, on.stdout[-2000:] + on.stderr[-2000:]
    rows = [json.loads(line) for line in next((tmp_path / "on").glob("*.jsonl")).read_text().splitlines()]
    assert [(r["case_id"], r["outcome"], r["pass"]) for r in rows] == [(saved.id, "refused", True)]
