"""The workflow reads the tables a run writes: the latest full run's copy, by its name."""
from __future__ import annotations

import platform
import re
from pathlib import Path

from harness.results.table import latest_path

CI = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "ci.yml"


def _step(text: str, name: str) -> str:
    start = text.index(f"- name: {name}")
    nxt = text.find("\n      - ", start + 1)
    return text[start:nxt if nxt > 0 else None]


def test_compare_reads_the_latest_full_run_tables_by_name():
    text = CI.read_text()
    compare = _step(text, "Compare base vs head")
    head = re.search(r"--head (\S+)", compare).group(1)
    base = re.search(r"--base (\S+)", compare).group(1)
    # The names latest_path gives (results/<target>-<arch>.jsonl), not a glob that also
    # matches every commit's and every partial run's table.
    assert head == str(latest_path("bundled", '"$ARCH"')) and "*" not in head
    assert base == "base-results/bundled-\"$ARCH\".jsonl"
    for step in ("Base table from the base branch's latest run",
                 "Base table from make check on the base checkout"):
        assert 'bundled-"$ARCH".jsonl base-results/' in _step(text, step)
        assert "*.jsonl base-results/" not in _step(text, step)


def test_the_cpu_job_writes_the_step_summary_from_its_full_table():
    from harness.model import platform_info
    step = _step(CI.read_text(), "Step summary, JUnit XML and summary JSON")
    assert "harness.tools.ci_outputs" in step and "--junitxml" in step and "--summary-json" in step
    table = re.search(r"table=(.+)$", step, re.M).group(1).strip()
    # On the host the arch is cpu-<machine>, which the step spells with uname -m.
    assert platform_info.arch() == f"cpu-{platform.machine()}"
    assert table.replace("$(uname -m)", platform.machine()) == \
        str(latest_path("bundled", platform_info.arch()))
