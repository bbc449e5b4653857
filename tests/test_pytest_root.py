"""The case run's pytest root lives in the engine: `cases/` holds case families only, and
`harness check` hands its child pytest the engine's folder, whose conftest loads the plugin."""
from __future__ import annotations

import ast
from pathlib import Path

from harness import cli
from harness.engine import pytest_root
from harness.tools import check

CASES = Path(__file__).resolve().parents[1] / "cases"


def test_cases_holds_no_pytest_entry_point():
    found = sorted(p.name for p in CASES.iterdir()
                   if p.name == "conftest.py" or (p.name.startswith("test_") and p.suffix == ".py"))
    assert found == []


def test_check_runs_pytest_over_the_engines_root():
    args = cli.build_parser().parse_args(["check", "--target", "faults"])
    cmd = check.pytest_command(args)
    assert cmd[1:4] == ["-m", "pytest", str(pytest_root.PATH)], cmd[:5]


def test_the_root_loads_the_plugin_and_holds_the_one_test():
    conftest = ast.parse((pytest_root.PATH / "conftest.py").read_text())
    plugins = [n.value for n in ast.walk(conftest) if isinstance(n, ast.Assign)
               and any(getattr(t, "id", "") == "pytest_plugins" for t in n.targets)]
    assert plugins and ast.literal_eval(plugins[0]) == ["harness.engine.plugin"]
    matrix = ast.parse((pytest_root.PATH / "test_matrix.py").read_text())
    tests = [n.name for n in matrix.body if isinstance(n, ast.FunctionDef)]
    assert tests == ["test_case"]
