"""The run summary JSON: its schema (documented in docs/ci.md), the validator, and the
GitHub annotations that come from the same failure classes."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.results.summary_json import SCHEMA, annotations, summary, validate, write_summary
from harness.tools.ci_outputs import main as ci_main, write_ci_outputs

from test_junit import ROWS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "ci.md"


def doc(**kw):
    return summary(pd.DataFrame(ROWS), table="results/bundled-cpu-x86_64.jsonl", **kw)


def test_the_summary_conforms_to_its_schema_and_counts_the_rows(tmp_path):
    d = doc(exit_code=1)
    assert validate(d) == []
    assert d["verdict"] == "fail" and d["rows"] == 5 and d["failing"] == 3 == d["gating"]
    assert d["counts"]["by_outcome"]["crash"] == 1 and d["counts"]["by_outcome"]["match"] == 1
    assert d["counts"]["by_severity"] == {"correctness": 2, "capability": 1, "clarity": 0,
                                          "harness": 0}
    assert sum(c["rows"] for c in d["failure_classes"]) == d["failing"]
    assert d["failure_classes"][0]["outcome"] == "crash"          # worst first
    assert d["target"] == "bundled" and d["arch"] == "cpu-x86_64" and "torch" in d["versions"]
    path = write_summary(d, tmp_path / "s.json")
    assert validate(json.loads(path.read_text())) == []


def test_a_class_lists_where_it_appears_and_its_signature():
    msg = "o max|diff| {} > tol 0.05, 3/64 wrong, first at o(0, 0, 1)"
    rows = [dict(ROWS[0], case_id=f"{route}/strided.{name}_stride2/bf16", route=route,
                 family="strided", outcome="wrong", severity="correctness", stage="compare",
                 message=msg.format(i), **{"pass": False})
            for i, (route, name) in enumerate((("fa2.single_prefill", "q"),
                                               ("fa2.paged_prefill", "k_cache"),
                                               ("fa2.paged_prefill", "v_cache")))]
    d = summary(pd.DataFrame(rows))
    assert validate(d) == []
    (cls,) = d["failure_classes"]
    assert cls["routes"] == ["fa2.paged_prefill", "fa2.single_prefill"]
    assert cls["variants"] == ["k_cache_stride2", "q_stride2", "v_cache_stride2"]
    assert cls["tensors"] == ["k_cache", "q", "v_cache"]
    assert (cls["variant"], cls["stage"], cls["differs"]) == ("<tensor>_stride<n>", "compare", "o")
    assert cls["slug"].startswith("wrong-strided.T_strideN-") and cls["pattern"]
    assert d["verdict_line"].startswith("FAIL: 1 distinct cause (1 correctness)")


def test_a_run_whose_failures_do_not_gate_passes():
    d = doc(gating_ids=set(), exit_code=0)
    assert d["verdict"] == "pass" and d["gating"] == 0 and d["failing"] == 3
    assert not any(c["gating"] for c in d["failure_classes"])


@pytest.mark.parametrize("breaks, said", [
    (lambda d: d.pop("verdict"), "missing 'verdict'"),
    (lambda d: d.update(verdict="maybe"), "not one of"),
    (lambda d: d.update(rows=-1), "< 0"),
    (lambda d: d.update(rows="5"), "expected integer"),
    (lambda d: d["counts"]["by_outcome"].pop("crash"), "missing 'crash'"),
    (lambda d: d["counts"]["by_outcome"].update(crash=1.5), "expected integer"),
    (lambda d: d["failure_classes"][0].update(outcome="meh"), "not one of"),
    (lambda d: d["failure_classes"][0].pop("repro"), "missing 'repro'"),
    (lambda d: d["versions"].update(torch=2), "expected string"),
])
def test_the_validator_rejects_what_the_schema_does_not_allow(breaks, said):
    d = copy.deepcopy(doc())
    breaks(d)
    errors = validate(d)
    assert errors and any(said in e for e in errors), errors
    with pytest.raises(ValueError, match="schema"):
        write_summary(d, "/nonexistent/never-written.json")


def test_docs_describe_every_field_of_the_schema():
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    fields = set(SCHEMA["properties"]) | set(SCHEMA["properties"]["counts"]["properties"]) \
        | set(SCHEMA["properties"]["failure_classes"]["items"]["properties"])
    assert fields <= documented, sorted(fields - documented)
    assert f"schema_version` | `{SCHEMA['properties']['schema_version']['enum'][0]}`" in text


def test_one_annotation_per_failure_class_escaped():
    d = doc(gating_ids={ROWS[1]["case_id"]})
    lines = annotations(d)
    assert len(lines) == len(d["failure_classes"]) == 3
    errors = [line for line in lines if line.startswith("::error title=")]
    warnings = [line for line in lines if line.startswith("::warning title=")]
    assert len(errors) == 1 and len(warnings) == 2
    assert "gqa.q4_over_kv8%3A crash" in errors[0] and "\n" not in errors[0]
    assert errors[0].split("::", 2)[2].count("%0Arepro: harness repro ") == 1


def test_annotations_print_only_on_github_actions(tmp_path):
    df = pd.DataFrame(ROWS)
    out = io.StringIO()
    write_ci_outputs(df, env={}, stream=out)
    assert out.getvalue() == ""
    step = tmp_path / "step.md"
    write_ci_outputs(df, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(step)},
                     stream=out)
    assert len([l for l in out.getvalue().splitlines() if l.startswith("::")]) == 3
    assert step.read_text().startswith("### bundled on cpu-x86_64: FAIL")


def test_the_ci_command_reads_a_table_and_exits_by_its_rows(tmp_path, forked_children):
    from harness.results.table import append_row
    table = tmp_path / "bundled-cpu-x86_64.jsonl"
    rows = [json.loads(line) for line in _sample_table().splitlines()]
    for row in rows:
        append_row(table, row)
    code = ci_main([str(table), "--junitxml", str(tmp_path / "j.xml"),
                    "--summary-json", str(tmp_path / "s.json"), "--ledger", str(_empty_ledger(tmp_path))])
    d = json.loads((tmp_path / "s.json").read_text())
    assert validate(d) == [] and code == (1 if d["gating"] else 0) == d["exit_code"]
    assert d["table"] == str(table)


def _empty_ledger(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text("[]")
    return path


def _sample_table() -> str:
    """A real table's rows: one run of two fault cases through the engine."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from fault_target import fault_case
    from harness.engine import child
    out = child.run(child.Spec(target="faults", cases=[fault_case("none"), fault_case("wrong")],
                               case_timeout=60))
    assert len(out.rows) == 2, out.stderr[-2000:]
    return "\n".join(json.dumps(r) for r in out.rows)
