"""bisect names the commit that changed a case's outcome.

The first tests use a stub `harness` package in a throwaway repo, so they
check the git mechanics (good/bad/skip/crash, reset on exit) in a second.
The last one bisects a copy of this project whose history disables a guard.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tools.bisect import bisect

pytestmark = pytest.mark.system   # real processes: the subject of every test here

ROOT = Path(__file__).resolve().parent.parent

STUB = '''
import os, signal, sys
state = open("state.txt").read().strip()
if sys.argv[1:3] != ["repro", "the/case"]:
    sys.exit(4)
if state == "crash":
    os.kill(os.getpid(), signal.SIGSEGV)
sys.exit({"good": 0, "bad": 1, "nobuild": 5}[state])
'''


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "ci@example.invalid")
    git(path, "config", "user.name", "ci")
    git(path, "config", "commit.gpgsign", "false")
    return path


def commit(repo: Path, subject: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


def stub_repo(tmp_path, states):
    repo = init_repo(tmp_path / "repo")
    shas = [commit(repo, f"step {i}: {s}", {"harness/__init__.py": "", "harness/__main__.py": STUB,
                                              "state.txt": s, "step.txt": str(i)})
            for i, s in enumerate(states)]
    return repo, shas


@pytest.mark.parametrize("states, culprit", [
    (["good", "good", "bad", "bad", "bad"], 2),
    (["good", "good", "good", "crash", "crash"], 3),
    (["good", "nobuild", "good", "bad", "bad"], 3),
])
def test_bisect_names_first_bad_commit(tmp_path, states, culprit):
    repo, shas = stub_repo(tmp_path, states)
    result = bisect(repo, shas[0], shas[-1], "the/case", cache_dir=str(tmp_path / "cache"))
    assert result["commit"] == shas[culprit], result["output"]
    assert result["subject"] == f"step {culprit}: {states[culprit]}"
    assert git(repo, "rev-parse", "HEAD") == shas[-1]  # reset back to where it was
    assert subprocess.run(["git", "-C", str(repo), "bisect", "log"], capture_output=True).returncode != 0


def test_bisect_lists_candidates_when_skips_hide_the_culprit(tmp_path):
    repo, shas = stub_repo(tmp_path, ["good", "nobuild", "bad", "bad"])
    result = bisect(repo, shas[0], shas[-1], "the/case", cache_dir=str(tmp_path / "cache"))
    assert result["commit"] is None and set(result["candidates"]) == {shas[1], shas[2]}
    assert git(repo, "rev-parse", "HEAD") == shas[-1]


def test_bisect_refuses_dirty_tree(tmp_path):
    repo, shas = stub_repo(tmp_path, ["good", "bad"])
    (repo / "state.txt").write_text("edited")
    with pytest.raises(RuntimeError, match="uncommitted"):
        bisect(repo, shas[0], shas[-1], "the/case")


GUARDS = ROOT / "kernels" / "guards.py"
# Appended by one commit of the test history: the guard stays registered but never runs,
# which is the library before its fix.
DROP_GUARD = """

_disabled_before_drop = disabled


def disabled() -> set[str]:
    return _disabled_before_drop() | {{{name!r}}}
