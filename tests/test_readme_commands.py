"""The manual's commands and case ids stay true: every case id README.md and docs/*.md name
exists, and the quick example commands of docs/commands.md run as written, from another
folder, through the `harness` console script (those runs are the system tier)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
# Every page a reader is sent to: README.md and the manual under docs/.
README = "\n".join(p.read_text(encoding="utf-8")
                   for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
# route/family.variant/tag: `fa2.paged_prefill/strided.q_stride2/bf16-d128-h4x2-p16-nhd`
CASE_ID = re.compile(r"\b[a-z0-9_]+\.[a-z0-9_]+/[a-z0-9_]+\.[A-Za-z0-9_.]+/[A-Za-z0-9_.-]+")
TARGETS = ("bundled", "faults", "tests/fault_target.py", "torch-sdpa")
# Commands quick enough for the test suite; the others (a full family, shrink, bisect) are
# checked for their case ids only.
QUICK = ("harness list", "harness check --target tests/fault_target.py", "harness repro")


def commands_section() -> str:
    start = COMMANDS.index("## Examples\n")
    end = COMMANDS.index("\n## ", start + 1)
    return COMMANDS[start:end]


def example_commands() -> list[tuple[str, int]]:
    """(command, expected exit status) for each line of the section's example blocks
    without placeholders; a comment saying `exit N` gives the status, else 0."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", commands_section(), re.S):
        for line in block.splitlines():
            command, _, comment = line.partition("  #")
            command = command.strip()
            if not command.startswith("harness ") or re.search(r"[A-Z_]{3,}|\[", command):
                continue  # a synopsis line (CASE_ID, [--family F]), not an example
            status = re.search(r"\bexit (\d+)", comment)
            out.append((command, int(status.group(1)) if status else 0))
    return out


@lru_cache(maxsize=None)
def listed(target: str) -> frozenset:
    """What `harness list --target TARGET` prints, through this process's cli.main (a
    fresh interpreter per target costs seconds and lists the same ids)."""
    import contextlib
    import io

    from harness import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["list", "--target", target])
    assert rc == 0, err.getvalue()[-2000:]
    return frozenset(out.getvalue().split())


def test_readme_names_case_ids():
    assert CASE_ID.findall(README), "the manual names no case id; the pattern is out of date"


@pytest.mark.parametrize("case_id", sorted(set(CASE_ID.findall(README))))
def test_every_case_id_in_the_readme_exists(case_id):
    route = case_id.split("/", 1)[0]
    for target in TARGETS:
        ids = listed(target)
        if any(i.startswith(route + "/") for i in ids):
            assert case_id in ids, f"the manual names {case_id}, which `harness list --target " \
                                   f"{target}` does not list"
            return
    pytest.fail(f"the manual names {case_id}: no target has route {route}")


@pytest.fixture(scope="module")
def harness_on_path(tmp_path_factory) -> dict:
    """An environment whose PATH finds `harness`: the console script `make setup`
    installs beside this interpreter, else a stand-in that runs this checkout."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "harness").exists():
        bin_dir = tmp_path_factory.mktemp("bin")
        (bin_dir / "harness").write_text(
            f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m harness "$@"\n')
        (bin_dir / "harness").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_the_commands_section_has_quick_examples():
    quick = [c for c, _ in example_commands() if c.startswith(QUICK)]
    assert any(c.startswith("harness list") for c in quick), example_commands()
    assert any(c.startswith("harness check --target tests/fault_target.py") for c in quick), example_commands()


@pytest.mark.system   # a fresh console script per command, as a reader types it
@pytest.mark.parametrize("command,status", [c for c in example_commands() if c[0].startswith(QUICK)],
                         ids=[c for c, _ in example_commands() if c.startswith(QUICK)])
def test_readme_command_runs_as_written(command, status, harness_on_path, tmp_path):
    # The manual's commands are typed in the checkout, and a relative --target file is
    # resolved where it is typed: the folder they run in holds the files they name (copied,
    # so their tables land in tmp_path, not in the checkout).
    for name in re.findall(r"(?:^|\s)(tests/[\w./-]+\.py)", command):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=harness_on_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == status, f"{command}: exit {proc.returncode}\n" \
                                      f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.strip(), f"{command} printed nothing"
    if command.startswith("harness check"):
        tables = list((tmp_path / "results").glob("*.jsonl"))
        assert tables and f"results: {tables[0]}" in proc.stdout, proc.stdout[-2000:]
