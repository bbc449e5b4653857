"""Rows -> JUnit XML: the structure CI systems read (Ant/Jenkins JUnit schema), one testcase
per row, failures that carry what a person needs to act on them."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pandas as pd

from harness.results.junit import junit_xml, write_junit
from harness.tools.ci_outputs import write_ci_outputs

ROWS = [
    {"case_id": "fa2.single_prefill/valid.a/bf16", "route": "fa2.single_prefill", "outcome": "match",
     "pass": True, "duration_s": 0.25, "target": "bundled", "arch": "cpu-x86_64",
     "run_id": "r1", "message": "", "stage": "compare", "severity": ""},
    {"case_id": "fa2.single_prefill/gqa.q4_over_kv8/bf16-d128-h4x8", "route": "fa2.single_prefill",
     "outcome": "crash", "pass": False, "duration_s": 1.5, "target": "bundled",
     "message": "worker died: SIGFPE during run", "stage": "run", "severity": "correctness",
     "disable_guards": "all"},
    {"case_id": "fa2.paged_prefill/strided.q_stride2/bf16", "route": "fa2.paged_prefill",
     "outcome": "wrong", "pass": False, "duration_s": 0.1, "target": "bundled",
     "message": "o max|diff| inf > tol 0.02, 3/4 wrong \x00\x1b<&>", "stage": "compare",
     "severity": "correctness", "max_abs_diff": float("inf"), "n_wrong": 3, "n_total": 4},
    {"case_id": "fa2.merge_state/x.y/fp16", "route": "fa2.merge_state", "outcome": "skipped",
     "pass": True, "duration_s": None, "message": "no merge here", "stage": "build inputs"},
    {"case_id": "sdpa_math.single_prefill/strided.k/bf16", "route": "sdpa_math.single_prefill",
     "outcome": "unexpected_refusal", "pass": False, "duration_s": 0.01, "target": "torch-sdpa",
     "message": "RuntimeError: no", "stage": "run", "severity": "capability"},
]

SUITE_ATTRS = {"name", "tests", "failures", "errors", "skipped", "time"}


def check_junit_structure(root: ET.Element) -> list[ET.Element]:
    """The JUnit schema's required elements and attributes (what an XSD would enforce);
    returns the testcases."""
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert suites and all(c.tag in ("testsuite",) for c in root)
    cases = []
    for suite in suites:
        assert SUITE_ATTRS | {"timestamp"} <= set(suite.attrib), suite.attrib
        for key in ("tests", "failures", "errors", "skipped"):
            assert int(suite.get(key)) >= 0
        assert float(suite.get("time")) >= 0
        for child in suite:
            assert child.tag in ("properties", "testcase", "system-out", "system-err"), child.tag
        for prop in suite.iter("property"):
            assert {"name", "value"} <= set(prop.attrib)
        here = suite.findall("testcase")
        for case in here:
            assert {"name", "classname", "time"} <= set(case.attrib)
            float(case.get("time"))
            kids = [k.tag for k in case]
            assert set(kids) <= {"failure", "error", "skipped", "system-out", "system-err"}
            assert sum(k in ("failure", "error", "skipped") for k in kids) <= 1
            for failure in case.findall("failure"):
                assert "message" in failure.attrib and "type" in failure.attrib
        assert int(suite.get("tests")) == len(here)
        assert int(suite.get("failures")) == sum(bool(c.findall("failure")) for c in here)
        assert int(suite.get("skipped")) == sum(bool(c.findall("skipped")) for c in here)
        cases += here
    return cases


def test_one_testcase_per_row_named_by_case_id_and_route():
    root = ET.fromstring(junit_xml(ROWS).encode())
    cases = check_junit_structure(root)
    assert [c.get("name") for c in cases] == [r["case_id"] for r in ROWS]
    assert [c.get("classname") for c in cases] == [r["route"] for r in ROWS]
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "3", "1")


def test_failures_carry_outcome_signal_stage_message_and_repro():
    cases = {c.get("name"): c for c in ET.fromstring(junit_xml(ROWS).encode()).iter("testcase")}
    crash = cases[ROWS[1]["case_id"]].find("failure")
    assert crash.get("type") == "crash" and crash.get("message").startswith("crash SIGFPE:")
    text = crash.text
    for line in ("outcome: crash", "signal: SIGFPE", "stage: run",
                 "message: worker died: SIGFPE during run",
                 f"repro: harness repro {ROWS[1]['case_id']} --disable-guards all"):
        assert line in text.splitlines(), text
    wrong = cases[ROWS[2]["case_id"]].find("failure")
    assert "signal:" not in wrong.text and "stage: compare" in wrong.text
    assert "<&>" in wrong.text                     # escaped, and back after parsing
    assert cases[ROWS[0]["case_id"]].find("failure") is None
    skipped = cases[ROWS[3]["case_id"]].find("skipped")
    assert skipped is not None and skipped.get("message") == "no merge here"


def test_findings_that_do_not_gate_are_not_failures(tmp_path):
    gating = {ROWS[1]["case_id"], ROWS[2]["case_id"]}
    path = write_junit(ROWS, tmp_path / "j.xml", gating_ids=gating)
    cases = check_junit_structure(ET.parse(path).getroot())
    finding = next(c for c in cases if c.get("name") == ROWS[4]["case_id"])
    assert finding.find("failure") is None
    assert "does not fail the run" in finding.find("system-out").text
    assert ET.parse(path).getroot().find("testsuite").get("failures") == "2"


def test_check_outputs_use_the_project_repro_command(tmp_path):
    df = pd.DataFrame(ROWS)
    write_ci_outputs(df, junitxml=str(tmp_path / "out" / "j.xml"), env={})
    cases = check_junit_structure(ET.parse(tmp_path / "out" / "j.xml").getroot())
    sdpa = next(c for c in cases if c.get("name") == ROWS[4]["case_id"]).find("failure")
    assert f"repro: harness repro {ROWS[4]['case_id']} --target torch-sdpa" in sdpa.text
