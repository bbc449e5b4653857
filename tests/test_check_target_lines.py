"""check-target names the case id of every failing row (not only the adapter's errors)."""
from __future__ import annotations

from harness import cli
from harness.tools import check_target


def test_every_failing_row_is_named_by_its_case_id(monkeypatch, capsys):
    def rows_of(spec, cases):
        outcomes = ["hang", "wrong", "harness_error"]
        return [{"case_id": c.id, "outcome": o, "pass": o == "match",
                 "message": f"{o}\nsecond line" if o != "match" else ""}
                for c, o in zip(cases, outcomes)]
    monkeypatch.setattr(check_target, "run_all", rows_of)
    assert cli.main(["check-target", "faults"]) == 1
    out = capsys.readouterr().out
    ids = [line.split()[1].rstrip(":") for line in out.splitlines()[1:]
           if line.startswith("  ") and not line.startswith("  adapter skip")]
    from harness.targets import load_target
    cases = check_target.selection(load_target("faults"), check_target.PER_FAMILY_ROUTE)
    assert len(cases) == 3 and sorted(ids) == sorted(c.id for c in cases), out
    assert "wrong second line" in out            # the message on its one line
    assert out.count(cases[2].id) == 1            # the harness_error is named once
    # Without an adapter error: the library's failing rows are still each named.
    monkeypatch.setattr(check_target, "run_all", lambda spec, cases: [
        {"case_id": c.id, "outcome": "wrong", "pass": False, "message": "m"} for c in cases])
    assert cli.main(["check-target", "faults"]) == 0
    out = capsys.readouterr().out
    assert all(f"wrong          {c.id}: m" in out for c in cases), out
    assert out.rstrip().endswith("3 failing row(s), named above, are the library's findings")
