"""`check --sanitizer`: compute-sanitizer's reports parsed, attached to rows, rendered.

The parser is tested on outputs in the forms the tool prints (CUDA 11's `at 0x.. in
file:line:kernel` and CUDA 12's `at kernel(...)+0x.. in file:line`, wrapped lines, the
program's own output in between). The CLI is tested with a stand-in replay or a stand-in
compute-sanitizer; the one real replay needs a GPU and the tool.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness.tools import sanitizer
from harness.results import table
from fault_target import fault_case

ROOT = Path(__file__).resolve().parent.parent

# memcheck on the merge reading past its state: the kernel's report, the program's own output
# (not prefixed), the host API call that fails after it, and the summary.
MEMCHECK_OUT_OF_BOUNDS = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at merge_state_in_place_kernel(void *, float *, const void *, const float *, long, const int *, int, int, int, int)+0x1b0 in /work/main/kernels/csrc/merge.h:38
=========     by thread (0,0,0) in block (9,0,0)
=========     Address 0x7f1c2e00100c is out of bounds
=========     and is 12 bytes after the nearest allocation at 0x7f1c2e000000 of size 4,096 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2ea231]
=========                in /lib/x86_64-linux-gnu/libcuda.so.1
=========         Host Frame:kernels_merge_state_in_place [0x1c2f4]
=========                in /root/.cache/attention-kernels/nvidia-sm_90-1f3a/libkernels.so
=========
{"route": "fa2.paged_prefill", "case_id": "fa2.paged_prefill/graph_replan.x/bf16", "pass": false}
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x333c7d]
=========                in /lib/x86_64-linux-gnu/libcuda.so.1
=========
========= Target application returned an error
========= ERROR SUMMARY: 2 errors
========= ERROR SUMMARY: 1 error was not printed. Use --print-limit option to adjust the number of printed errors
"""

# memcheck on a null pointer (a state read through an lse that was never passed), in the
# CUDA 11 form: the PC offset first, then file:line:kernel.
MEMCHECK_NULL = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at 0x00000370 in /work/main/kernels/csrc/merge.h:38:merge_state_in_place_kernel(void*, float*, void const*, float const*, long, int const*, int, int, int, int)
=========     by thread (64,0,0) in block (0,0,0)
=========     Address 0x0 is out of bounds
=========     Device Frame:merge_state_in_place_kernel(void*, float*, void const*, float const*, long, int const*, int, int, int, int) (merge_state_in_place_kernel(void*, float*, void const*, float const*, long, int const*, int, int, int, int) : 0x370)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= ERROR SUMMARY: 1 error
"""

# A shared-memory write, the location wrapped onto two lines (CUDA 12.4+).
MEMCHECK_SHARED = """\
========= COMPUTE-SANITIZER
========= Invalid __shared__ write of size 16 bytes
=========     at void prefill_kernel<(int)128, __nv_bfloat16>(AttnParams, int)+0x9c0
=========        in /work/main/kernels/csrc/attention.h:121
=========     by thread (31,0,0) in block (2,3,0)
=========     Address 0x10010 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""

MEMCHECK_HOST_ONLY = """\
========= COMPUTE-SANITIZER
========= Program hit cudaErrorIllegalAddress (error 700) due to "an illegal memory access was
=========   encountered" on CUDA API call to cudaDeviceSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 1 error
"""

