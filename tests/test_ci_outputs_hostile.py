"""What CI shows of a hostile table: JUnit XML that its parser reads, a step summary whose
Markdown holds no markup from the table, annotations with no control or bidi character.

Each output is checked against its reader: xml.etree for the JUnit XML; for the Markdown a
scan for what CommonMark would read as markup (an unescaped `<`, `[`, `]`, `*`, `!`, a code
span's backticks left unbalanced) outside the code spans the summary itself writes, and,
where cmark-gfm is installed, the rendered HTML's tags."""
from __future__ import annotations

import io
import re
import shutil
import subprocess
import unicodedata
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.results.junit import junit_xml
from harness.tools.ci_outputs import md_code, md_text, step_summary_markdown, write_ci_outputs

CMARK = shutil.which("cmark-gfm")
BAD = "\x01\x1b[2J\u202e"
MD_PAYLOAD = ("![i](https://evil.example/x.png) [click](https://evil.example) <img src=x> "
              "<b>b</b> `code ``span *em* _em_ ~~s~~ @octocat www.evil.example &amp; | pipe "
              "\\`esc http://evil.example/y")


def _rows(text: str) -> list[dict]:
    return [
        {"case_id": f"fa2.single_prefill/gqa.{text}/bf16", "route": "fa2.single_prefill",
         "family": "gqa", "outcome": "wrong", "pass": False, "duration_s": 0.1,
         "target": f"bundled{text}", "arch": f"cpu{text}", "run_id": text,
         "message": f"o max|diff| 1 > tol 0.1 {text}", "stage": "compare",
         "severity": "correctness", "disable_guards": f"all{text}", "max_abs_diff": 1.0,
         "n_wrong": 1, "n_total": 4, "library_commit": text, "target_version": text},
        {"case_id": f"fa2.paged_prefill/strided.{text}/fp16", "route": f"fa2.paged_prefill{text}",
         "family": "strided", "outcome": "crash", "pass": False, "duration_s": 0.2,
         "target": "bundled", "message": f"worker died: SIGSEGV {text}", "stage": text,
         "severity": "correctness"},
        {"case_id": f"fa2.batch_decode/x.{text}/bf16", "route": "fa2.batch_decode",
         "outcome": "skipped", "pass": True, "duration_s": None, "message": text,
         "stage": "build inputs"},
    ]


def _outputs(rows, tmp_path):
    df = pd.DataFrame(rows)
    junit, step, out = tmp_path / "j.xml", tmp_path / "step.md", io.StringIO()
    junit.unlink(missing_ok=True)
    step.unlink(missing_ok=True)
    write_ci_outputs(df, junitxml=str(junit), env={"GITHUB_ACTIONS": "true"},
                     step_summary_path=str(step), stream=out)
    return junit.read_text(encoding="utf-8"), step.read_text(encoding="utf-8"), out.getvalue()


