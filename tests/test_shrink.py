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
    assert small.id.startswith("fa2.batch_decode/gqa.h24x16.shrunk-")
    assert small.id.endswith("/bf16-d128-h3x2") and small.seed == case().seed
    assert small.expect == "refuse"


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


@pytest.mark.parametrize("body, expected", [
    ('print(json.dumps({"outcome": "wrong", "pass": False})); sys.exit(1)', ("wrong", False)),
    ('print(json.dumps({"outcome": "match", "pass": True}))', ("match", True)),
    ("os.kill(os.getpid(), signal.SIGSEGV)", ("crash", False)),
    ("sys.exit(5)", None),
    ('raise ValueError("params[head_dim]")', None),
])
def test_subprocess_step_maps_repro_results(tmp_path, body, expected):
    from harness.tools.shrink import subprocess_step
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\nimport json, os, signal, sys\n"
                    f"assert sys.argv[1:4] == ['-m', 'harness', 'repro']\n{body}\n")
    fake.chmod(0o755)
    step = subprocess_step(python=str(fake), workdir=str(tmp_path), timeout=30)
    assert step(case()) == expected


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
    command = repro_command(small, path, "bundled", "all")
    assert command.startswith(f"harness repro {small.id} --case-json {path}"), command
    assert command.endswith("--disable-guards all")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.chdir(tmp_path)
    out_dir = parser.parse_args(["x"]).out_dir
    assert not os.path.isabs(out_dir) and out_dir.startswith("results")
