import json
import math

import pytest

from harness.results import table


def _row(case_id="fa2.single_prefill/valid.x/fp16", **kw):
    row = {"run_id": "r1", "case_id": case_id, "route": case_id.split("/")[0], "family": "valid",
           "params": {"head_dim": 64}, "expect": "match", "outcome": "match", "pass": True,
           "max_abs_diff": 0.001, "arch": "cpu-x86_64"}
    row.update(kw)
    return row


def test_round_trip_keeps_every_column_nan_and_inf(tmp_path):
    path = tmp_path / "t.jsonl"
    table.append_row(path, _row(max_abs_diff=float("nan")))
    table.append_row(path, _row("b/c", max_abs_diff=float("inf"), outcome="wrong", **{"pass": False},
                                first_bad_index=["o", 0, 1, 2]))
    df = table.load_table(path)
    assert list(df.columns[:len(table.COLUMNS)]) == list(table.COLUMNS)
    assert len(df) == 2
    assert math.isnan(df["max_abs_diff"][0]) and math.isinf(df["max_abs_diff"][1])
    assert json.loads(df["params"][0]) == {"head_dim": 64}
    assert df["pass"].tolist() == [True, False]
    assert df["reruns"].tolist() == [0, 0] and df["isolation"].tolist() == ["", ""]
    assert df["first_bad_index"][1] == ["o", 0, 1, 2]


def test_unknown_column_and_bad_isolation_are_refused(tmp_path):
    with pytest.raises(ValueError, match="outside the schema"):
        table.append_row(tmp_path / "t.jsonl", _row(bogus=1))
    with pytest.raises(ValueError, match="isolation"):
        table.append_row(tmp_path / "t.jsonl", _row(isolation="maybe"))


def test_corrupt_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    table.append_row(path, _row())
    with open(path, "a") as f:
        f.write('{"case_id": "torn", "outco\n')
    with pytest.raises(ValueError, match=rf"{path.name}:2: corrupt"):
        table.load_table(path)
    other = tmp_path / "u.jsonl"
    other.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="u.jsonl:1"):
        table.load_table(other)


# Three writer processes started fresh: a pool forked from a test worker's threads can
# inherit a lock held at the fork and wait on it forever.
APPEND_MANY = """
import sys
from harness.results import table
path, worker = sys.argv[1], sys.argv[2]
for i in range(50):
    table.append_row(path, {"run_id": "r1", "case_id": f"r/{worker}/{i}", "route": "r",
                            "family": "valid", "params": {"head_dim": 64}, "expect": "match",
                            "outcome": "match", "pass": True, "max_abs_diff": 0.001,
                            "arch": "cpu-x86_64", "message": "x" * 3000})
"""


@pytest.mark.system
def test_concurrent_appends_never_interleave(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    path = str(tmp_path / "t.jsonl")
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    writers = [subprocess.Popen([sys.executable, "-c", APPEND_MANY, path, str(w)], env=env)
               for w in range(3)]
    assert [w.wait(timeout=300) for w in writers] == [0, 0, 0]
    df = table.load_table(path)
    assert len(df) == 150 and df["case_id"].is_unique


def test_paths_resume_helpers_and_merge(tmp_path):
    assert str(table.results_path("bundled", "gfx942", "abc123", tmp_path)).endswith(
        "bundled-gfx942-abc123.jsonl")
    # A partial run names its selection, so it never replaces the full table.
    partial = table.results_path("torch-sdpa", "gfx942", "abc", tmp_path,
                                 table.selection_slug(family="strided,gqa"))
    assert partial.name == "torch-sdpa-gfx942-abc.partial-family=strided,gqa.jsonl"
    assert table.selection_slug() == ""
    assert len(table.selection_slug(case_id="x" * 200)) <= 60
    path = table.results_path("bundled", "cpu-x86_64", "abc", tmp_path)
    assert table.done_case_ids(path) == set() and table.last_run_id(path) is None
    table.append_row(path, _row("a/1", run_id="first"))
    table.append_row(path, _row("a/2", run_id="second"))
    assert table.done_case_ids(path) == {"a/1", "a/2"} and table.last_run_id(path) == "second"
    assert table.copy_latest(path, "bundled", "cpu-x86_64").name == "bundled-cpu-x86_64.jsonl"

    base = tmp_path / "gfx942.jsonl"
    head = tmp_path / "gfx950.jsonl"
    table.append_row(base, _row("a/1", arch="gfx942"))
    table.append_row(head, _row("a/1", arch="gfx950", outcome="wrong", **{"pass": False}))
    table.append_row(head, _row("a/3", arch="gfx950"))
    merged = table.merge_by_case({"gfx942": table.load_table(base), "gfx950": table.load_table(head)})
    assert merged.loc["a/1", ("gfx950", "outcome")] == "wrong"
    assert merged.loc["a/1", ("gfx942", "outcome")] == "match"
    assert merged.loc["a/3", ("gfx942", "outcome")] != merged.loc["a/3", ("gfx942", "outcome")]  # NaN
    both = table.load_table([base, head])
    assert len(both) == 3