INITCHECK = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 2 bytes
=========     at decode_kernel(AttnParams, int)+0x2f0 in /work/main/kernels/csrc/attention.h:140
=========     by thread (7,0,0) in block (1,0,0)
=========     Address 0x7f3c7ec000fc
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= ERROR SUMMARY: 1 error
"""

# racecheck, CUDA 12: each access's location on a line of its own.
RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at
=========     merge_partials_kernel(AttnParams, int)+0x4b0 in /work/main/kernels/csrc/attention.h:160
=========     and Read access at
=========     merge_partials_kernel(AttnParams, int)+0x520 in /work/main/kernels/csrc/attention.h:166
=========     [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

# racecheck, CUDA 11: one line per access, a warning rather than an error.
RACECHECK_WARNING = """\
========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at 0x00000170 in /work/main/kernels/csrc/attention.h:166:merge_partials_kernel(AttnParams, int)
=========     and Write access at 0x00000148 in /work/main/kernels/csrc/attention.h:160:merge_partials_kernel(AttnParams, int) [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""

CLEAN = """\
========= COMPUTE-SANITIZER
{"route": "fa2.single_prefill", "case_id": "fa2.single_prefill/valid.x/bf16", "pass": true}
========= ERROR SUMMARY: 0 errors
"""

CLEAN_RACECHECK = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""

REPORT = sanitizer.parse(MEMCHECK_OUT_OF_BOUNDS, "memcheck")


# ------------------------------------------------------------------ parse

def test_memcheck_out_of_bounds_read_names_kernel_access_and_allocation():
    report = sanitizer.parse(MEMCHECK_OUT_OF_BOUNDS)
    assert report == {
        "tool": "memcheck", "kind": "Invalid __global__ read of size 4 bytes",
        "kernel": "merge_state_in_place_kernel", "source": "/work/main/kernels/csrc/merge.h:38",
        "access": "read", "size": 4, "address": "0x7f1c2e00100c",
        "where": "is 12 bytes after the nearest allocation at 0x7f1c2e000000 of size 4,096 bytes",
        "summary": "memcheck: Invalid __global__ read of size 4 bytes in merge_state_in_place_kernel"
                   " (/work/main/kernels/csrc/merge.h:38): address 0x7f1c2e00100c is 12 bytes "
                   "after the nearest allocation at 0x7f1c2e000000 of size 4,096 bytes",
    }


def test_memcheck_read_at_address_zero_in_the_cuda11_form():
    report = sanitizer.parse(MEMCHECK_NULL, "memcheck")
    assert report["kernel"] == "merge_state_in_place_kernel"
    assert report["source"] == "/work/main/kernels/csrc/merge.h:38"
    assert (report["access"], report["size"], report["address"]) == ("read", 4, "0x0")
    assert report["where"] == "Address 0x0 is out of bounds"
    assert "\n" not in report["summary"] and report["summary"].endswith(
        "merge_state_in_place_kernel (/work/main/kernels/csrc/merge.h:38): "
        "Address 0x0 is out of bounds")


def test_shared_write_with_a_wrapped_location_and_a_template_kernel():
    report = sanitizer.parse(MEMCHECK_SHARED)
    assert report["kind"] == "Invalid __shared__ write of size 16 bytes"
    assert report["kernel"] == "prefill_kernel"
    assert report["source"] == "/work/main/kernels/csrc/attention.h:121"
    assert (report["access"], report["size"]) == ("write", 16)


def test_a_failed_api_call_alone_is_the_report():
    report = sanitizer.parse(MEMCHECK_HOST_ONLY)
    assert report["kind"] == "Program hit cudaErrorIllegalAddress (error 700)"
    assert report["kernel"] == "" and report["access"] is None
    assert report["where"] == ('due to "an illegal memory access was encountered" on CUDA API '
                               'call to cudaDeviceSynchronize')


def test_initcheck_uninitialized_read():
    report = sanitizer.parse(INITCHECK)
    assert report["tool"] == "initcheck"
    assert report["kind"] == "Uninitialized __global__ memory read of size 2 bytes"
    assert (report["kernel"], report["access"], report["size"]) == ("decode_kernel", "read", 2)
    assert report["address"] == "0x7f3c7ec000fc" and report["where"] == "Address 0x7f3c7ec000fc"


@pytest.mark.parametrize("text,severity,first,second,source", [
    (RACECHECK, "Error", "Write", "Read", "/work/main/kernels/csrc/attention.h:160"),
    (RACECHECK_WARNING, "Warning", "Read", "Write", "/work/main/kernels/csrc/attention.h:166"),
], ids=["error-wrapped", "warning-one-line"])
def test_racecheck_race_between_two_accesses(text, severity, first, second, source):
    report = sanitizer.parse(text)
    assert report["tool"] == "racecheck"
    assert report["kind"] == f"{severity}: Race reported between {first} access and {second} access"
    assert report["kernel"] == "merge_partials_kernel" and report["source"] == source
    assert report["access"] == first.lower() and report["size"] is None
    assert report["where"].startswith(f"and {second} access at ")
    assert "merge_partials_kernel" in report["where"] and "hazards]" in report["where"]


@pytest.mark.parametrize("text", [
    CLEAN, CLEAN_RACECHECK, "",
    # the program's own line, not the tool's: no prefix, no report
    "Invalid __global__ read of size 4 bytes\n========= ERROR SUMMARY: 0 errors\n",
], ids=["memcheck-clean", "racecheck-clean", "empty", "unprefixed"])
def test_no_error_is_none(text):
    assert sanitizer.parse(text) is None


def test_errors_in_a_form_it_does_not_read_are_still_a_report():
    text = ("========= COMPUTE-SANITIZER\n========= A report of a kind added next year\n"
            "========= ERROR SUMMARY: 3 errors\n")
    report = sanitizer.parse(text, "memcheck")
    assert report is not None and report["kind"].startswith("3 errors")


def test_the_tool_failing_on_the_device_is_no_report_rather_than_the_cases():
    text = ("========= COMPUTE-SANITIZER\n========= Error: Device not supported\n"
            '========= Program hit cudaErrorUnknown (error 999) due to "unknown error" on CUDA '
            "API call to cudaMalloc.\n========= ERROR SUMMARY: 1 error\n")
    report = sanitizer.parse(text, "memcheck")
    assert report["kind"] == "no report" and report["kernel"] == ""
    assert report["where"] == "compute-sanitizer: Device not supported"


@pytest.mark.parametrize("signature,name", [
    ("merge_state_in_place_kernel(void *, float *, int)+0x1b0", "merge_state_in_place_kernel"),
    ("void prefill_kernel<(int)128, __nv_bfloat16>(AttnParams, int)", "prefill_kernel"),
    ("void cub::RadixSortScanBinsKernel<cub::Policy<float, int>, int>(int *, int)",
     "cub::RadixSortScanBinsKernel"),
    ("ns::<unnamed>::saxpy(float, const float *)", "ns::<unnamed>::saxpy"),
    ("decode_kernel", "decode_kernel"),
])
def test_kernel_names_are_shortened_to_the_function(signature, name):
    assert sanitizer.short_name(signature) == name


# ------------------------------------------------------------------ replay, with a stand-in tool

def _stand_in_tool(tmp_path: Path, body: str) -> Path:
    """An executable named compute-sanitizer that records how it was called, then runs `body`."""
    path = tmp_path / "bin" / "compute-sanitizer"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n"
                    "import json, os, subprocess, sys, time\n"
                    f"record = {str(tmp_path / 'called.json')!r}\n"
                    "json.dump({'argv': sys.argv[1:], 'pid': os.getpid(), 'env': {k: os.environ.get(k)"
                    " for k in ('PYTORCH_NO_CUDA_MEMORY_CACHING', 'KERNELS_DISABLE_GUARDS')}},"
                    " open(record, 'w'))\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.system
def test_replay_runs_repro_in_process_under_the_tool_and_parses_its_report(tmp_path, monkeypatch):
    # The stand-in runs the command after its own options (the real repro, which prints the
    # row) and then prints memcheck's report, as the tool would.
    tool = _stand_in_tool(tmp_path, (
        "child = subprocess.run(sys.argv[7:], capture_output=True, text=True)\n"
        f"open({str(tmp_path / 'child.out')!r}, 'w').write(child.stdout)\n"
        "print(child.stdout, end='')\n"
        f"print({MEMCHECK_NULL!r}, end='')\n"
        "sys.exit(99)\n"))
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([fault_case("wrong").to_json()]))
    monkeypatch.setenv("KERNELS_DISABLE_GUARDS", "inherited")   # never the replay's
    row = {"case_id": fault_case("wrong").id, "target": "faults", "disable_guards": "g1"}
    report = sanitizer.replay(row, tool="memcheck", tool_path=str(tool), cases_file=str(cases),
                              timeout=120)
    assert report == sanitizer.parse(MEMCHECK_NULL, "memcheck")
    called = json.loads((tmp_path / "called.json").read_text())
    assert called["argv"] == [
        "--tool", "memcheck", "--print-limit", "1", "--error-exitcode", "99",
        sys.executable, "-m", "harness", "repro", fault_case("wrong").id, "--target", "faults",
        "--disable-guards", "g1", "--cases-file", str(cases), "--in-process", "--json"]
    assert called["env"] == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "KERNELS_DISABLE_GUARDS": None}
    replayed = json.loads((tmp_path / "child.out").read_text())   # the command is a real repro
    assert replayed["case_id"] == fault_case("wrong").id and replayed["outcome"] == "wrong"
    assert replayed["disable_guards"] == "g1"


