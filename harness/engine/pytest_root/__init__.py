"""The pytest root of a case run: the folder `harness check` hands its child pytest.

`pytest harness/engine/pytest_root -n auto --target T` is the same session `harness check`
starts: conftest.py loads the harness plugin (options, rows, crash isolation) and
test_matrix.py has the one test the plugin parametrizes with every selected case. It lives
in the engine, beside the plugin it drives, so `cases/` holds case families only.
"""
from __future__ import annotations

from pathlib import Path

PATH = Path(__file__).resolve().parent
