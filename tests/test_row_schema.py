"""One row schema: harness/results/columns.py's ROW is the one declaration of a row's columns.

The proof that adding a column is one edit: insert one Column line into columns.py's source,
import the results and reports modules afresh on top of it, and find the column in the
table's columns and type checks, the summary JSON's schema and document, the JUnit
properties and the report's runs table, with nothing else touched.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

import harness.results.summary_json
import harness.results.junit
import reports.html
from harness.results import columns, table

# Where the line goes: after the last written column, before the read-only ones.
ANCHOR = "    # Read, never written by a run"
ONE_EDIT = ('    Column("host", "safe", "the machine that ran the case", run=9, label="machine",\n'
            '           summary="host"),\n')
FRESH = ("harness.results.", "reports")


def _ours(name: str) -> bool:
    return name.startswith(FRESH) and (name == "reports" or "." in name)


@pytest.fixture
def one_more_column():
    """columns.py with ONE_EDIT applied, and the results and reports modules imported over
    it; every module this session held, and the package attributes naming them, come back
    after the test (a fresh module left behind would carry the throwaway column)."""
    source = Path(columns.__file__).read_text(encoding="utf-8")
    assert source.count(ANCHOR) == 1, "the anchor line moved: put ONE_EDIT where it now goes"
    edited = source.replace(ANCHOR, ONE_EDIT + ANCHOR)
    saved = {n: m for n, m in sys.modules.items() if _ours(n)}
    parents = {n: getattr(sys.modules.get(n.rpartition(".")[0]), n.rpartition(".")[2], None)
               for n in saved}
    for name in saved:
        del sys.modules[name]
    try:
        spec = importlib.util.spec_from_loader("harness.results.columns", loader=None,
                                               origin=columns.__file__)
        fresh = importlib.util.module_from_spec(spec)
        fresh.__file__ = columns.__file__
        sys.modules[spec.name] = fresh
        exec(compile(edited, columns.__file__, "exec"), fresh.__dict__)
        yield {name: importlib.import_module(name) for name in (
            "harness.results.columns", "harness.results.table", "harness.results.summary_json",
            "harness.results.junit", "reports", "reports.html")}
    finally:
        for name in [n for n in sys.modules if _ours(n)]:
            module = sys.modules.pop(name)
            parent, _, child = name.rpartition(".")
            if name not in saved and getattr(sys.modules.get(parent), child, None) is module:
                delattr(sys.modules[parent], child)   # first imported here: forget it
        sys.modules.update(saved)
        for name, module in parents.items():
            parent = sys.modules.get(name.rpartition(".")[0])
            if parent is not None and module is not None:
                setattr(parent, name.rpartition(".")[2], module)


def _row(case_id: str, **kw) -> dict:
    return {"run_id": "r1", "arch": "cpu-x86_64", "target": "bundled", "platform": "host",
            "library_commit": "abc", "build_hash": "b1", "route": "fa2.single_prefill",
            "family": "valid", "case_id": case_id, "params": "{}", "expect": "match",
            "outcome": "match", "pass": True, "stage": "compare", **kw}


def test_one_column_line_reaches_the_table_its_checks_the_summary_junit_and_the_report(
        one_more_column, tmp_path):
    m = one_more_column
    tbl, summary_json, junit, html = (m["harness.results.table"], m["harness.results.summary_json"],
                                      m["harness.results.junit"], m["reports.html"])
    # The table: written in its place, in order, and read back through its kind's check.
    assert tbl.COLUMNS == table.COLUMNS[:table.COLUMNS.index("shard") + 1] + ("host",) \
        + table.COLUMNS[table.COLUMNS.index("shard") + 1:]
    path = tmp_path / "t.jsonl"
    tbl.append_row(path, _row("a/1", host="gpu-node-3"))
    tbl.append_row(path, _row("a/2"))
    assert list(json.loads(path.read_text().splitlines()[0])) == list(tbl.COLUMNS)
    assert [r["host"] for r in tbl.read_rows(path)] == ["gpu-node-3", None]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_row("a/1", host="../../etc")) + "\n")
    with pytest.raises(tbl.TableError, match=r"field 'host' must be a name matching"):
        tbl.read_rows(bad)
    # The summary JSON: its schema has the field, and the document carries the run's value.
    assert summary_json.SCHEMA["properties"]["host"] == {"type": "string"}
    df = tbl.load_table(path)
    doc = summary_json.summary(df)
    assert doc["host"] == "gpu-node-3" and summary_json.validate(doc) == []
    assert summary_json.validate({**doc, "host": 3}) == ["$.host: expected string, got int"]
    # JUnit: a property of the suite, after the run's other descriptions.
    root = ET.fromstring(junit.junit_xml(tbl.read_rows(path)))
    props = [p.get("name") for p in root.iter("property")]
    assert props[-1] == "host" and root.find(".//property[@name='host']").get("value") \
        == "gpu-node-3"
    # The report: a column of the runs table, headed by its label.
    out = html.render_html(m["reports"].load_results([path]), tmp_path / "r.html")
    runs = out.read_text().split('<table id="runs">')[1].split("</table>")[0]
    assert "<th>machine</th>" in runs and "<td>gpu-node-3</td>" in runs


def test_the_throwaway_column_is_gone_after_the_test():
    # The fixture put back the modules this session holds: the table has no such column.
    assert "host" not in table.COLUMNS and "host" not in harness.results.summary_json.SCHEMA[
        "properties"]
    assert "host" not in {h["name"] for h in reports.html.run_headings()}
    held = [n for n in sys.modules if _ours(n) and "." in n]
    assert all(getattr(sys.modules[n.rpartition(".")[0]], n.rpartition(".")[2], None)
               in (None, sys.modules[n]) for n in held)
    assert "host" not in sys.modules["harness.results.columns"].COLUMNS


def test_the_declaration_is_the_only_source_of_the_row_shaped_lists():
    from harness.engine import row
    assert table.COLUMNS == columns.names() and table.SCHEMA == columns.checks()
    assert set(table.SCHEMA) == set(table.COLUMNS) | set(table.EXTRA_COLUMNS)
    assert all(c.kind in columns.KINDS for c in columns.ROW)
    # The run's description: JUnit's order, and the summary's keys taken from it.
    assert [c.name for c in columns.run_columns()] == [
        "target", "target_version", "arch", "platform", "library_commit", "build_hash",
        "run_id", *columns.OPTION_COLUMNS]
    summary_keys = list(harness.results.summary_json.SCHEMA["properties"])
    start = summary_keys.index("table") + 1
    assert summary_keys[start:summary_keys.index("run_ids")] == [
        "target", "arch", "platform", "commit", "build_hash", *columns.OPTION_COLUMNS]
    assert {c.name for c in row.FROM_RESULT} >= set(columns.PER_OUTPUT_COLUMNS)


def test_a_case_result_field_without_a_column_fails_at_import(monkeypatch):
    from harness.engine import execute
    execute._same_fields_as_the_row()   # as shipped: they agree
    less = tuple(c for c in columns.from_result() if c.name != "rel_error")
    monkeypatch.setattr(execute, "from_result", lambda: less)
    with pytest.raises(TypeError, match=r"fields without a column \['rel_error'\]"):
        execute._same_fields_as_the_row()


def test_a_table_written_before_the_declaration_reads_the_same(tmp_path):
    # A row as the table wrote it before: every column, in the order it had then.
    before = ("run_id timestamp arch platform target target_version library_commit "
              "build_hash route family case_id params expect outcome pass max_abs_diff "
              "n_wrong n_total first_bad_index message error_type stage duration_s severity "
              "tolerance baseline_error rel_error error_ratio attempts repeat profile reruns "
              "isolation worker disable_guards sanitizer o_max_abs_diff o_tolerance "
              "o_error_ratio lse_max_abs_diff lse_tolerance lse_error_ratio harness_commit "
              "shard").split()
    assert list(table.COLUMNS) == before
    line = json.dumps(table.normalize_row({"case_id": "a/1", "outcome": "match",
                                           "pass": True}))
    assert line.startswith('{"run_id": null, "timestamp": null, "arch": null')
    assert '"message": "", "error_type": "", "stage": "", "duration_s": null, "severity": ""' \
        in line and '"reruns": 0, "isolation": "", "worker": "", "disable_guards": ""' in line
    df = pd.DataFrame([json.loads(line)])
    assert list(df.columns) == before
