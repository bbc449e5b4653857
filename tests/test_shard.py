"""`--shard I/N`: shards cover a selection exactly once, balanced by estimated cost, the
same on every machine; the tables of a sharded run merge into the unsharded run's rows,
and a gap or an overlap is refused by name."""
from __future__ import annotations

import shutil

import pytest

from harness import cli
from harness.model import shard
from harness.model.case import Case
from harness.results import table

SELECTION = ["--family", "gqa", "--route", "fa2.single_prefill,fa2.batch_decode"]


def _case(i: int, q: int, k: int) -> Case:
    return Case(route="fa2.single_prefill", family="valid", variant=f"v{i}",
                params={"dtype": "fp16", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 4,
                        "qo_lens": [q], "kv_lens": [k]})


def test_assignment_is_deterministic_balanced_and_covers_once():
    cases = [_case(i, q, k) for i, (q, k) in enumerate(
        [(4096, 4096), (2048, 2048), (1024, 1024)] + [(16, 16)] * 40)]
    owner = shard.assign(cases, 3)
    assert owner == shard.assign(list(reversed(cases)), 3)   # the order given does not matter
    parts = [shard.select(cases, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(c.id for p in parts for c in p) == sorted(c.id for c in cases)
    loads = [sum(shard.cost(c) for c in p) for p in parts]
    # Longest first: the big case alone on one shard, the rest spread over the others.
    assert parts[0][0].params["qo_lens"] == [4096] and len(parts[0]) == 1
    assert max(loads[1:]) - min(loads[1:]) <= max(shard.cost(c) for c in cases[1:])
    for p in parts:   # each shard keeps the selection's own order
        assert [c.id for c in p] == [c.id for c in cases if c in p]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1/0", "two", "1-3", ""])
def test_a_bad_shard_is_one_line(text, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["list", "--shard", text])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--shard" in err and "I/N" in err or "between" in err


def test_list_shards_cover_the_selection_exactly_once(capsys):
    assert cli.main(["list", *SELECTION]) == 0
    everything = capsys.readouterr().out.split()
    seen = []
    for i in (1, 2, 3):
        assert cli.main(["list", *SELECTION, "--shard", f"{i}/3"]) == 0
        seen += capsys.readouterr().out.split()
    assert sorted(seen) == sorted(everything) and len(set(seen)) == len(seen)
    assert cli.main(["list", *SELECTION, "--shard", "1/1000"]) == 0   # a big case alone
    assert cli.main(["list", *SELECTION, "--shard", "1000/1000"]) == 4   # nothing left


# The bundled library at one commit: this checkout's own commit moves while the suite runs
# (a sharded run's machines all build one commit).
PINNED = """
from harness.targets import load_target


def make_target():
    target = load_target("bundled")
    target.commit = lambda: "c0ffee"
    return target
"""


@pytest.mark.system
def test_shard_tables_merge_into_the_unsharded_run_row_for_row(tmp_path, capfd):
    from reports import load_results
    adapter = tmp_path / "pinned.py"
    adapter.write_text(PINNED)
    capfd.readouterr()
    whole = tmp_path / "whole.jsonl"
    run = ["check", "--target", str(adapter), *SELECTION, "-n", "0"]
    assert cli.main([*run, "--results", str(whole)]) == 0
    for i in (1, 2, 3):
        assert cli.main([*run, "--shard", f"{i}/3",
                         "--results", str(tmp_path / f"shard-{i}.jsonl")]) == 0
    out, err = capfd.readouterr()
    shards = sorted(tmp_path.glob("shard-*.jsonl"))
    for i, path in enumerate(shards, 1):
        assert {r["shard"] for r in table.read_rows(path)} == {f"{i}/3"}

    def key(df):
        return sorted(zip(df["case_id"], df["outcome"], df["pass"], df["route"]))
    assert key(load_results(shards)) == key(load_results([whole]))

    # The command a merge job runs: a quoted glob, one report of the whole run.
    md = tmp_path / "merged.md"
    assert cli.main(["report", "--results", str(tmp_path / "shard-*.jsonl"),
                     "--out", str(tmp_path / "merged.html"), "--markdown", str(md)]) == 0
    out, _ = capfd.readouterr()
    assert f"report: {len(table.read_rows(whole))} rows, 0 failing" in out, out
    assert cli.main(["compare", "--base", str(whole), "--head",
                     str(tmp_path / "shard-*.jsonl")]) == 0
    assert "0 regression" in capfd.readouterr().out

    def code(argv):   # report and compare leave by SystemExit on a table they refuse
        try:
            return cli.main(argv)
        except SystemExit as stop:
            return stop.code

    # A gap: shard 2 of 3 missing, named.
    assert code(["report", "--results", str(shards[0]), str(shards[2]),
                     "--out", str(tmp_path / "gap.html")]) == 2
    err = capfd.readouterr().err
    assert "shard 2/3 of 3 is missing" in err and len(err.strip().splitlines()) == 1, err
    # An overlap: one shard's table given twice, under two names.
    again = tmp_path / "again.jsonl"
    shutil.copy(shards[0], again)
    assert code(["compare", "--base", str(whole), "--head", *map(str, shards),
                     str(again)]) == 2
    err = capfd.readouterr().err
    assert "the shards overlap" in err and str(again) in err, err