def _outside_code_spans(line: str) -> str:
    """The line with the code spans CommonMark would read taken out; an opening backtick run
    that no equal run closes is left in (it is then markup gone wrong)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            out.append(line[i:i + 2])
            i += 2
            continue
        if line[i] == "`":
            run = re.match(r"`+", line[i:]).group(0)
            close = re.search(rf"(?<!`){run}(?!`)", line[i + len(run):])
            if close:
                i += len(run) + close.end()
                continue
            out.append(run)
            i += len(run)
            continue
        out.append(line[i])
        i += 1
    return "".join(out)


def _unescaped(text: str, chars: str) -> list[str]:
    """The characters of `chars` in text that no backslash escapes."""
    found, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] in chars:
            found.append(text[i])
        i += 1
    return found


def assert_markdown_is_text(md: str) -> None:
    for line in md.splitlines():
        rest = _outside_code_spans(line)
        assert not _unescaped(rest, "<>[]*!`~&"), (line, rest)
        assert "://" not in rest and "www." not in rest, line
        assert not re.search(r"@[A-Za-z0-9]", rest), line      # no @mention
        assert not re.search(r"(?<![A-Za-z0-9\\])_|_(?![A-Za-z0-9])", rest.replace("\\_", "")), line
        assert all(unicodedata.category(c) not in ("Cc", "Zl", "Zp") for c in line), line
        assert not any(c in line for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    if CMARK:
        html = subprocess.run([CMARK, "-e", "table", "-e", "autolink", "-e", "strikethrough"],
                              input=md, capture_output=True, text=True, check=True).stdout
        tags = set(re.findall(r"<([a-z0-9]+)", html))
        assert tags <= {"h3", "p", "table", "thead", "tbody", "tr", "th", "td", "code"}, tags


def assert_annotations_are_plain(lines: str) -> None:
    for line in lines.splitlines():
        assert line.startswith(("::error ", "::warning ")), line
        assert all(unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp") for c in line), line


@pytest.mark.system
def test_a_case_id_with_control_escape_and_bidi_characters(tmp_path):
    """\\x01, ESC and U+202E in a case id (and every other field): the JUnit XML parses and
    its repro line is clean, the step summary has no markup from the table, and the
    annotations carry neither ESC nor U+202E."""
    junit, md, notes = _outputs(_rows(BAD + MD_PAYLOAD), tmp_path)
    root = ET.fromstring(junit.encode("utf-8"))
    failures = root.findall(".//failure")
    assert len(failures) == 2
    for failure in failures:
        repro = [line for line in failure.text.splitlines() if line.startswith("repro: ")]
        assert len(repro) == 1 and "harness repro" in repro[0]
        assert "\x01" not in failure.text and "\x1b" not in failure.text
        assert "\u202e" not in failure.text
    assert_markdown_is_text(md)
    assert "evil.example" in md and "SIGSEGV" not in md       # the text is there, as text
    assert_annotations_are_plain(notes)
    assert len(notes.splitlines()) == 2


def test_the_markdown_escapes_hold_their_text():
    assert md_text("a*b* <c> [d](e) x86_64 _f_") == r"a\*b\* \<c\> \[d\](e) x86_64 \_f\_"
    assert md_code("harness repro 'a`b' |") == "`` harness repro 'a`b' \\| ``"
    assert md_text("\x1b[31mred\u202e\u2028x") == r"\[31mred x"


hostile = st.lists(st.one_of(st.sampled_from(list("<>[]()!*_~`&|\\@#:/.\n\r\x00\x01\x1b")
                                            + ["\u202e", "\u2028", "\u2066", "\ufeff",
                                               "://", "www.", "```", "](", "a@b.c"]),
                            st.text(max_size=3)), max_size=14).map("".join)


@pytest.mark.system
@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(hostile)
def test_fuzzed_fields_give_outputs_their_readers_accept(tmp_path, text):
    junit, md, notes = _outputs(_rows(text), tmp_path)
    ET.fromstring(junit.encode("utf-8"))
    assert_markdown_is_text(md)
    assert_annotations_are_plain(notes)


@settings(max_examples=200, deadline=None)
@given(hostile)
def test_fuzzed_junit_xml_parses(text):
    """Straight through junit_xml (no files): every field of a row, any text."""
    rows = _rows(text)
    xml = junit_xml(rows, suite=text or "s", repro=lambda row: f"harness repro {text}")
    root = ET.fromstring(xml.encode("utf-8"))
    assert len(root.findall(".//testcase")) == len(rows)


@pytest.mark.system
@pytest.mark.skipif(CMARK is None, reason="cmark-gfm is not installed")
def test_cmark_renders_no_tag_from_a_hostile_table(tmp_path):
    _, md, _ = _outputs(_rows(MD_PAYLOAD), tmp_path)
    assert_markdown_is_text(md)


def test_the_summary_still_reads_as_before():
    from test_summary_json import doc
    md = step_summary_markdown(doc(exit_code=1))
    assert md.startswith("### bundled on cpu-x86_64: FAIL")
    assert "| --- | --- | --- | --- | --- |" in md and "`harness repro " in md