@pytest.mark.system
def test_a_replay_past_its_timeout_is_a_report_and_leaves_no_process(tmp_path):
    slept = tmp_path / "slept"
    tool = _stand_in_tool(tmp_path, f"time.sleep(60)\nopen({str(slept)!r}, 'w')\n")
    # The stand-in (no torch) records its pid within milliseconds and then sleeps: any
    # timeout well past that start-up ends it the same way; 1.5 s, not 3, idles less.
    report = sanitizer.replay("faults.single_prefill/faults.none/n0", "faults", None, "memcheck",
                              timeout=1.5, tool_path=str(tool))
    assert not slept.exists()   # ended by the timeout, never waited out to its end
    assert report["kind"] == "no report" and "timed out after 1.5 s" in report["where"]
    pid = json.loads((tmp_path / "called.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.system
def test_a_replay_that_never_ran_the_case_is_a_report_not_a_clean_run(tmp_path):
    # repro's exit 4 (an unknown case id) under a tool that found nothing: not a clean run.
    tool = _stand_in_tool(tmp_path, (
        "print('repro: unknown case id', file=sys.stderr)\n"
        "print('========= ERROR SUMMARY: 0 errors')\n"
        "sys.exit(4)\n"))
    report = sanitizer.replay("no/such.case/x", "faults", None, "memcheck", timeout=60,
                              tool_path=str(tool))
    assert report["kind"] == "no report"
    assert report["where"] == "the replay exited 4: repro: unknown case id"
    clean = _stand_in_tool(tmp_path, "print('========= ERROR SUMMARY: 0 errors')\nsys.exit(1)\n")
    assert sanitizer.replay("a/b.c/d", "faults", None, "memcheck", timeout=60,
                            tool_path=str(clean)) is None   # a failing row, nothing found


@pytest.mark.system
def test_find_tool_looks_in_path_then_cuda_home(tmp_path, monkeypatch):
    tool = _stand_in_tool(tmp_path, "")
    monkeypatch.setenv("PATH", str(tool.parent))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert sanitizer.find_tool() == str(tool)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))    # $CUDA_HOME/bin/compute-sanitizer
    assert sanitizer.find_tool() == str(tool)
    monkeypatch.delenv("CUDA_HOME")
    if not any(os.path.exists(p) for p in ("/usr/local/cuda/bin/compute-sanitizer",
                                           "/usr/local/cuda/compute-sanitizer/compute-sanitizer")):
        assert sanitizer.find_tool() is None


