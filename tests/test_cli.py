import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli, table
from harness.targets.faults import FAULTS

ROOT = Path(__file__).resolve().parent.parent


def test_list_prints_ids_and_count(capsys):
    assert cli.main(["list", "--target", "faults"]) == 0
    out, err = capsys.readouterr()
    ids = out.split()
    assert len(ids) == len(FAULTS) and ids[0] == "faults.single_prefill/faults.none/n0"
    assert f"{len(FAULTS)} cases" in err
    assert cli.main(["list", "--target", "faults", "--case-id", "no-such"]) == 4


def test_repro_exit_codes(capsys):
    assert cli.main(["repro", "faults.single_prefill/faults.none/n0", "--target", "faults"]) == 0
    assert "outcome" in capsys.readouterr().out
    assert cli.main(["repro", "faults.single_prefill/faults.wrong/n0", "--target", "faults",
                     "--json"]) == 1
    row = json.loads(capsys.readouterr().out)
    assert row["outcome"] == "wrong" and row["n_wrong"] == 16
    assert cli.main(["repro", "faults.single_prefill/faults.wrng/n0", "--target", "faults"]) == 4
    err = capsys.readouterr().err
    assert "unknown case id" in err and "faults.single_prefill/faults.wrong/n0" in err


def test_repro_build_failure_is_exit_5(monkeypatch, capsys):
    class BuildError(RuntimeError):
        pass

    def broken(name):
        raise BuildError("host build failed (g++, exit 1)")

    monkeypatch.setattr("harness.targets.load_target", broken)
    case_file = Path(__file__).parent / "_repro_case.json"
    try:
        from harness.targets.faults import fault_case
        case_file.write_text(json.dumps([fault_case("none").to_json()]))
        assert cli.main(["repro", fault_case("none").id, "--case-json", str(case_file)]) == 5
    finally:
        case_file.unlink()
    assert "build failed" in capsys.readouterr().err


def test_missing_plugin_module_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "shrink", ("harness.no_such_module", "add_arguments",
                                                    "main", "x"))
    assert cli.main(["shrink", "some/case"]) == 2
    assert "harness.no_such_module is not available" in capsys.readouterr().err
    # the other subcommands still parse
    assert cli.main(["list", "--target", "faults", "--case-id", "none"]) == 0


