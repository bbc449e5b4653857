"""harness check starts its child before validating the run; the child waits, writes nothing,
until released, and exits having written nothing when the run is called off."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harness.engine.held_start import EXIT_CALLED_OFF, HeldChild

pytestmark = pytest.mark.system   # real processes: the subject of every test here

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import sys; from harness.engine.held_start import wait_for_go\n"
         "path = wait_for_go()\n"
         "open(sys.argv[1], 'w').write(repr(path))\n")


def start(marker: Path) -> HeldChild:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return HeldChild([sys.executable, "-c", CHILD, str(marker)], ROOT, env, quiet=True)


def test_a_child_whose_pipe_closes_exits_having_written_nothing(tmp_path):
    marker = tmp_path / "marker"
    child = start(marker)
    os.close(child._go)       # the parent died before go(): the pipe closes with it
    assert child.proc.wait(timeout=60) == EXIT_CALLED_OFF
    assert not marker.exists()


def test_a_released_child_gets_the_results_path(tmp_path):
    marker = tmp_path / "marker"
    child = start(marker)
    assert child.proc.poll() is None and not marker.exists()   # held
    child.go(tmp_path / "table.jsonl")
    assert child.proc.wait(timeout=60) == 0
    assert marker.read_text() == repr(str(tmp_path / "table.jsonl"))


def test_a_called_off_child_writes_nothing(tmp_path):
    marker = tmp_path / "marker"
    child = start(marker)
    child.call_off()
    assert child.proc.returncode is not None and child.proc.returncode != 0
    assert not marker.exists()
    assert not Path(child.log.name).exists()


def test_a_check_called_off_by_a_bad_option_leaves_no_table(tmp_path):
    import subprocess
    results = tmp_path / "r.jsonl"
    done = subprocess.run([sys.executable, "-m", "harness", "check", "--family", "nosuch",
                           "--results", str(results), "-n", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip().splitlines()[0]]
    assert "--family" in done.stderr and "nosuch" in done.stderr
    assert not results.exists()


REPORTING_CHILD = ("import sys, json; from harness.engine import held_start\n"
                   "held_start.send_report(json.loads(sys.argv[2]))\n"
                   "path = held_start.wait_for_go()\n"
                   "open(sys.argv[1], 'w').write(repr(path))\n")


def test_the_parent_reads_the_childs_report_before_it_lets_it_go(tmp_path):
    marker = tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    said = {"ids": ["a/b", "c/d"], "arch": "cpu-x", "owns_contract": True}
    child = HeldChild([sys.executable, "-c", REPORTING_CHILD, str(marker), json.dumps(said)],
                      ROOT, env, quiet=True)
    assert child.report() == said
    assert child.proc.poll() is None and not marker.exists()   # still held after reporting
    child.go(tmp_path / "t.jsonl")
    assert child.proc.wait(timeout=60) == 0
    assert marker.read_text() == repr(str(tmp_path / "t.jsonl"))


def test_a_child_that_ends_without_a_report_gives_none(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = HeldChild([sys.executable, "-c", "raise SystemExit(3)"], ROOT, env, quiet=True)
    assert child.report() is None
    assert child.proc.wait(timeout=60) == 3
    child.call_off()


def test_the_check_parent_never_imports_torch_or_a_target(tmp_path):
    """The child does the selection; the parent only waits, then reads the table."""
    import subprocess
    results = tmp_path / "r.jsonl"
    script = ("import sys\n"
              "for name in ('torch', 'kernels', 'harness.targets.bundled'):\n"
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


def test_the_controller_plugin_loads_without_torch():
    # Under `harness check -n N` the workers are spawned before the controller works out the
    # run; that only overlaps their torch import with its own if its plugin loads without it.
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


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_called_off_run_with_workers_leaves_no_process_behind(tmp_path):
    import subprocess
    import uuid
    mark = f"HELD_TEST_MARK={uuid.uuid4().hex}"
    key, value = mark.split("=")
    done = subprocess.run([sys.executable, "-m", "harness", "check", "-n", "2", "--family",
                           "no_such_family", "--results", str(tmp_path / "r.jsonl")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **{key: value}))
    assert done.returncode == 2 and "no_such_family" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "r.jsonl").exists()
    assert _processes_marked(mark) == []
