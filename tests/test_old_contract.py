"""An adapter written against an older contract still loads (harness/model/moved_modules.py), and one
that imports a harness module with no successor fails in one line naming it."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.model import moved_modules as _moved
from harness.targets import Target, TargetLoadError, load_target

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sdpa_target" / "sdpa_target.py"
NEW_IMPORT = "from harness.targets import Capabilities, Skip, Target"
# How an adapter of the flat layout imported the same names.
OLD_IMPORT = ("from harness.capabilities import Capabilities\n"
              "from harness.targets.base import Skip, Target\n"
              "from harness.problem import Problem  # noqa: F401")


def test_an_adapter_of_the_flat_layout_still_loads(tmp_path):
    text = EXAMPLE.read_text()
    assert NEW_IMPORT in text
    old = tmp_path / "old_adapter.py"
    old.write_text(text.replace(NEW_IMPORT, OLD_IMPORT))
    with pytest.warns(DeprecationWarning, match="harness.capabilities moved to "
                                                "harness.model.capabilities"):
        target = load_target(str(old))
    assert isinstance(target, Target)
    from harness.model.capabilities import Capabilities
    assert isinstance(target.capabilities, Capabilities)   # the same class, not a copy


def test_every_old_name_is_its_successor_module():
    import importlib
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old, new in _moved.MOVED.items():
            assert importlib.import_module(old) is importlib.import_module(new), old


def test_a_module_with_no_successor_fails_in_one_line(tmp_path):
    gone = tmp_path / "gone_adapter.py"
    gone.write_text("from harness.no_such_layer import Thing\n")
    with pytest.raises(TargetLoadError) as err:
        load_target(str(gone))
    line = str(err.value)
    assert "\n" not in line and "harness.no_such_layer" in line, line