def test_check_summarizes_and_exits_by_rows(tmp_path):
    results = tmp_path / "r.jsonl"
    base = [sys.executable, "-m", "harness", "check", "--target", "faults", "-n", "1",
            "--results", str(results)]
    ok = subprocess.run(base + ["--case-id", "none"], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "1 cases, 0 failing" in ok.stdout and "faults.single_prefill" in ok.stdout
    bad = subprocess.run(base + ["--case-id", "wrong", "--disable-guards", "g1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout[-2000:]
    assert "1 failing row(s)" in bad.stdout
    assert "faults.single_prefill/faults.wrong/n0: wrong, max|diff| 1, wrong 16/16" in bad.stdout
    # --disable-guards: the "before" table, and no reruns of a known-bad library
    assert "| Route | Case | Result |" in bad.stdout
    rows = table.read_rows(results)
    assert len(rows) == 1 and rows[0]["reruns"] == 0 and rows[0]["disable_guards"] == "g1"


def test_before_after_table_markdown():
    df = pd.DataFrame([
        {"route": "fa2.single_prefill", "case_id": "fa2.single_prefill/strided.q/bf16",
         "outcome": "wrong", "pass": False, "max_abs_diff": 0.98, "n_wrong": 7503,
         "n_total": 8192, "message": "a|b"},
        {"route": "fa2.single_prefill", "case_id": "fa2.single_prefill/valid.x/bf16",
         "outcome": "match", "pass": True, "max_abs_diff": 0.0, "n_wrong": 0, "n_total": 10,
         "message": ""},
    ])
    md = cli.before_after_table(df)
    lines = md.strip().splitlines()
    assert len(lines) == 3
    assert lines[2] == ("| fa2.single_prefill | strided.q/bf16 | wrong | 0.98 | 7503/8192 "
                        "| a\\|b |")
    assert len(cli.before_after_table(df, failing_only=False).strip().splitlines()) == 4
    assert "No failing rows" in cli.before_after_table(df[df["pass"]])


@pytest.mark.parametrize("argv,words", [
    (["--family", "nosuch"], ["--family", "nosuch", "valid"]),
    (["--target", "nosuch"], ["--target", "nosuch", "bundled"]),
    (["--route", "fa2.single_prefill,fa9.x"], ["--route", "fa9.x", "fa2.paged_prefill"]),
    (["--disable-guards", "gqa_divisible,nosuch"], ["--disable-guards", "nosuch", "gqa_divisible"]),
    (["--case-id", "zzz"], ["no cases selected", "--case-id zzz"]),
], ids=["family", "target", "route", "disable_guards", "empty_selection"])
def test_check_refuses_bad_options_naming_field_and_values(argv, words, capsys):
    from harness.cli import main
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def test_check_with_a_missing_library_is_a_usage_error(monkeypatch, capsys):
    import harness.plugin
    from harness.cli import main

    def no_library(*args, **kwargs):
        raise RuntimeError("flashinfer target: `pip install flashinfer-python`")
    monkeypatch.setattr(harness.plugin, "select_cases", no_library)
    assert main(["check", "--target", "flashinfer"]) == 2
    assert "pip install flashinfer-python" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["list", "--family", "nosuch"], ["list:", "--family", "nosuch", "valid"]),
    (["list", "--target", "nosuch"], ["list:", "--target", "nosuch", "bundled"]),
    (["list", "--route", "fa9.x"], ["list:", "--route", "fa9.x", "fa2.paged_prefill"]),
    (["list", "--cases-file", "/no/such/cases.json"], ["list:", "/no/such/cases.json"]),
    (["check", "--cases-file", "/no/such/cases.json"], ["check:", "/no/such/cases.json"]),
    (["repro", "x", "--target", "nosuch"], ["repro:", "--target", "nosuch", "bundled"]),
    (["repro", "x", "--case-json", "/no/such/case.json"], ["repro:", "/no/such/case.json"]),
    (["repro", "faults.single_prefill/faults.none/n0", "--target", "bundled",
      "--disable-guards", "nosuch"], ["repro:", "--disable-guards", "nosuch", "gqa_divisible"]),
], ids=["list-family", "list-target", "list-route", "list-cases-file", "check-cases-file",
        "repro-target", "repro-case-json", "repro-disable-guards"])
def test_list_and_repro_refuse_bad_options_naming_field_and_values(argv, words, capsys,
                                                                  monkeypatch):
    # An unknown guard name must not reach the library: it would refuse the call,
    # and the row would record that as the case's own refusal.
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS", raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert "KERNELS_DISABLE_GUARDS" not in os.environ


def _check(*args, cwd=ROOT):
    cmd = [sys.executable, "-m", "harness", "check", "--target", "faults", "-n", "1", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("how", [("--repeat", "2"), ("--reruns", "2")], ids=["repeat", "reruns"])
def test_check_with_the_flaky_fault_fails_as_nondeterministic(tmp_path, how):
    results = tmp_path / "r.jsonl"
    proc = _check("--case-id", "flaky", "--results", str(results), *how)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = table.read_rows(results)
    assert row["outcome"] == "nondeterministic" and not row["pass"], row
    assert row["severity"] == "correctness"
    assert [a["outcome"] for a in row["attempts"]] == ["wrong", "match"]
    assert "1 correctness" in proc.stdout


def test_partial_run_writes_its_own_table_under_the_current_folder(tmp_path):
    proc = _check("--case-id", "none", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(written) == 1 and written[0].startswith("faults-")
    assert written[0].endswith(".partial-case=none.jsonl"), written
    assert "partial run" in proc.stdout


def test_capability_findings_gate_only_a_target_that_owns_its_contract():
    import pandas as pd
    df = pd.DataFrame([
        {"pass": False, "severity": "capability"}, {"pass": False, "severity": "clarity"},
        {"pass": True, "severity": ""}])
    assert len(cli.gating(df, target_owns_contract=False, strict=False)) == 0
    assert len(cli.gating(df, target_owns_contract=False, strict=True)) == 2
    assert len(cli.gating(df, target_owns_contract=True, strict=False)) == 2
    wrong = pd.concat([df, pd.DataFrame([{"pass": False, "severity": "correctness"}])])
    assert len(cli.gating(wrong, target_owns_contract=False, strict=False)) == 1
