"""Every path option means the file the user typed, from the folder they typed it in.

The commands run in this process (cli.main) with the current folder moved outside the
checkout; their children (the check's pytest, repro's runner, shrink's trials, bisect's
steps) run elsewhere (the checkout, the bisected repository), so a path passed on
unresolved would name another file, or none.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness import cli
from harness.results import table

NONE_ID = "faults.single_prefill/faults.none/n0"
WRONG_ID = "faults.single_prefill/faults.wrong/n0"

# A library's adapter kept in its own folder: the test-only faults target under another
# name; with BROKEN set, every answer is off by one (the library's regression).
ADAPTER = '''
from harness.targets import load_target

BROKEN = {broken}


def make_target():
    target = load_target("faults")
    if BROKEN:
        run = target.run

        def broken(case, problem, buffers):
            return {{"o": run(case, problem, buffers)["o"] + 1}}
        target.run = broken
    return target
'''


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """tmp_path/lib holds adapter.py (good, then broken, two commits); the current folder
    is tmp_path, outside the checkout."""
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q", "-b", "main")
    for key, value in (("user.email", "ci@example.invalid"), ("user.name", "ci"),
                       ("commit.gpgsign", "false")):
        git(lib, "config", key, value)
    shas = []
    for broken in (False, True):
        (lib / "adapter.py").write_text(ADAPTER.format(broken=broken))
        git(lib, "add", "adapter.py")
        git(lib, "commit", "-q", "-m", "broken" if broken else "good")
        shas.append(git(lib, "rev-parse", "HEAD"))
    monkeypatch.chdir(tmp_path)
    return tmp_path, shas


@pytest.mark.system
def test_check_repro_and_report_take_a_relative_target_and_paths_from_here(elsewhere, capfd):
    here, _ = elsewhere
    rc = cli.main(["check", "--target", "lib/adapter.py", "-n", "0", "--case-id", "wrong",
                   "--results-dir", "out", "--summary-json", "s.json"])
    out, err = capfd.readouterr()
    assert rc == 1, out[-2000:] + err[-2000:]          # the broken adapter's rows, run
    (made,) = (here / "out").glob("*.jsonl")
    rows = table.read_rows(made)
    assert [r["case_id"] for r in rows] == [WRONG_ID] and rows[0]["outcome"] == "wrong"
    assert json.loads((here / "s.json").read_text())["rows"] == 1

    assert cli.main(["repro", NONE_ID, "--target", "lib/adapter.py"]) == 1   # broken: wrong
    out, err = capfd.readouterr()
    assert "wrong" in out, out + err
    assert cli.main(["repro", NONE_ID, "--target", "./lib/adapter.py:make_target",
                     "--json"]) == 1
    assert json.loads(capfd.readouterr().out)["outcome"] == "wrong"

    rel = str(made.relative_to(here))
    assert cli.main(["report", "--results", rel, "--out", "r/report.html",
                     "--markdown", "r/report.md"]) == 0
    capfd.readouterr()
    assert (here / "r" / "report.html").stat().st_size > 0
    assert WRONG_ID in (here / "r" / "report.md").read_text()


@pytest.mark.system
def test_shrink_takes_a_relative_target_and_prints_each_trial(elsewhere, capfd):
    here, _ = elsewhere
    rc = cli.main(["shrink", WRONG_ID, "--target", "lib/adapter.py", "--max-trials", "2",
                   "--out-dir", "shrunk"])
    out, err = capfd.readouterr()
    assert rc == 0, out + err
    trials = [l for l in err.splitlines() if l.startswith("shrink: trial ")]
    assert trials[0] == "shrink: trial 1: the case as given -> wrong", err
    assert len(trials) == json.loads(out)["trials"] == 2, err
    assert list((here / "shrunk").glob("*.json")), "the shrunk case went elsewhere"


@pytest.mark.system
def test_bisect_takes_a_relative_repo_and_target(elsewhere, capfd):
    here, (good, bad) = elsewhere
    rc = cli.main(["bisect", NONE_ID, "--good", good, "--bad", bad, "--repo", "lib",
                   "--target", "lib/adapter.py", "--timeout", "300"])
    out, err = capfd.readouterr()
    assert rc == 0, out + err
    assert f"first bad commit: {bad} broken" in out, out + err


def test_a_target_name_or_module_is_not_a_path():
    assert cli.absolute_target("bundled") == "bundled"
    assert cli.absolute_target("mylib.adapter:make_target") == "mylib.adapter:make_target"
    assert cli.absolute_target("faults") == "faults"   # an alias (tests/conftest.py)
    assert cli.absolute_target("a/b.py:f") == str(Path("a/b.py").resolve()) + ":f"