"""


def _project_copy(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", ".cache", "results", "out", "__pycache__",
                                    "*.egg-info", "build", ".whl", ".gl")
    shutil.copytree(ROOT, dest, ignore=ignore)
    return init_repo(dest)


def _strided_case():
    """A strided-q case on a cheap route: the last_dim_contiguous guard is what makes it pass."""
    from cases import generate
    ids = [c.id for c in generate(["strided"])
           if c.route == "fa2.single_prefill" and c.variant.startswith("q_")]
    assert ids, "cases/strided.py yields no fa2.single_prefill case strided on q"
    return ids[0]


def test_bisect_finds_commit_that_disables_a_guard(tmp_path):
    case_id = _strided_case()
    repo = _project_copy(tmp_path / "project")
    # A good commit before the culprit and a bad one after it, so git tests both sides;
    # each step is a real repro (seconds), and the search itself is the stub tests' part.
    shas = [commit(repo, "Project as it is", {})]
    shas.append(commit(repo, "Notes: one", {"NOTES.txt": "one\n"}))
    guards = GUARDS.read_text() + DROP_GUARD.format(name="last_dim_contiguous")
    shas.append(commit(repo, "Drop the last-dim stride guard", {"kernels/guards.py": guards}))
    shas.append(commit(repo, "Notes: two", {"NOTES.txt": "one\ntwo\n"}))
    result = bisect(repo, shas[0], shas[-1], case_id, timeout=300,
                    cache_dir=str(ROOT / ".cache" / "kernels"))
    assert result["commit"] == shas[2], result["output"]
    assert result["subject"] == "Drop the last-dim stride guard"
    assert git(repo, "rev-parse", "HEAD") == shas[-1]


OUTCOME_STUB = '''
import sys
state = open("state.txt").read().strip()
print("outcome  " + {"good": "match", "bad": "wrong"}.get(state, "crash"))
print("message  noise that is not a step line")
sys.exit({"good": 0, "bad": 1, "nobuild": 5}[state])
'''


def test_bisect_prints_one_line_per_step_as_it_goes(tmp_path, capsys):
    import argparse

    from harness.tools.bisect import main
    repo = init_repo(tmp_path / "repo")
    states = ["good", "nobuild", "good", "bad", "bad", "bad"]
    shas = [commit(repo, f"Change {i}", {"harness/__init__.py": "",
                                        "harness/__main__.py": OUTCOME_STUB, "state.txt": s,
                                        "step.txt": str(i)})
            for i, s in enumerate(states)]
    args = argparse.Namespace(repo=str(repo), good=shas[0], bad=shas[-1], case_id="the/case",
                              python=sys.executable, target=None,
                              timeout=60.0, cache_dir=str(tmp_path / "cache"))
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"first bad commit: {shas[3]} Change 3"
    lines = err.splitlines()
    ends = [line for line in lines if line.startswith(("bisect: --good ", "bisect: --bad "))]
    assert [line.split()[1] for line in ends] == ["--good", "--bad"]    # both ends, first
    assert lines[:2] == ends
    steps = [line.replace("bisect: --good ", "bisect: ").replace("bisect: --bad ", "bisect: ")
             for line in lines[2:]]
    short = {sha[:7]: (i, s) for i, (sha, s) in enumerate(zip(shas, states))}
    assert steps, err
    for line in steps:
        m = re.fullmatch(r"bisect: ([0-9a-f]{7,}) Change (\d) -> (good|bad|skip)(.*)", line)
        assert m, line
        i, state = short[m.group(1)[:7]]
        assert int(m.group(2)) == i
        expected = {"good": ("good", " (match)"), "bad": ("bad", " (wrong)"),
                    "nobuild": ("skip", " (library build failed)")}[state]
        assert (m.group(3), m.group(4)) == expected, line
    # every step git ran is there, the first included, and nothing else
    assert len(steps) == len(set(steps)) >= 2
    assert "noise" not in err


def _main(repo, good, bad, tmp_path):
    import argparse

    from harness.tools.bisect import main
    return main(argparse.Namespace(repo=str(repo), good=good, bad=bad, case_id="the/case",
                                   python=sys.executable, target=None,
                                   timeout=60.0, cache_dir=str(tmp_path / "cache")))


@pytest.mark.parametrize("states, good, bad, said", [
    (["bad", "bad", "bad"], 0, 2, "--good"),          # the case already fails at --good
    (["good", "good", "good"], 0, 2, "--bad"),        # and passes at --bad
    (["nobuild", "good", "bad"], 0, 2, "cannot be tested"),
    (["good", "bad", "nobuild"], 0, 2, "cannot be tested"),
])
def test_bisect_checks_both_ends_first(tmp_path, capsys, states, good, bad, said):
    repo, shas = stub_repo(tmp_path, states)
    assert _main(repo, shas[good], shas[bad], tmp_path) == 1
    out, err = capsys.readouterr()
    verdicts = [line for line in err.splitlines() if " -> " not in line]
    assert len(verdicts) == 1 and said in verdicts[0] and out == "", err
    assert "first bad commit" not in out
    assert git(repo, "rev-parse", "HEAD") == shas[-1]          # the checkout is put back
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert subprocess.run(["git", "-C", str(repo), "bisect", "log"], capture_output=True).returncode != 0


BROKEN_HARNESS = "raise ImportError('this commit cannot import the harness')\n"


def test_a_commit_where_the_harness_cannot_run_is_skipped(tmp_path):
    repo = init_repo(tmp_path / "repo")
    shas = []
    for i, state in enumerate(["good", "good", "broken", "bad", "bad"]):
        main_py = BROKEN_HARNESS if state == "broken" else STUB
        shas.append(commit(repo, f"step {i}: {state}", {
            "harness/__init__.py": "", "harness/__main__.py": main_py,
            "state.txt": "bad" if state == "broken" else state, "step.txt": str(i)}))
    result = bisect(repo, shas[0], shas[-1], "the/case", cache_dir=str(tmp_path / "cache"))
    skipped = [line for line in result["steps"] if "-> skip (the harness did not run" in line]
    assert skipped and "cannot import the harness" in skipped[0], result["steps"]
    # Skipped, not bad: git cannot tell step 2 from step 3, and says so.
    assert result["commit"] is None and set(result["candidates"]) == {shas[2], shas[3]}
