"""`harness check` works out the run in its own process (harness/engine/run_plan.py) before it
starts its pytest child: options that cannot make a run fail there, in one line, with no child
started and nothing written; the bundled target is planned without torch or the library."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_child(monkeypatch):
    """Fails the test if `harness check` starts its pytest child."""
    from harness.tools import check

    def refused(*a, **k):
        raise AssertionError("a pytest child was started for a run that cannot be made")
    monkeypatch.setattr(check, "start_child", refused)


@pytest.mark.parametrize("argv, code, words", [
    (["--family", "nosuch"], 2, ["--family", "nosuch"]),
    (["--route", "fa9.x"], 2, ["--route", "fa9.x"]),
    (["--disable-guards", "nosuch"], 2, ["--disable-guards", "nosuch"]),
    (["--case-timeout", "100000"], 2, ["--case-timeout", "1800"]),
    (["--case-id", "zzz"], 4, ["no cases selected", "--case-id zzz"]),
], ids=["family", "route", "option", "timeout", "empty"])
def test_a_run_that_cannot_be_made_is_one_line_before_any_child(argv, code, words, tmp_path,
                                                                 capsys, no_child):
    from harness.cli import main
    results = tmp_path / "r.jsonl"
    assert main(["check", "-n", "0", "--results", str(results), *argv]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not results.exists()


def test_the_plan_names_the_cases_the_child_runs_and_the_table_it_writes(tmp_path):
    from harness.engine import run_plan
    from harness.engine.session import select_cases
    opts = {"target": "bundled", "family": "gqa", "profile": "ci"}
    plan = run_plan.plan(opts.get)
    assert plan["ids"] == [c.id for c in select_cases("bundled", ["gqa"], profile="ci")]
    assert set(plan["costs"]) == set(plan["ids"]) and min(plan["costs"].values()) > 0
    assert plan["owns_contract"] is True and plan["target_name"] == "bundled"
    from harness.model.platform_info import arch
    assert plan["arch"] == arch()   # the table's name and the rows' arch agree


def test_a_shard_is_planned_as_its_share():
    from harness.engine import run_plan
    opts = {"target": "bundled", "family": "gqa", "profile": "ci"}
    whole = run_plan.plan(opts.get)["ids"]
    halves = [run_plan.plan(opts.get, f"{i}/2")["ids"] for i in (1, 2)]
    assert sorted(halves[0] + halves[1]) == sorted(whole) and not set(halves[0]) & set(halves[1])


@pytest.mark.system
def test_the_check_parent_never_imports_torch_or_a_target(tmp_path):
    """The parent plans the bundled run from its descriptor; the child runs it."""
    import subprocess
    results = tmp_path / "r.jsonl"
    script = ("import sys\n"
              "for name in ('torch', 'harness.targets.bundled'):\n"
              "    sys.modules[name] = None   # importing it now raises ImportError\n"
              "from harness.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", script, "check", "-n", "0", "--case-id",
                           "fa2.single_prefill/valid.grid/bf16-d64-h2x2-q1k1-full-nhd",
                           "--results", str(results)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["match"]
    assert "1 cases, 0 failing" in done.stdout


@pytest.mark.system
def test_the_controller_plugin_loads_without_torch():
    # The controller imports torch only where a case needs it: its workers' start-up is
    # their own.
    import subprocess
    script = ("import sys\n"
              "sys.modules['torch'] = None   # importing it now raises ImportError\n"
              "import harness.engine.plugin, harness.engine.controller\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]


def _processes_marked(mark: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.system
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_refused_run_with_workers_starts_no_process(tmp_path):
    import subprocess
    import uuid
    mark = f"PLAN_TEST_MARK={uuid.uuid4().hex}"
    key, value = mark.split("=")
    done = subprocess.run([sys.executable, "-m", "harness", "check", "-n", "2", "--family",
                           "no_such_family", "--results", str(tmp_path / "r.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **{key: value}))
    assert done.returncode == 2 and "no_such_family" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "r.jsonl").exists()
    assert _processes_marked(mark) == []


def test_all_cases_is_made_once_per_process_per_declaration():
    from harness.engine.session import all_cases
    from harness.targets import load_target
    from harness.targets.base import Target

    made = []

    class Counting(Target):
        name = "counting"
        routes = ("fa2.single_prefill",)

        def cases(self, families=None, profile="ci"):
            made.append(profile)
            return load_target("bundled").cases(["valid"], profile)[:3]

    first, again = all_cases(Counting()), all_cases(Counting())
    assert [c.id for c in first] == [c.id for c in again] and first
    calls = len(made)
    assert calls >= 1
    other = type("Other", (Counting,), {"name": "other"})
    all_cases(other())
    assert len(made) == 2 * calls   # another declaration: made afresh
