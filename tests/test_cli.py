import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness.results import summary
from harness.tools import check
from harness.results import table
from fault_target import FAULTS

ROOT = Path(__file__).resolve().parent.parent


def test_list_prints_ids_and_count(capsys):
    assert cli.main(["list", "--target", "faults"]) == 0
    out, err = capsys.readouterr()
    ids = out.split()
    assert len(ids) == len(FAULTS) and ids[0] == "faults.single_prefill/faults.none/n0"
    assert f"{len(FAULTS)} cases" in err
    assert cli.main(["list", "--target", "faults", "--case-id", "no-such"]) == 4


def test_repro_exit_codes(capsys, forked_children):
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
        from fault_target import fault_case
        case_file.write_text(json.dumps([fault_case("none").to_json()]))
        # --in-process: the patched load_target is this process's, not a child's
        assert cli.main(["repro", fault_case("none").id, "--case-json", str(case_file),
                         "--in-process"]) == 5
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


def _check(capfd, *args):
    """`harness check --target faults -n 0 ARGS` through this process's cli.main, as
    subprocess.run would return it (the child pytest's console included: capfd).

    These tests are about the command's console, exit status, paths and table. The cases
    still run in the child pytest check starts; `-n 0` runs them in that child, not in an
    xdist worker of it, and no second interpreter starts for the parent: each saves a
    start-up of about a second and a half. The command as a process of its own (Ctrl-C
    to its group, a closed stdout, README's commands from another folder) and the
    workers' crash isolation are tested as such, below, in test_readme_commands.py,
    test_isolation.py and test_plugin.py."""
    import types
    capfd.readouterr()
    rc = cli.main(["check", "--target", "faults", "-n", "0", *args])
    out, err = capfd.readouterr()
    return types.SimpleNamespace(returncode=rc, stdout=out, stderr=err)


@pytest.fixture
def none_then_wrong(tmp_path_factory, capfd):
    """`check --case-id none`, then `--case-id wrong --disable-guards g1` into the same
    table: the runs test_check_summarizes_and_exits_by_rows asserts on, the second of which
    test_check_prints_progress_and_no_pytest_failures_section asserts on too. Made once per
    session (shared_run.once) rather than once for each test: the same command gives both
    tests the same console and the same table."""
    import types

    from shared_run import once

    def make(folder):
        results = folder / "r.jsonl"
        ok = _check(capfd, "--results", str(results), "--case-id", "none")
        bad = _check(capfd, "--results", str(results), "--case-id", "wrong",
                     "--disable-guards", "g1")
        return {"ok": vars(ok), "bad": vars(bad), "rows": table.read_rows(results)}
    run = once(tmp_path_factory, "cli-none-then-wrong", make)
    return (types.SimpleNamespace(**run["ok"]), types.SimpleNamespace(**run["bad"]),
            run["rows"])


@pytest.mark.system
def test_check_summarizes_and_exits_by_rows(none_then_wrong):
    ok, bad, rows = none_then_wrong
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "1 cases, 0 failing" in ok.stdout and "faults.single_prefill" in ok.stdout
    assert bad.returncode == 1, bad.stdout[-2000:]
    # One failure class; the row's message (which has max|diff| and the counts) once.
    assert "1 failure class, worst first:" in bad.stdout
    (line,) = [l for l in bad.stdout.splitlines() if l.strip().startswith("faults.wrong")]
    assert "wrong" in line and line.count("max|diff|") == 1 and line.count("16/16") == 1
    assert "1 cases, 1 failing (1 correctness)" in bad.stdout
    # --disable-guards: the verdict and the classes, never the per-row table (that is the
    # Markdown report's), and no reruns of a known-bad library
    assert "| Route | Case | Result |" not in bad.stdout
    assert "FAIL: 1 distinct cause (1 correctness)" in bad.stdout
    assert "guards disabled: g1; --markdown FILE writes every failing row" in bad.stdout
    # The second run's table replaced the first's.
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
    md = summary.before_after_table(df)
    lines = md.strip().splitlines()
    assert len(lines) == 3
    assert lines[2] == ("| fa2.single_prefill | strided.q/bf16 | wrong | 0.98 | 7503/8192 "
                        "| a\\|b |")
    assert len(summary.before_after_table(df, failing_only=False).strip().splitlines()) == 4
    assert "No failing rows" in summary.before_after_table(df[df["pass"]])


