import json

import pandas as pd
import pytest

from harness.results.ledger import DEFAULT_PATH, apply_ledger, apply_ledger_per_arch, load_ledger


def rows():
    return pd.DataFrame([
        {"arch": "gfx942", "case_id": "a", "outcome": "wrong", "pass": False},
        {"arch": "gfx942", "case_id": "b", "outcome": "match", "pass": True},
        {"arch": "gfx950", "case_id": "a", "outcome": "wrong", "pass": False},
        {"arch": "gfx942", "case_id": "c", "outcome": "crash", "pass": False},
    ])


def write(tmp_path, entries):
    path = tmp_path / "known_failures.json"
    path.write_text(json.dumps(entries))
    return path


def entry(case_id, outcome="wrong", arch="gfx942", reason="CK tile bug, upstream #12"):
    return {"arch": arch, "case_id": case_id, "outcome": outcome, "reason": reason}


def test_matching_entry_passes_row_with_reason(tmp_path):
    path = write(tmp_path, [entry("a")])
    df, errors = apply_ledger(rows(), "gfx942", path)
    assert errors == []
    a = df[(df.arch == "gfx942") & (df.case_id == "a")].iloc[0]
    assert a["pass"] and a["ledger"] == "CK tile bug, upstream #12"
    # Another arch's row with the same case is untouched.
    assert not df[(df.arch == "gfx950") & (df.case_id == "a")].iloc[0]["pass"]


def test_applying_twice_changes_nothing(tmp_path):
    path = write(tmp_path, [entry("a")])
    once, _ = apply_ledger(rows().assign(expect="match"), "gfx942", path)
    twice, errors = apply_ledger(once, "gfx942", path)
    assert errors == [] and twice.equals(once)


def test_stale_entry_says_remove(tmp_path):
    path = write(tmp_path, [entry("b")])
    _, errors = apply_ledger(rows(), "gfx942", path)
    assert len(errors) == 1 and "remove the entry" in errors[0] and "(case now passes" in errors[0]


def test_other_outcome_is_not_excused(tmp_path):
    path = write(tmp_path, [entry("c", outcome="wrong")])
    df, errors = apply_ledger(rows(), "gfx942", path)
    assert not df[df.case_id == "c"].iloc[0]["pass"]
    assert "expects 'wrong'" in errors[0] and "'crash'" in errors[0]


@pytest.mark.parametrize("bad, words", [
    ([{"arch": "gfx942", "case_id": "a", "outcome": "wrong"}], "entry 0 (a): field 'reason'"),
    ([entry("a", reason="  ")], "field 'reason'"),
    ([{"case_id": "a", "outcome": "wrong", "reason": "r"}], "field 'arch'"),
    ([entry("a", outcome="bogus")], "field 'outcome'"),
    ({"a": 1}, "JSON list"),
    ([entry("a"), entry("a")], "second entry"),
])
def test_malformed_ledger_names_file_and_field(tmp_path, bad, words):
    path = write(tmp_path, bad)
    with pytest.raises(ValueError) as info:
        apply_ledger(rows(), "gfx942", path)
    assert str(path) in str(info.value) and words in str(info.value)


def test_checked_in_ledger_is_valid():
    for e in load_ledger(DEFAULT_PATH):
        assert e["reason"].strip()


def test_ledger_per_arch_applies_each_arch_its_own_entries(tmp_path):
    import json

    import pandas as pd

    from harness.results.ledger import apply_ledger_per_arch
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps([{"arch": "gfx942", "case_id": "r.op/f.v", "outcome": "wrong",
                                 "reason": "known on gfx942 only"}]))
    df = pd.DataFrame([
        {"arch": "gfx942", "case_id": "r.op/f.v", "outcome": "wrong", "expect": "match", "pass": False},
        {"arch": "gfx950", "case_id": "r.op/f.v", "outcome": "wrong", "expect": "match", "pass": False},
    ])
    out, errors = apply_ledger_per_arch(df, path)
    assert errors == []
    assert out.set_index("arch")["pass"].to_dict() == {"gfx942": True, "gfx950": False}


def test_entries_apply_per_target(tmp_path):
    import json
    import pandas as pd
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps([{"target": "torch-sdpa", "arch": "cpu", "case_id": "a/b.c/d",
                                 "outcome": "crash", "reason": "reviewed"}]))
    rows = pd.DataFrame([
        {"target": "torch-sdpa", "arch": "cpu", "case_id": "a/b.c/d", "outcome": "crash",
         "pass": False, "expect": "match"},
        {"target": "bundled", "arch": "cpu", "case_id": "a/b.c/d", "outcome": "crash",
         "pass": False, "expect": "match"}])
    out, errors = apply_ledger_per_arch(rows, path)
    assert not errors
    by_target = out.set_index("target")["pass"].to_dict()
    assert by_target == {"torch-sdpa": True, "bundled": False}


def test_an_entry_may_name_the_outcomes_a_case_takes_from_run_to_run(tmp_path):
    path = write(tmp_path, [entry("a", outcome="crash|wrong"), entry("c", outcome="silent|wrong")])
    df, errors = apply_ledger(rows(), "gfx942", path)
    a = df[(df.case_id == "a") & (df.arch == "gfx942")].iloc[0]
    assert a["pass"] and a["ledger"]
    # c crashed, an outcome its entry does not name: still failing, and said so.
    assert not df[df.case_id == "c"].iloc[0]["pass"]
    assert any("c on" in e and "crash" in e for e in errors), errors
    with pytest.raises(ValueError, match="outcome"):
        load_ledger(write(tmp_path, [entry("a", outcome="crash|nosuch")]))
