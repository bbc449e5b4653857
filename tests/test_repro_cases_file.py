"""`repro --cases-file F` / `--case-json F` read the file as `check --cases-file` does
(harness/model/cases_file.py): a misspelt route, an unknown feature or a string where a
list belongs is one line and exit 2 before any case runs, never a row of a case that
tested nothing."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.model.case import Case
from harness.model.cases_file import CasesFileError, load_file
from harness.tools.options import EXIT_USAGE
from harness.tools.repro import load_case_json

GOOD = {"route": "fa2.single_prefill", "family": "gqa", "variant": "q8_over_kv8",
        "params": {"causal": True, "dtype": "fp16", "head_dim": 64, "kv_lens": [5],
                   "num_kv_heads": 2, "num_qo_heads": 2, "qo_lens": [3], "return_lse": False,
                   "window_left": -1},
        "expect": "match", "refuse_words": [], "seed": 7, "tag": "t", "requires": []}


def _case(**changes) -> dict:
    record = json.loads(json.dumps(GOOD))
    record.update(changes)
    return record


def _write(tmp_path: Path, data, name="cases.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _repro(capsys, path: Path, option: str, case_id: str):
    """`harness repro` in this process (the file is refused before any child starts):
    (exit status, stdout, stderr)."""
    code = cli.main(["repro", case_id, option, str(path), "--json"])
    out = capsys.readouterr()
    return code, out.out, out.err


def _id(record: dict) -> str:
    return Case.from_json(record).id


@pytest.mark.parametrize("option", ["--cases-file", "--case-json"])
def test_a_misspelt_route_is_one_line_exit_2_before_any_case(tmp_path, capsys, option):
    bad = _case(route="fa2.single_prefil")
    code, out, err = _repro(capsys, _write(tmp_path, [bad] if option == "--cases-file" else bad),
                            option, _id(bad))
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert option in lines[0] and "'fa2.single_prefil'" in lines[0]
    assert "did you mean 'fa2.single_prefill'" in lines[0]
    assert out == ""          # no row: the case never ran


def test_an_unknown_feature_is_one_line_exit_2_before_any_case(tmp_path, capsys):
    bad = _case(requires=["plan_runn"])
    code, out, err = _repro(capsys, _write(tmp_path, bad), "--case-json", _id(bad))
    assert code == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "'requires' names 'plan_runn', not a feature" in lines[0]
    assert out == ""


def test_the_loader_refuses_what_check_refuses(tmp_path):
    routes = ("fa2.single_prefill", "fa2.batch_decode")
    refused = {
        "route": _case(route="fa2.single_prefil"),
        "'requires' must be a list of strings": _case(requires="plan_run"),
        "'refuse_words' must be a list of strings": _case(refuse_words=5),
        "'expect' must be one of": _case(expect="pass"),
        "'seed' must be a whole number": _case(seed=1.5),
        "unknown key(s) ['colour']": _case(colour="red"),
    }
    for words, record in refused.items():
        with pytest.raises(CasesFileError) as e:
            load_file(str(_write(tmp_path, [record])), "F", routes, "target 'bundled'")
        assert words in str(e.value) and "\n" not in str(e.value), (words, str(e.value))
    with pytest.raises(CasesFileError, match="also case 0's"):
        load_file(str(_write(tmp_path, [GOOD, GOOD])), "F", routes)
    with pytest.raises(CasesFileError, match="not a JSON list of cases"):
        path = tmp_path / "torn.json"
        path.write_text('[{"route": ')
        load_file(str(path), "F", routes)


def test_a_good_file_loads_as_a_list_or_one_object(tmp_path):
    as_list = load_case_json(str(_write(tmp_path, [GOOD])), "bundled", "--cases-file")
    as_object = load_case_json(str(_write(tmp_path, GOOD, "one.json")), "bundled")
    assert [c.id for c in as_list] == [c.id for c in as_object] == [_id(GOOD)]
    assert as_list[0].params == GOOD["params"]
    # Without a target the route is not checked (any target's route may be named) ...
    other = _case(route="fa3.single_prefill")
    assert load_case_json(str(_write(tmp_path, other, "o.json")))[0].route == other["route"]
    # ... and with one it is.
    with pytest.raises(CasesFileError, match="not a route of target"):
        load_case_json(str(_write(tmp_path, other, "o.json")), "bundled")