@pytest.mark.parametrize("argv,words", [
    (["--family", "nosuch"], ["--family", "nosuch", "valid"]),
    (["--target", "nosuch"], ["--target", "nosuch", "bundled"]),
    (["--route", "fa2.single_prefill,fa9.x"], ["--route", "fa9.x", "fa2.paged_prefill"]),
    (["--disable-guards", "gqa_divisible,nosuch"], ["--disable-guards", "nosuch", "gqa_divisible"]),
    (["--case-id", "zzz"], ["no cases selected", "--case-id zzz"]),
], ids=["family", "target", "route", "disable_guards", "empty_selection"])
def test_check_refuses_bad_options_naming_field_and_values(argv, words, capsys):
    from harness.cli import main
    # An empty selection is its own code (docs/ci.md); the others are usage errors.
    # Refused before any child starts (test_check_plan.py).
    assert main(["check", "-n", "0", *argv]) == (4 if "no cases selected" in words else 2)
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def test_check_with_a_missing_library_is_a_usage_error(monkeypatch, capsys):
    import harness.engine.session
    from harness.cli import main

    def no_library(*args, **kwargs):
        raise RuntimeError("flashinfer target: `pip install flashinfer-python`")
    monkeypatch.setattr(harness.engine.session, "select_cases", no_library)
    assert main(["check", "-n", "0", "--target", "flashinfer"]) == 2
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


@pytest.mark.system
@pytest.mark.parametrize("how", [("--repeat", "2"), ("--reruns", "2")], ids=["repeat", "reruns"])
def test_check_with_the_flaky_fault_fails_as_nondeterministic(tmp_path, how, capfd):
    results = tmp_path / "r.jsonl"
    proc = _check(capfd, "--case-id", "flaky", "--results", str(results), *how)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = table.read_rows(results)
    assert row["outcome"] == "nondeterministic" and not row["pass"], row
    assert row["severity"] == "correctness"
    assert [a["outcome"] for a in row["attempts"]] == ["wrong", "match"]
    assert "1 correctness" in proc.stdout


