"""One option table: harness/engine/check_options.py's TABLE makes `harness check`'s argparse
options, the pytest plugin's addoption and the list check hands its pytest child."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from harness import cli
from harness.engine import check_options
from harness.engine.check_options import CheckOption
from harness.engine.plugins import options as plugin_options
from harness.tools import check


class _Group:
    def __init__(self):
        self.added: dict[str, dict] = {}

    def addoption(self, flag, **kw):
        self.added[flag] = kw


class _Parser:
    def __init__(self):
        self.group = _Group()

    def getgroup(self, *a, **kw):
        return self.group


def pytest_declared() -> dict[str, dict]:
    parser = _Parser()
    plugin_options.pytest_addoption(parser)
    return parser.group.added


def check_actions(argv=("check",)) -> dict[str, argparse.Action]:
    p = cli.build_parser(list(argv))
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: a for a in sub.choices[argv[0]]._actions for flag in a.option_strings}


def test_each_option_is_made_for_argparse_and_pytest_from_its_one_entry():
    actions, declared = check_actions(), pytest_declared()
    for opt in check_options.TABLE:
        if opt.cli:
            a = actions[opt.flag]
            assert (a.dest, a.help, a.default, a.choices) == (
                opt.dest, opt.help, False if opt.action else opt.default, opt.choices), opt.flag
            assert a.type is (None if opt.action else opt.type), opt.flag
        else:
            assert opt.flag not in actions
        if opt.pytest:
            kw = declared[opt.flag]
            assert (kw["dest"], kw["help"], kw.get("default"), kw.get("choices")) == (
                opt.dest, opt.help, None if opt.action else opt.default, opt.choices)
        else:
            assert opt.flag not in declared
    # `harness list` takes the selection alone.
    listed = check_actions(("list",))
    assert {o.flag for o in check_options.TABLE if o.selection} <= set(listed)
    assert "--resume" not in listed and "--case-timeout" not in listed


def test_the_pass_through_is_every_option_both_take_but_what_check_settles():
    assert [o.dest for o in check_options.handed()] == [
        "target", "family", "route", "case_id", "cases_file", "profile", "resume", "repeat",
        "case_timeout", "run_id", "max_case_bytes"]
    declared = pytest_declared()
    assert all(o.flag in declared for o in check_options.handed())
    args = cli.build_parser(["check"]).parse_args([
        "check", "--family", "valid", "--route", "fa2.single_prefill", "--case-id=-x",
        "--cases-file", "c.json", "--profile", "ci", "--resume", "--repeat", "2",
        "--case-timeout", "9", "--run-id", "r7", "--max-case-bytes", "1000",
        "--shard", "1/2", "--results", "t.jsonl"])
    cmd = check.pytest_command(args)
    for arg in ("--target=bundled", "--family=valid", "--route=fa2.single_prefill",
                "--case-id=-x", "--profile=ci", "--resume", "--repeat=2",
                "--case-timeout=9.0", "--run-id=r7", "--max-case-bytes=1000"):
        assert cmd.count(arg) == 1, (arg, cmd)
    assert any(a.startswith("--cases-file=/") and a.endswith("/c.json") for a in cmd)
    # check settles these itself: the table's path, and the shard through HARNESS_SHARD
    assert not any(a.startswith(("--results", "--shard")) for a in cmd), cmd
    plain = check.pytest_command(cli.build_parser(["check"]).parse_args(["check"]))
    assert "--resume" not in plain and not any(a.startswith("--family") for a in plain)


def test_a_new_option_is_one_entry(monkeypatch):
    extra = CheckOption("--throwaway-level", "a throwaway option", type=check_options.count(3))
    monkeypatch.setattr(check_options, "TABLE", check_options.TABLE + (extra,))
    assert pytest_declared()["--throwaway-level"]["help"] == "a throwaway option"
    args = cli.build_parser(["check"]).parse_args(["check", "--throwaway-level", "4"])
    assert args.throwaway_level == 4 and "--throwaway-level=4" in check.pytest_command(args)
    with pytest.raises(SystemExit) as stop:
        cli.build_parser(["check"]).parse_args(["check", "--throwaway-level", "2"])
    assert stop.value.code == 2


@pytest.mark.parametrize("argv,words", [
    (["--case-timeout", "0"], ["--case-timeout", "must be above 0 seconds, got '0'"]),
    (["--repeat", "0"], ["--repeat", "must be 1 or more, got 0"]),
    (["--max-case-bytes", "x"], ["--max-case-bytes", "must be a whole number, got 'x'"]),
    (["--shard", "3/2"], ["--shard"]),
    (["--profile", "most"], ["--profile", "invalid choice: 'most'"]),
], ids=["case-timeout", "repeat", "max-case-bytes", "shard", "profile"])
def test_the_command_line_still_judges_each_value_in_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["check", *argv])
    assert stop.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines


def test_pytest_reads_values_the_plugin_judges_itself():
    # The plugin's setup checks name a bad --case-timeout or --max-case-bytes in one line
    # before any case (plugins/options.py setup_errors); pytest only reads the number.
    declared = pytest_declared()
    assert declared["--case-timeout"]["type"] is float
    assert declared["--repeat"]["type"] is int and declared["--max-case-bytes"]["type"] is int
    assert "type" not in declared["--cases-file"]
    assert declared["--no-replay"]["action"] == "store_true"


def test_an_option_entry_is_frozen_and_names_its_dest():
    opt = CheckOption("--case-id", "x")
    assert opt.dest == "case_id"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.flag = "--other"   # type: ignore[misc]


def test_every_option_of_check_is_an_entry_of_the_table_or_a_targets():
    """No option of `harness check` is declared by hand beside the table: each flag is a
    TABLE entry (its own, pytest=False, included) or an in-tree target's option."""
    from harness.engine.session import declared_options
    flags = {f for f in check_actions() if f not in ("-h", "--help")}
    table = {o.flag for o in check_options.TABLE if o.cli}
    targets = {o.flag for o in declared_options()}
    assert flags == table | targets, sorted(flags ^ (table | targets))
    own = {o.flag for o in check_options.TABLE if o.cli and not o.pytest}
    assert {"-n", "--reruns", "--html", "--junitxml", "--summary-json", "--strict"} <= own
    assert not own & set(pytest_declared())   # pytest's own or check's alone: never the plugin's
