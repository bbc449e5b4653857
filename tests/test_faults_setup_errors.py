"""Set-up errors are ours: one line on stderr, exit 2, before the first case, and no row."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fault_target import fault_case
from harness.engine import pytest_root

pytestmark = pytest.mark.system   # real processes: the subject of every test here

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_CASE = "fa2.single_prefill/valid.grid/bf16-d64-h2x2-q1k1-full-nhd"


def check(tmp_path, *argv, env=None, target="faults"):
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "harness", "check", "--target", target, "-n", "0",
                           "--results-dir", str(tmp_path / "results"), *argv], cwd=ROOT,
                          env=base, capture_output=True, text=True, timeout=180)


def one_line(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout
    return lines[0]


def no_rows(tmp_path) -> bool:
    return not list((tmp_path / "results").glob("*.jsonl")) if (tmp_path / "results").exists() \
        else True


def cases_file(tmp_path, text: str) -> str:
    path = tmp_path / "cases.json"
    path.write_text(text)
    return str(path)


_CASE = fault_case("none").to_json()


@pytest.mark.parametrize("name,text,words", [
    ("object", "{}", ["top level", "list", "dict"]),
    ("numbers", "[1, 2]", ["case 0", "case object", "int"]),
    ("unknown-key", json.dumps([dict(_CASE, colour="red")]), ["case 0", "colour"]),
    ("infinity", json.dumps([_CASE]).replace('"head_dim": 8', '"head_dim": Infinity'),
     ["Infinity"]),
    ("nan", json.dumps([_CASE]).replace('"head_dim": 8', '"head_dim": NaN'), ["NaN"]),
    ("negative", json.dumps([dict(_CASE, params=dict(_CASE["params"], kv_lens=[-3]))]),
     ["case 0", "kv_lens", "0 or more"]),
    ("past-2^31", json.dumps([dict(_CASE, params=dict(_CASE["params"], qo_lens=[2**31]))]),
     ["case 0", "qo_lens", "2^31"]),
])
def test_a_bad_cases_file_is_one_line(tmp_path, name, text, words):
    line = one_line(check(tmp_path, "--cases-file", cases_file(tmp_path, text)))
    assert "--cases-file" in line
    for word in words:
        assert word in line, line
    assert no_rows(tmp_path)


@pytest.mark.parametrize("env,words", [
    ({"KERNELS_PLATFORM": "quantum"}, ["KERNELS_PLATFORM", "quantum", "host"]),
    ({"KERNELS_CACHE_DIR": "/proc/harness-no-such-cache"}, ["KERNELS_CACHE_DIR",
                                                             "/proc/harness-no-such-cache"]),
])
def test_a_bad_environment_is_one_line_before_any_case(tmp_path, env, words):
    line = one_line(check(tmp_path, "--case-id", "none", env=env))
    for word in words:
        assert word in line, line
    assert no_rows(tmp_path)


def test_an_unknown_guard_in_the_environment_is_ours_not_the_librarys(tmp_path):
    done = check(tmp_path, "--case-id", BUNDLED_CASE, target="bundled",
                 env={"KERNELS_DISABLE_GUARDS": "no_such_guard"})
    line = one_line(done)
    assert "KERNELS_DISABLE_GUARDS" in line and "no_such_guard" in line
    assert no_rows(tmp_path)


def test_a_malformed_ledger_is_one_line_before_the_run(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_text('[{"arch": "x"}]')
    line = one_line(check(tmp_path, "--case-id", "none", "--ledger", str(ledger)))
    assert str(ledger) in line and "case_id" in line
    assert not (tmp_path / "results").exists()


def test_outputs_that_cannot_be_written_are_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = one_line(check(tmp_path, "--case-id", "none", "--html", str(blocker / "r.html")))
    assert "--html" in line and str(blocker) in line
    folder = tmp_path / "a-folder"
    folder.mkdir()
    line = one_line(check(tmp_path, "--case-id", "none", "--results", str(folder)))
    assert str(folder) in line and "folder" in line
    assert list(folder.iterdir()) == []


def test_a_timeout_past_the_ceiling_is_one_line(tmp_path):
    line = one_line(check(tmp_path, "--case-id", "none", "--case-timeout", "100000"))
    assert "--case-timeout" in line and "1800" in line


@pytest.mark.parametrize("value", ["abc", "987654"])
def test_a_parent_pid_variable_naming_no_parent_is_one_line(tmp_path, value):
    done = subprocess.run([sys.executable, "-m", "pytest", str(pytest_root.PATH), "-q", "-p",
                           "no:cacheprovider", "--target", "faults", "--case-id", "none",
                           "--results", str(tmp_path / "r.jsonl")], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), HARNESS_PARENT_PID=value),
                          capture_output=True, text=True, timeout=180)
    line = one_line(done)
    assert "HARNESS_PARENT_PID" in line and value in line
    assert not (tmp_path / "r.jsonl").exists()