@pytest.mark.system
def test_partial_run_writes_its_own_table_under_the_current_folder(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = _check(capfd, "--case-id", "none")
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
    assert len(summary.gating(df, target_owns_contract=False, strict=False)) == 0
    assert len(summary.gating(df, target_owns_contract=False, strict=True)) == 2
    assert len(summary.gating(df, target_owns_contract=True, strict=False)) == 2
    wrong = pd.concat([df, pd.DataFrame([{"pass": False, "severity": "correctness"}])])
    assert len(summary.gating(wrong, target_owns_contract=False, strict=False)) == 1


# ------------------------------------------------------------------ one-line errors

def _one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_list_of_a_target_that_cannot_run_here_is_one_line(monkeypatch, capsys):
    def no_library(name):
        raise RuntimeError("flashinfer target: no GPU visible to torch; "
                           "`pip install flashinfer-python` on a machine with a CUDA GPU")
    monkeypatch.setattr("harness.targets.load_target", no_library)
    assert cli.main(["list", "--target", "flashinfer"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("list: flashinfer target") and "pip install flashinfer-python" in line


def test_repro_of_a_target_that_cannot_run_here_is_one_line(monkeypatch, capsys):
    def no_library(name):
        raise RuntimeError("flashinfer target: `pip install flashinfer-python`")
    monkeypatch.setattr("harness.targets.load_target", no_library)
    assert cli.main(["repro", "x", "--target", "flashinfer", "--in-process"]) == 2
    assert _one_line(capsys.readouterr().err).startswith("repro: flashinfer target")


@pytest.mark.parametrize("argv,words", [
    (["check", "--reruns", "x"], ["harness check:", "--reruns", "'x'", "--help"]),
    (["check", "--bogus"], ["unrecognized arguments: --bogus", "--help"]),
    (["frob"], ["invalid choice: 'frob'", "--help"]),
], ids=["bad-value", "unknown-option", "unknown-command"])
def test_usage_errors_are_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    line = _one_line(capsys.readouterr().err)
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("name,text", [("empty.jsonl", ""), ("blank.jsonl", "\n\n"),
                                       ("header.csv", "route,case_id,outcome,pass\n")],
                         ids=["empty", "blank-lines", "csv-header-only"])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_report_and_compare_refuse_a_table_without_rows(tmp_path, capsys, name, text, command):
    table_path = tmp_path / name
    table_path.write_text(text)
    if command == "report":
        argv = ["report", "--results", str(table_path), "--out", str(tmp_path / "r.html")]
        option = "--results"
    else:
        argv = ["compare", "--base", str(table_path), "--head", str(table_path)]
        option = "--base"
    assert cli.main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"{command}: {option}: {table_path} has no rows") and "check" in line
    assert not (tmp_path / "r.html").exists()


def _changed_tables(tmp_path, n: int = 3000):
    rows = [{"case_id": f"r.x/f.v{i}/t", "route": "r.x", "family": "f", "arch": "cpu",
             "target": "bundled", "outcome": "match", "pass": True} for i in range(n)]
    base, head = tmp_path / "base.jsonl", tmp_path / "head.jsonl"
    base.write_text("".join(json.dumps(r) + "\n" for r in rows))
    head.write_text("".join(json.dumps(dict(r, outcome="wrong", **{"pass": False})) + "\n"
                            for r in rows))
    return base, head


@pytest.mark.system
@pytest.mark.parametrize("argv", [["list", "--target", "faults"], ["compare"]],
                         ids=["list", "compare"])
def test_a_reader_that_stops_early_is_no_traceback(tmp_path, argv):
    """`harness compare ... | head`: the reader goes away; exit 141, nothing on stderr
    but the command's own lines."""
    if argv == ["compare"]:
        base, head = _changed_tables(tmp_path)
        argv = ["compare", "--base", str(base), "--head", str(head)]
    proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    proc.stdout.close()   # before the first line: every write finds the pipe closed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.EXIT_PIPE, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err


@pytest.mark.system
def test_ctrl_c_during_check_is_one_line_with_the_resume_command(tmp_path):
    """Ctrl-C from a terminal reaches the whole process group: the check, its pytest,
    the workers. One line says what is kept and how to go on."""
    import signal
    from fault_target import fault_case

    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([fault_case("none").to_json(), fault_case("slow").to_json()]))
    results = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "harness", "check", "--target", "faults", "-n", "1",
           "--cases-file", str(cases), "--results", str(results)]
    from process_watch import new_mark, poll, worker_in_a_case
    mark = new_mark()
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), FAULTS_SLOW_S="120",
                                     **dict([mark])))
    # The first row written and the slow case (120 s) inside its call: polled, not guessed.
    slow = fault_case("slow").id
    def first_row_kept_and_slow_case_running():
        return results.exists() and results.read_text().strip() and \
            worker_in_a_case("=".join(mark), stage="run", case_id=slow)
    poll(first_row_kept_and_slow_case_running)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, out + err
    # Without a terminal a progress line comes every 10 s: a loaded machine prints some.
    lines = [l for l in err.splitlines() if l.startswith("check: ") and "rows go to" not in l
             and not re.match(r"check: \d+/\d+ rows, ", l)]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"check: interrupted; 1 of 2 rows kept in {results}"), lines[0]
    assert lines[0].endswith(f"continue with: harness check --target faults -n 1 --cases-file "
                             f"{cases} --results {results} --resume"), lines[0]
    for noise in ("Traceback", "KeyboardInterrupt", "Warning", "!!!"):
        assert noise not in out + err, out + err


@pytest.mark.system
def test_check_prints_progress_and_no_pytest_failures_section(tmp_path, none_then_wrong):
    import io
    progress = check.Progress(tmp_path / "r.jsonl", total=4, done_before={"a"},
                            stream=io.StringIO(), interval=0)
    stale = {"case_id": "old", "pass": False, "timestamp": "2000-01-01T00:00:00+00:00"}
    rows = [dict(case_id=c, timestamp="2999-01-01T00:00:00+00:00", **{"pass": p})
            for c, p in (("b", False), ("c", True))]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [stale, *rows])
                                      + '{"case_id": "d", "pa')   # a line being written
    progress.tick()
    line = progress.stream.getvalue().strip()
    assert line.startswith("check: 3/4 rows, 1 failing, 0:00 elapsed"), line
    # A run of a failing case: the summary once; pytest's FAILURES section and its
    # per-case text (which repeats each row's message) are not on the console.
    # (`check --case-id wrong --disable-guards g1`, shared with the test above)
    proc = none_then_wrong[1]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "FAILURES" not in proc.stdout and "(expect match)" not in proc.stdout
    # The class line only: a guards-off run's per-row table goes to the Markdown report.
    assert proc.stdout.count("16/16 wrong") == 1, proc.stdout
    assert "| Route | Case |" not in proc.stdout
    assert proc.stderr.startswith("check: 1 cases on faults; rows go to "), proc.stderr


