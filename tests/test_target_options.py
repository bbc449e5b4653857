"""Options owned by targets (harness/model/target_options.py): a target declares an option in
its descriptor, and the engine carries it without naming it. A throwaway option declared by
a test target here travels from its flag to the row with no edit anywhere in harness/."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fault_target import FaultsTarget, fault_case
from harness import cli
from harness.engine import child
from harness.model import target_options
from harness.model.target_options import TargetOption

HARNESS = Path(__file__).resolve().parent.parent / "harness"
KNOB = TargetOption("throwaway_knob", help="a test-only option", label="knob set",
                    env="HARNESS_TEST_KNOB")
SPEC = "test_target_options:make_target"


class KnobTarget(FaultsTarget):
    name = "knob"
    options = (KNOB,)

    def check_option(self, name: str, value: str) -> None:
        if value == "bad":
            raise ValueError(f"{KNOB.flag}: {value!r} is not a knob setting")


def make_target() -> KnobTarget:
    return KnobTarget()


@pytest.fixture
def knob(monkeypatch):
    """KNOB declared as an in-tree target's option would be (its descriptor's OPTIONS)."""
    import harness.targets.descriptors as descriptors
    real = descriptors.declared_options
    monkeypatch.setattr(descriptors, "declared_options", lambda: (*real(), KNOB))
    # Restored after the test, whatever the option's target sets.
    monkeypatch.setenv(KNOB.env, "")
    monkeypatch.setenv(target_options.ENV, "")


def _cases_file(tmp_path) -> str:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([fault_case("none").to_json()]))
    return str(path)


def test_a_declared_option_travels_from_its_flag_to_the_row(knob, capsys, tmp_path):
    rc = cli.main(["repro", fault_case("none").id, "--target", SPEC, "--throwaway-knob", "on",
                   "--cases-file", _cases_file(tmp_path), "--in-process", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["throwaway_knob"] == "on" and os.environ[KNOB.env] == "on"


def test_a_bad_value_is_the_targets_one_line_refusal_before_any_case(knob, capsys, tmp_path):
    rc = cli.main(["repro", fault_case("none").id, "--target", SPEC, "--throwaway-knob", "bad",
                   "--cases-file", _cases_file(tmp_path), "--in-process", "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "repro: --throwaway-knob: 'bad' is not a knob setting"
    assert os.environ[KNOB.env] == ""


def test_the_child_spec_carries_an_option_it_never_names(knob, capsys, tmp_path):
    spec = child.Spec(target=SPEC, cases=[fault_case("none")], throwaway_knob="on")
    assert spec.options == {"throwaway_knob": "on"}
    back = child.Spec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back.options == {"throwaway_knob": "on"}
    assert child.serve(back, str(tmp_path)) == 0
    rows = [json.loads(line[len(child.ROW_PREFIX):]) for line in capsys.readouterr().out
            .splitlines() if line.startswith(child.ROW_PREFIX)]
    assert [r["throwaway_knob"] for r in rows] == ["on"]


def test_a_child_without_options_of_its_own_applies_the_runs(knob, capsys, tmp_path,
                                                            monkeypatch):
    # What a culprit replay's child gets: the run's options, handed down by its controller.
    monkeypatch.setenv(target_options.ENV, target_options.to_env({"throwaway_knob": "down"}))
    assert child.serve(child.Spec(target=SPEC, cases=[fault_case("none")]), str(tmp_path)) == 0
    row = next(json.loads(line[len(child.ROW_PREFIX):]) for line in
               capsys.readouterr().out.splitlines() if line.startswith(child.ROW_PREFIX))
    assert row["throwaway_knob"] == "down"


def test_check_hands_the_option_to_its_pytest_child_which_declares_it(knob):
    from harness.engine.plugins import options as plugin_options
    from harness.tools import check
    args = cli.build_parser(["check"]).parse_args(["check", "--throwaway-knob", "on"])
    assert "--throwaway-knob=on" in check.pytest_command(args)
    added = []

    class Group:
        def addoption(self, flag, **kw):
            added.append((flag, kw.get("dest")))

    class Parser:
        def getgroup(self, *a, **kw):
            return Group()
    plugin_options.pytest_addoption(Parser())
    assert ("--throwaway-knob", "throwaway_knob") in added
    assert ("--disable-guards", "disable_guards") in added


def test_a_row_s_options_make_its_repro_command():
    from harness.results.repro_command import options_of, repro_args
    row = {"case_id": "c", "target": "bundled", "disable_guards": '["a", "b"]'}
    assert options_of(row) == {"disable_guards": "a,b"}
    assert repro_args("c", "bundled", options_of(row)) == ["repro", "c", "--disable-guards", "a,b"]
    assert options_of({"case_id": "c", "disable_guards": float("nan")}) == {}


def test_an_option_the_target_does_not_take_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^--disable-guards: target 'knob' does not take it"):
        KnobTarget().validate_options({"disable_guards": "all"})


def test_the_tables_option_columns_are_the_declared_options():
    from harness.results.table import COLUMNS, OPTION_COLUMNS
    from harness.targets.descriptors import declared_options
    assert sorted(OPTION_COLUMNS) == sorted(o.name for o in declared_options())
    assert set(OPTION_COLUMNS) <= set(COLUMNS)


def test_only_the_bundled_target_and_one_pass_through_name_its_option():
    named = sorted(str(p.relative_to(HARNESS.parent)) for p in HARNESS.rglob("*.py")
                   if "disable_guards" in p.read_text(encoding="utf-8"))
    assert len(named) <= 3, named
    # The descriptor declares and judges it; the table names its column.
    assert named == ["harness/results/columns.py", "harness/targets/descriptors/bundled.py"]
