"""harness check starts its child before validating the run; the child waits, writes nothing,
until released, and exits having written nothing when the run is called off."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.held_start import EXIT_CALLED_OFF, HeldChild

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import sys; from harness.held_start import wait_for_go\n"
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