@pytest.mark.system
def test_check_shows_pytest_output_when_pytest_itself_fails(tmp_path, capfd):
    proc = _check(capfd, "--case-id", "none", "--results", str(tmp_path / "r.jsonl"), "--",
                  "--no-such-pytest-option")
    assert proc.returncode not in (0, 1)
    assert "--no-such-pytest-option" in proc.stdout + proc.stderr


@pytest.mark.system
def test_check_from_another_folder_takes_paths_from_that_folder(tmp_path, capfd, monkeypatch):
    from fault_target import fault_case
    (tmp_path / "cases.json").write_text(json.dumps([fault_case("none").to_json()]))
    monkeypatch.chdir(tmp_path)   # the child pytest runs in the checkout, not here
    proc = _check(capfd, "--cases-file", "cases.json", "--results-dir", "out")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (table_path,) = (tmp_path / "out").glob("*.jsonl")
    assert f"results: {table_path}" in proc.stdout


# ------------------------------------------------------------------ repro in a child

@pytest.mark.parametrize("fault,outcome,cause", [("sigfpe", "crash", "SIGFPE"),
                                                 ("exit3", "crash", "exit code 3"),
                                                 ("hang", "hang", "timeout after")],
                         ids=["signal", "exit", "hang"])
def test_repro_prints_the_crash_row_of_a_case_that_kills_its_process(fault, outcome, cause,
                                                                     capsys, forked_children):
    # The child is forked from a warm server (conftest.forked_children): its death is still
    # a process's death, read from its breadcrumbs. A spawned child's usage codes are
    # test_repro_in_a_child_keeps_the_usage_exit_codes's.
    # The hang is a sleeping loop: any timeout ends it alike; 1 s idles least.
    argv = ["repro", f"faults.single_prefill/faults.{fault}/n0", "--target", "faults", "--json",
            "--case-timeout", "1"]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    row = json.loads(out)
    assert row["outcome"] == outcome and not row["pass"] and row["stage"] == "run", row
    assert cause in row["error_type"] and row["severity"] == "correctness", row
    assert row["isolation"] == "alone" and row["target"] == "faults"
    assert "Fatal Python error" not in err and "--in-process" in _one_line(err)


def test_repro_in_a_child_keeps_the_usage_exit_codes(capsys):
    assert cli.main(["repro", "faults.single_prefill/faults.nne/n0", "--target", "faults"]) == 4
    assert "faults.single_prefill/faults.none/n0" in capsys.readouterr().err
    assert cli.main(["repro", "x", "--target", "nosuch"]) == 2
    assert "--target" in capsys.readouterr().err


def test_resume_command_repeats_the_command_before_pytest_options():
    assert check.resume_command(["check", "--family", "gqa"]) == "harness check --family gqa --resume"
    assert check.resume_command(["check", "--", "-x"]) == "harness check --resume -- -x"
    assert check.resume_command(["check", "--resume"]) == "harness check --resume"


def test_check_with_an_unwritable_results_folder_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")   # a file where the folder would go
    results = blocker / "r.jsonl"
    assert cli.main(["check", "--target", "faults", "-n", "0", "--case-id", "none",
                     "--results", str(results)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"check: cannot write the results table {results}")
    assert "--results-dir" in line


def test_the_eta_weighs_the_cases_left_by_their_cost(tmp_path):
    """Two light cases done in 10 s and one case of 50 times their cost left (a long case
    still running): about 500 s left, not the 5 s the row count says."""
    import io
    progress = check.Progress(tmp_path / "r.jsonl", total=3, stream=io.StringIO(), interval=0,
                              costs={"a": 1, "b": 1, "long": 100})
    progress.started, progress.first_row_at, progress.ids = 0.0, 5.0, {"a", "b"}
    assert progress.seconds_left(10.0, 1) == 500.0
    plain = check.Progress(tmp_path / "r.jsonl", total=3, stream=io.StringIO(), interval=0)
    plain.started, plain.first_row_at, plain.ids = 0.0, 5.0, {"a", "b"}
    assert plain.seconds_left(10.0, 1) == 5.0