# ------------------------------------------------------------------ the CLI

def _one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_run(monkeypatch):
    """A usage error must come before any case runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("a case ran")
    from harness.tools import check
    monkeypatch.setattr(check, "run_check_child", refuse)


def test_sanitizer_without_a_gpu_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, no_run):
    monkeypatch.setattr(sanitizer, "gpu_visible", lambda: False)
    assert cli.main(["check", "--target", "faults", "--case-id", "none", "--results",
                     str(tmp_path / "r.jsonl"), "--sanitizer", "memcheck"]) == 2
    assert _one_line(capsys.readouterr().err) == \
        "check: --sanitizer memcheck: needs a GPU (torch sees none)"
    assert not (tmp_path / "r.jsonl").exists()


def test_sanitizer_without_the_tool_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, no_run):
    monkeypatch.setattr(sanitizer, "gpu_visible", lambda: True)
    monkeypatch.setattr(sanitizer, "find_tool", lambda: None)
    assert cli.main(["check", "--target", "faults", "--case-id", "none", "--results",
                     str(tmp_path / "r.jsonl"), "--sanitizer", "initcheck"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("check: --sanitizer initcheck: compute-sanitizer not found "
                           "(looked in PATH, $CUDA_HOME/bin, /usr/local/cuda/bin"), line


def test_sanitizer_all_without_sanitizer_is_exit_2(tmp_path, capsys, no_run):
    assert cli.main(["check", "--target", "faults", "--case-id", "none", "--results",
                     str(tmp_path / "r.jsonl"), "--sanitizer-all"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("check: --sanitizer-all: needs --sanitizer"), line


@pytest.fixture
def stand_in_replay(monkeypatch, tmp_path):
    """A GPU and a tool, as far as the CLI can tell; replay() records its calls and what the
    table held when it was called, and reports REPORT for every case but `none`."""
    monkeypatch.setattr(sanitizer, "gpu_visible", lambda: True)
    monkeypatch.setattr(sanitizer, "find_tool", lambda: "/opt/cuda/bin/compute-sanitizer")
    calls = []

    def replay(row, target=None, options=None, tool="memcheck", timeout=0, *,
               tool_path=None, cases_file=None):
        calls.append({"case_id": row["case_id"], "target": target, "options": options,
                      "tool": tool, "tool_path": tool_path, "cases_file": cases_file,
                      "table": table.read_rows(tmp_path / "r.jsonl")})
        return None if row["case_id"].endswith("faults.none/n0") else dict(REPORT, tool=tool)
    monkeypatch.setattr(sanitizer, "replay", replay)
    return calls


def _cases(tmp_path, *faults) -> Path:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([fault_case(f).to_json() for f in faults]))
    return path


def test_failing_rows_get_the_report_every_row_is_kept_and_reports_show_it(
        tmp_path, stand_in_replay, capsys):
    cases = _cases(tmp_path, "none", "wrong")
    results, html, md = tmp_path / "r.jsonl", tmp_path / "r.html", tmp_path / "r.md"
    # -n 0: the cases run in the child pytest itself. The replays come after the run, from
    # its table, whichever process wrote the rows; no case here dies, so no worker is needed
    # to isolate one, and none starts (a second and a half of torch and collection).
    rc = cli.main(["check", "--target", "faults", "-n", "0", "--cases-file", str(cases),
                   "--results", str(results), "--sanitizer", "memcheck",
                   "--html", str(html), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 1, out   # the wrong row fails the run, as it does without --sanitizer
    wrong = fault_case("wrong").id
    # Only the failing row was replayed, under the tool found, with the run's cases file.
    assert [(c["case_id"], c["target"], c["tool"], c["tool_path"], c["cases_file"])
            for c in stand_in_replay] == [
        (wrong, "faults", "memcheck", "/opt/cuda/bin/compute-sanitizer", str(cases))]
    before = stand_in_replay[0]["table"]
    after = table.read_rows(results)
    assert [r["case_id"] for r in after] == [r["case_id"] for r in before] \
        and len(after) == 2, after
    for old, new in zip(before, after):
        assert {k: v for k, v in new.items() if k != "sanitizer"} == \
            {k: v for k, v in old.items() if k != "sanitizer"}
        assert new["sanitizer"] == (REPORT if new["case_id"] == wrong else None)
    line = next(l for l in out.splitlines() if l.startswith("sanitizer: "))
    assert line == (f"sanitizer: {wrong}: memcheck: merge_state_in_place_kernel: Invalid "
                    f"__global__ read of size 4 bytes; address 0x7f1c2e00100c is 12 bytes after "
                    f"the nearest allocation at 0x7f1c2e000000 of size 4,096 bytes")
    assert out.index(line) < out.index("2 cases, 1 failing")   # the summary stays last
    page = html.read_text()
    row_html = re.search(rf'<details class="failure" data-case-id="{re.escape(wrong)}".*?</details>',
                         page, re.S).group(0)
    assert 'data-kernel="merge_state_in_place_kernel"' in row_html
    assert "Invalid __global__ read of size 4 bytes" in row_html
    (md_line,) = [l for l in md.read_text().splitlines() if f"`{wrong}`" in l and "**wrong**" in l]
    assert "merge_state_in_place_kernel" in md_line


def test_sanitizer_all_replays_passing_rows_without_changing_the_exit_status(
        tmp_path, stand_in_replay, capsys):
    cases = _cases(tmp_path, "none", "slow")   # two passing rows
    results = tmp_path / "r.jsonl"
    # -n 0, as above: the replays are of the table, after the run.
    rc = cli.main(["check", "--target", "faults", "-n", "0", "--cases-file", str(cases),
                   "--results", str(results), "--sanitizer", "racecheck", "--sanitizer-all"])
    assert rc == 0, capsys.readouterr()   # a report on a passing row never fails the run
    assert sorted(c["case_id"] for c in stand_in_replay) == sorted(
        fault_case(f).id for f in ("none", "slow"))
    rows = {r["case_id"]: r for r in table.read_rows(results)}
    assert rows[fault_case("none").id]["sanitizer"] is None
    assert rows[fault_case("slow").id]["sanitizer"] == dict(REPORT, tool="racecheck")
    assert all(r["pass"] for r in rows.values())


# ------------------------------------------------------------------ reports

def row(case_id, outcome, ok, family="strided", **kw):
    base = {"run_id": "run-1", "timestamp": "2026-01-01T00:00:00", "arch": "sm_90",
            "platform": "nvidia", "target": "bundled", "target_version": "0.1",
            "library_commit": "abc", "build_hash": "b1", "route": "fa2.paged_prefill",
            "family": family, "case_id": case_id, "params": json.dumps({"head_dim": 64}),
            "expect": "match", "outcome": outcome, "pass": ok, "max_abs_diff": None,
            "n_wrong": None, "n_total": None, "first_bad_index": None, "message": "",
            "error_type": "", "stage": "run", "duration_s": 0.1, "reruns": 0, "worker": "gw0"}
    return {**base, **kw}


def _report_rows():
    case = "fa2.paged_prefill/graph_replan.partial_state_without_lse/bf16"
    return case, pd.DataFrame([
        row(case, "crash", False, family="graph_replan", message="worker died: SIGSEGV during run",
            sanitizer=sanitizer.parse(MEMCHECK_NULL, "memcheck")),
        row("fa2.paged_prefill/strided.k/bf16", "wrong", False, message="max |diff| 1.2"),
        row("fa2.paged_prefill/strided.q/bf16", "match", True),
    ])


def test_html_shows_the_report_under_its_row(tmp_path):
    from reports.html import render_html
    case, df = _report_rows()
    page = render_html(df, tmp_path / "r.html").read_text()
    rows = re.findall(r'<details class="failure" data-case-id="([^"]+)".*?</details>', page, re.S)
    assert sorted(rows) == sorted([case, "fa2.paged_prefill/strided.k/bf16"])
    mine = re.search(rf'<details class="failure" data-case-id="{re.escape(case)}".*?</details>',
                     page, re.S).group(0)
    dd = re.search(r'<dd class="sanitizer".*?</dd>', mine, re.S).group(0)
    for text in ('data-tool="memcheck"', "<code>merge_state_in_place_kernel</code>",
                 "Invalid __global__ read of size 4 bytes", "Address 0x0 is out of bounds",
                 "merge.h:38"):
        assert text in dd, dd
    assert '<span class="san">memcheck: merge_state_in_place_kernel</span>' in mine
    other = re.search(r'<details class="failure" data-case-id="fa2.paged_prefill/strided.k/bf16"'
                      r'.*?</details>', page, re.S).group(0)
    assert "sanitizer" not in other and "san" not in re.findall(r'class="(\w+)"', other)


def test_markdown_lists_the_report_beside_the_failing_row():
    from reports.markdown import render_markdown
    case, df = _report_rows()
    md = render_markdown(df)
    failures = md[md.index("### Failures"):md.index("### Route")]
    header = next(l for l in failures.splitlines() if l.startswith("| route"))
    assert header.endswith("| message | sanitizer | repro |"), header
    (line,) = [l for l in failures.splitlines() if f"`{case}`" in l]
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    assert cells[-2] == ("memcheck in `merge_state_in_place_kernel`: Invalid __global__ read of "
                         "size 4 bytes; Address 0x0 is out of bounds"), cells
    (other,) = [l for l in failures.splitlines() if "strided.k" in l]
    assert [c.strip() for c in other.strip("|").split(" | ")][-2] == ""
    # Without any report the table is as before: no sanitizer column.
    plain = render_markdown(df.drop(columns=["sanitizer"]))
    assert "| message | repro |" in plain and "sanitizer" not in plain


# ------------------------------------------------------------------ on a GPU, with the real tool

def _gpu_and_tool() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available()) and sanitizer.find_tool() is not None
    except ImportError:
        return False


def _library_kernels() -> set[str]:
    names = set()
    for source in (ROOT / "kernels" / "csrc").iterdir():
        names |= set(re.findall(r"__global__\s+void\s+(\w+)", source.read_text(errors="replace")))
    return names


@pytest.mark.skipif(not _gpu_and_tool(), reason="needs a CUDA GPU and compute-sanitizer")
@pytest.mark.parametrize("guard,family,case_id", [
    # Without the guard the split-KV merge reads the lse that was never passed: address 0.
    ("partial_state_needs_lse", "graph_replan", "partial_state_without_lse"),
    # Zero kv heads: the GQA group divides by zero and the kernel indexes k/v with it.
    ("gqa_divisible", "gqa", "fa2.single_prefill/gqa.kv0/bf16-d128-h8x0-nolse"),
], ids=["merge-without-lse", "gqa-kv0"])
def test_memcheck_names_the_library_kernel_of_a_guards_off_row(tmp_path, guard, family, case_id,
                                                               capsys):
    results = tmp_path / "r.jsonl"
    rc = cli.main(["check", "--target", "bundled", "--disable-guards", guard, "--family", family,
                   "--case-id", case_id, "-n", "1", "--results", str(results),
                   "--sanitizer", "memcheck"])
    out = capsys.readouterr().out
    assert rc == 1, out   # the row fails with or without the sanitizer
    failing = [r for r in table.read_rows(results) if not r["pass"]]
    assert failing, out
    kernels = _library_kernels()
    for row in failing:
        report = row["sanitizer"]
        assert isinstance(report, dict) and report["tool"] == "memcheck", (row["case_id"], report)
        assert report["kernel"] in kernels, (row["case_id"], report, sorted(kernels))
