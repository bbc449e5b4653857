"""The results table as hostile input: one typed loader, one writer, whole lines only."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import table

ROOT = Path(__file__).resolve().parents[1]


def _row(case_id="fa2.single_prefill/valid.x/fp16", **kw):
    row = {"run_id": "r1", "case_id": case_id, "route": "fa2.single_prefill", "family": "valid",
           "params": {"head_dim": 64}, "expect": "match", "outcome": "match", "pass": True,
           "max_abs_diff": 0.001, "arch": "cpu-x86_64", "target": "bundled"}
    row.update(kw)
    return row


def _write_lines(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("field,value,words", [
    ("pass", "false", ["'pass'", "JSON boolean"]),     # a string is never truthy
    ("pass", 0, ["'pass'", "JSON boolean"]),
    ("outcome", "pwned", ["'outcome'", "match"]),
    ("arch", "../../etc", ["'arch'"]),
    ("target", "<script>", ["'target'"]),
    ("max_abs_diff", "0.1", ["'max_abs_diff'", "number"]),
    ("o_max_abs_diff", "0.1", ["'o_max_abs_diff'", "number"]),
    ("lse_tolerance", True, ["'lse_tolerance'", "number"]),
    ("o_error_ratio", [1.0], ["'o_error_ratio'", "number"]),
    ("n_wrong", 1.5, ["'n_wrong'", "whole number"]),
    ("isolation", "maybe", ["'isolation'"]),
    ("case_id", "", ["'case_id'"]),
    ("bogus_column", 1, ["'bogus_column'", "not a results column"]),
])
def test_a_row_breaking_the_schema_is_one_line_naming_file_line_and_field(tmp_path, field,
                                                                          value, words):
    path = tmp_path / "t.jsonl"
    bad = dict(_row("a/2"), **{field: value})
    _write_lines(path, [_row("a/1"), bad])
    with pytest.raises(table.TableError) as err:
        table.load_table(path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}:2: ")
    for word in words:
        assert word in text, text


def test_per_output_columns_are_read_and_a_table_without_them_still_loads(tmp_path):
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    _write_lines(old, [_row("a/1")])     # written before the per-output columns
    df = table.load_table(old)
    assert all(c in df.columns for c in table.PER_OUTPUT_COLUMNS)
    assert df[list(table.PER_OUTPUT_COLUMNS)].isna().all(axis=None)
    new.write_text(json.dumps(_row("a/1", o_max_abs_diff=float("inf"), o_tolerance=0.05,
                                   o_error_ratio=float("inf"), lse_max_abs_diff=float("nan"),
                                   lse_tolerance=None, lse_error_ratio=None)) + "\n")
    (r,) = table.read_rows(new)
    assert r["o_max_abs_diff"] == float("inf") and r["lse_max_abs_diff"] != r["lse_max_abs_diff"]
    df = table.load_table(new)
    assert df["o_tolerance"].iloc[0] == 0.05 and df["lse_tolerance"].isna().all()
    assert set(table.PER_OUTPUT_COLUMNS) <= set(table.COLUMNS)


def test_the_string_false_never_passes_a_row(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, [_row(outcome="wrong", **{"pass": "false"})])
    with pytest.raises(table.TableError, match="'pass'"):
        table.read_rows(path)


def test_a_second_row_for_a_case_in_one_run_is_an_error_never_last_wins(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, [_row("a/1", outcome="wrong", **{"pass": False}), _row("a/2"),
                        _row("a/1")])
    with pytest.raises(table.TableError) as err:
        table.load_table(path)
    assert f"{path}:3:" in str(err.value) and "first at line 1" in str(err.value)
    # The same case in two runs (a rerun of the table, another commit) is two rows.
    other = tmp_path / "u.jsonl"
    _write_lines(other, [_row("a/1", run_id="r1"), _row("a/1", run_id="r2")])
    assert len(table.load_table(other)) == 2
    # One file named twice is one run's rows twice.
    _write_lines(path, [_row("a/1")])
    with pytest.raises(table.TableError, match="also in"):
        table.load_table([path, path])


def test_a_torn_last_line_is_not_a_row_and_is_said_on_stderr(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    _write_lines(path, [_row("a/1"), _row("a/2")])
    whole = path.read_bytes()
    torn = json.dumps(_row("a/3")).encode()
    path.write_bytes(whole + torn[: len(torn) // 2])
    assert [r["case_id"] for r in table.read_rows(path)] == ["a/1", "a/2"]
    err = capsys.readouterr().err
    assert f"{path}:3:" in err and "torn" in err
    assert table.done_case_ids(path) == {"a/1", "a/2"}   # resume runs a/3 again
    # A whole row without its newline is torn too: the write that carried it did not end.
    path.write_bytes(whole + torn)
    assert [r["case_id"] for r in table.read_rows(path)] == ["a/1", "a/2"]
    assert table.drop_torn_tail(path) and path.read_bytes() == whole
    assert not table.drop_torn_tail(path)


def test_a_corrupt_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_row("a/1")) + "\n" + '{"case_id": "a/2", "outc\n'
                    + json.dumps(_row("a/3")) + "\n")
    with pytest.raises(table.TableError, match=rf"{path.name}:2: corrupt"):
        table.read_rows(path)


def test_a_folder_is_not_a_table(tmp_path):
    with pytest.raises(table.TableError, match="is a folder"):
        table.read_rows(tmp_path)


def test_a_cases_file_selection_is_named_by_its_content(tmp_path):
    a, b = tmp_path / "x" / "cases.json", tmp_path / "y" / "cases.json"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_text("[1]")
    b.write_text("[2]")
    assert table.selection_slug(cases_file=a) != table.selection_slug(cases_file=b)
    b.write_text("[1]")
    assert table.selection_slug(cases_file=a) == table.selection_slug(cases_file=b)
    assert "cases" not in table.selection_slug(cases_file=a).split("=", 1)[1]


def test_a_table_is_replaced_by_rename_never_unlinked_first(tmp_path):
    path = tmp_path / "t.jsonl"
    _write_lines(path, [_row("a/1")])
    with open(path, "rb") as reader:
        inode = os.fstat(reader.fileno()).st_ino
        table.replace_with(path)
        assert reader.read() == (json.dumps(_row("a/1")) + "\n").encode()  # the old file, whole
    assert path.read_bytes() == b"" and path.stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


LOCKER = ("import sys, time\n"
          "from harness.results import table\n"
          "lock = table.TableLock.acquire(sys.argv[1])\n"
          "print('locked', flush=True)\n"
          "sys.stdin.read()\n")


@pytest.mark.system
def test_one_writer_per_table_and_the_lock_names_the_pid(tmp_path):
    path = tmp_path / "t.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(table.TableBusy) as busy:
            table.TableLock.acquire(path)
        assert str(path) in str(busy.value) and f"pid {holder.pid}" in str(busy.value)
        assert table.holder_of(path) == str(holder.pid)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # The lock goes with the process, however it ended.
    assert table.holder_of(path) is None
    table.TableLock.acquire(path).release()


APPENDER = ("import sys, json\n"
            "from harness.results import table\n"
            "row = json.loads(sys.argv[2])\n"
            "for i in range(50):\n"
            "    row['case_id'] = f'a/{i}'\n"
            "    try:\n"
            "        table.append_row(sys.argv[1], row)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__, e, flush=True)\n"
            "        break\n")


def _limit_file_size(limit: int):
    def apply():
        # Ignored, SIGXFSZ would kill the writer; the write then fails with EFBIG, as a full
        # disk fails with ENOSPC.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.system
def test_a_write_that_fails_part_way_leaves_whole_rows(tmp_path):
    path = tmp_path / "t.jsonl"
    row = table.normalize_row(_row())
    size = len(json.dumps(row)) + 1
    done = subprocess.run([sys.executable, "-c", APPENDER, str(path), json.dumps(row)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_file_size(int(size * 3.5)),
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TableWriteError") and "file-size limit" in done.stdout
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 3   # the 4th row was cut back
    assert [r["case_id"] for r in table.read_rows(path)] == ["a/0", "a/1", "a/2"]
