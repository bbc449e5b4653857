"""Reports of hostile tables: every field escaped in every context, no path from a row, and
no input that makes the loader or a renderer fail with anything but the loader's one line."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.model.classify import OUTCOMES
from harness.results import table
from reports import load_results
from reports.html import render_html
from reports.markdown import render_markdown
from test_reports import parse

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else shutil.which("chromium")

SCRIPT = "<script>document.body.setAttribute('data-pwned','script')</script>"
ATTR = "\"' onmouseover=\"x\" autofocus onfocus=\"document.body.setAttribute('data-pwned','attr')\" x='"
IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">"
URL = "javascript:document.body.setAttribute('data-pwned','url')"
PATH = "../../../../tmp/harness-pwned"
CLOSE = "</script><script>document.body.setAttribute('data-pwned','close')</script>"
PAYLOADS = (SCRIPT, ATTR, IMG, URL, PATH, CLOSE)
MD_PAYLOAD = "[click](https://evil.example/x) ![i](x.png) @octocat `code` | pipe <b>html</b> &amp;"

TEXT_COLUMNS = ("run_id", "timestamp", "arch", "platform", "target", "target_version",
                "library_commit", "build_hash", "route", "family", "case_id", "expect",
                "message", "error_type", "stage", "severity", "worker", "disable_guards",
                "profile", "first_bad_index", "isolation", "ledger", "case_json")


def hostile_rows() -> list[dict]:
    """Every string field of every row holds a payload; outcomes cover failing and passing."""
    rows = []
    for i, payload in enumerate(PAYLOADS * 2):
        outcome = ("wrong", "crash", "match", "refused", "nondeterministic", "hang")[i % 6]
        row = {col: f"{payload}{i}" for col in TEXT_COLUMNS}
        row.update(outcome=outcome, **{"pass": outcome in ("match", "refused")},
                   max_abs_diff=0.5, tolerance=0.1, n_wrong=3, n_total=8,
                   params=json.dumps({"head_dim": 64, "note": payload}),
                   attempts=[{"outcome": payload, "max_abs_diff": 1.0},
                             {"outcome": outcome, "max_abs_diff": 0.5}],
                   sanitizer={"tool": payload, "kernel": payload, "kind": payload,
                              "source": payload},
                   reruns=1, repeat=2, flaky=payload)
        row["case_id"] = f"{payload}/{i}"
        rows.append(row)
    # An outcome outside the known list (a table that skipped the loader) reaches no
    # attribute name.
    rows[0]["outcome"] = "x\" onclick=\"document.body.setAttribute('data-pwned','outcome')"
    return rows


def hostile_frame() -> pd.DataFrame:
    return pd.DataFrame(hostile_rows())


ALLOWED_ATTRS = re.compile(r"^(id|class|title|href|type|placeholder|size|lang|charset|open|value|"
                           r"viewbox|width|height|xmlns|role|cx|cy|r|x|y|x1|x2|y1|y2|fill|"
                           r"stroke|stroke-dasharray|stroke-width|d|points|text-anchor|"
                           r"font-size|transform|opacity|data-[a-z0-9-]+)$")


def _check_static(html: str) -> None:
    elements = parse(html)
    assert [e["tag"] for e in elements].count("script") == 1   # ours, with no table text
    script = html[html.index("<script>"):html.index("</script>")]
    assert "pwned" not in script
    outcome_attrs = {f"data-count-{o.replace('_', '-')}" for o in OUTCOMES}
    for e in elements:
        assert e["tag"] not in ("img", "iframe", "object", "embed"), e
        for name, value in e.items():
            if name in ("tag", "_text"):
                continue
            assert ALLOWED_ATTRS.match(name), (name, e["tag"])
            assert not name.startswith("on"), name
            if name.startswith("data-count-"):
                assert name in outcome_attrs, name
            if name in ("href", "src", "action", "formaction"):
                assert value.startswith("#") or re.match(r"^https?://", value), value


def test_the_html_report_of_a_hostile_table_escapes_every_field(tmp_path):
    out = tmp_path / "out" / "report.html"
    render_html(hostile_frame(), out, base_df=hostile_frame().assign(outcome="match"),
                title=SCRIPT + ATTR)
    html = out.read_text()
    _check_static(html)
    for payload in (SCRIPT, ATTR, IMG, CLOSE):
        assert payload not in html   # each markup payload appears only escaped
    assert "&lt;script&gt;" in html
    # Nothing written anywhere but the output path.
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == \
        ["out", "out/report.html"]
    assert not Path("/tmp/harness-pwned").exists()


@pytest.mark.system
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make browser-deps "
                                             "installs it)")
def test_no_script_from_a_hostile_table_runs_in_a_browser(tmp_path):
    out = render_html(hostile_frame(), tmp_path / "report.html",
                      base_df=hostile_frame().assign(outcome="match"), title=SCRIPT)
    before = set(tmp_path.iterdir())
    fragment = "family=" + "%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
           "--dump-dom", out.resolve().as_uri() + "#" + fragment]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    body = next(e for e in parse(done.stdout) if e["tag"] == "body")
    assert body.get("data-ready") == "1"         # our script ran to its end
    assert "data-pwned" not in body, body.get("data-pwned")
    assert not Path("/tmp/harness-pwned").exists()
    assert set(tmp_path.iterdir()) - before <= {tmp_path / "profile"}


def _outside_code(md: str) -> str:
    return "\n".join(re.sub(r"(?<!\\)(`+).+?(?<!`)\1(?!`)", "", line) for line in md.splitlines())


def _unescaped(text: str, char: str) -> list[int]:
    return [m.start() for m in re.finditer(r"(?<!\\)" + re.escape(char), text)]


def test_the_markdown_of_a_hostile_table_is_text_only():
    df = hostile_frame()
    for col in ("message", "case_id", "route", "arch", "error_type"):
        df[col] = df[col] + MD_PAYLOAD
    md = render_markdown(df, base_df=df.assign(outcome="match", **{"pass": True}),
                         title=MD_PAYLOAD)
    # Outside code spans (whose text Markdown shows as it is): no raw HTML tag, no
    # [text](url) link or image, no @mention, no bare autolink.
    text = _outside_code(md)
    assert not re.search(r"<[A-Za-z/!]", text)
    assert not re.search(r"(?<!\\)\]\(", text)
    assert not re.search(r"@[A-Za-z0-9]", text)
    assert "https://evil" not in text
    assert "`code`" in md or "\\`code\\`" in md   # the payload is there, shown, not acted on
    # Each table's rows have as many cells as its header: no field made a new cell.
    blocks, block = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    assert len(blocks) >= 3
    for block in blocks:
        cells = [len(_unescaped(re.sub(r"(`+).+?\1", "", line), "|")) for line in block]
        assert set(cells) == {cells[0]}, block


@pytest.mark.system
def test_a_report_without_out_is_named_by_the_table_file_never_its_rows(tmp_path):
    rows = []
    for i, payload in enumerate(PAYLOADS):
        row = {c: f"{payload}{i}" for c in ("run_id", "route", "family", "message", "stage",
                                             "error_type", "worker", "profile")}
        row.update(case_id=f"{PATH}/{i}", outcome="wrong", arch="gfx942", target="bundled",
                   **{"pass": False})
        rows.append(row)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([os.sys.executable, "-m", "harness", "report", "--results", str(path)],
                          cwd=work, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == \
        ["reports", "reports/out", "reports/out/t.html"]
    # An arch that would make a path is refused by the loader, in one line.
    rows[0]["arch"] = "../../x"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = subprocess.run([os.sys.executable, "-m", "harness", "report", "--results", str(path)],
                         cwd=work, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert f"{path}:1:" in bad.stderr and "'arch'" in bad.stderr


# ------------------------------------------------------------------ fuzz

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
                    st.sampled_from(PAYLOADS + (MD_PAYLOAD,)))
_value = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)
_safe = st.from_regex(r"^[A-Za-z0-9_.+-]{1,12}$", fullmatch=True)


_floats_or_none = st.one_of(st.none(), st.floats(allow_nan=True))
# Each field's strategy, built once: a strategy built inside the composite is built and
# validated again at every draw, which was half of this test's time.
_ROW_FIELDS = {
    "run_id": st.sampled_from(["r1", "r2"]),
    "case_id": st.text(min_size=1, max_size=20),
    "outcome": st.sampled_from(OUTCOMES), "pass": st.booleans(),
    "arch": _safe, "target": _safe,
    "route": st.text(max_size=20), "family": st.text(max_size=10),
    "message": st.one_of(st.text(max_size=40), st.sampled_from(PAYLOADS)),
    "max_abs_diff": _floats_or_none,
    "tolerance": st.one_of(st.none(), st.floats(0, 10)),
    **{f"{out}_{what}": _floats_or_none
       for out in ("o", "lse") for what in ("max_abs_diff", "tolerance", "error_ratio")},
    "n_wrong": st.one_of(st.none(), st.integers(0, 100)),
    "n_total": st.one_of(st.none(), st.integers(1, 100)),
    "attempts": st.one_of(st.none(), st.lists(st.fixed_dictionaries(
        {"outcome": st.sampled_from(OUTCOMES), "max_abs_diff": st.floats()}), max_size=2)),
    "params": st.one_of(st.none(), st.text(max_size=20),
                        st.dictionaries(st.text(max_size=5), _scalar, max_size=3)),
    "disable_guards": st.one_of(st.none(), st.text(max_size=10)),
    "sanitizer": st.one_of(st.none(), st.dictionaries(
        st.sampled_from(["tool", "kernel", "kind", "where", "source"]), st.text(max_size=10),
        max_size=4)),
}
_BREAK_ONE = st.integers(0, 3)
_BROKEN_KEY = st.one_of(st.sampled_from(list(table.COLUMNS)), st.text(max_size=8))


@st.composite
def rows(draw):
    """Mostly rows the loader takes (so the renderers see them), some with a field broken."""
    row = {name: draw(strategy) for name, strategy in _ROW_FIELDS.items()}
    if draw(_BREAK_ONE) == 0:
        row[draw(_BROKEN_KEY)] = draw(_value)
    return row


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(rows(), min_size=1, max_size=6), st.integers(0, 2))
def test_random_rows_load_or_fail_in_one_line_and_always_render(tmp_path, drawn, tear):
    path = tmp_path / "fuzz.jsonl"
    text = "".join(json.dumps(r, allow_nan=True) + "\n" for r in drawn)
    if tear == 1:
        text = text[:-max(1, len(text) // 7)]   # a torn last line
    path.write_text(text)
    try:
        df = load_results([path])
    except table.TableError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    render_html(df, tmp_path / "fuzz.html")
    md = render_markdown(df)
    assert not re.search(r"<[A-Za-z/!]", _outside_code(md))
    assert not math.isnan(len(md))


def test_a_guards_field_that_is_not_json_still_renders_its_repro():
    from reports import guards_of
    assert guards_of({"disable_guards": "["}) == ["["]
    assert guards_of({"disable_guards": '["a", "b"]'}) == ["a", "b"]
    assert guards_of({"disable_guards": "a,b"}) == ["a", "b"]
    assert guards_of({"disable_guards": '"x"'}) == ['"x"']


# Controls a terminal acts on (ESC starts a colour or a cursor move), bidi overrides that
# show text in another order than it is, zero-width and line-separator characters.
UNSEEN = "\x01\x1b[31m\u202e\u2066\u200b\u2028\x7f\x85"


def _unseen_in(text: str, keep: str = "\n") -> list[str]:
    return sorted({c for c in text if not c.isprintable() and c not in keep})


def test_no_control_or_bidi_character_of_a_table_reaches_a_report(tmp_path):
    df = hostile_frame()
    for col in ("message", "case_id", "route", "target_version"):
        df[col] = df[col] + UNSEEN
    md = render_markdown(df, base_df=df.assign(outcome="match", **{"pass": True}))
    assert _unseen_in(md) == []
    assert "\\x1b[31m\\u202e" in md     # shown as escapes, never dropped
    html = render_html(df, tmp_path / "r.html").read_text()
    assert _unseen_in(html, keep="\n\t") == []
    assert "\\x1b[31m\\u202e" in html
    _check_static(html)
