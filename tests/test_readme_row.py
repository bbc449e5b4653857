"""The results row README.md shows is the one its command makes: the command it names beside
the row runs here (in-process, `cli.main`), and every column shown must equal the row's.

The row's block sits between `<!-- readme-row -->` markers; the README's prose also says the
same case passes with the guards on, by a refusal that names q's stride: checked here too.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- readme-row -->", "<!-- /readme-row -->"
GUARDS_ENV = "KERNELS_DISABLE_GUARDS"


def shown_row() -> dict:
    text = README.read_text()
    m = re.search(re.escape(BEGIN) + r"\n```json\n(.*?)```\n" + re.escape(END), text, re.S)
    assert m, f"README.md has no {BEGIN} ... {END} block holding a json row"
    return json.loads(m.group(1))


def shown_command() -> list[str]:
    """The `harness repro ...` line README.md names as the row's source."""
    lines = re.findall(r"^harness repro .*$", README.read_text(), re.M)
    assert len(lines) == 1, f"README.md should name one repro command, names {lines}"
    return shlex.split(lines[0])[1:]


@pytest.fixture(scope="module")
def kept_cases() -> dict:
    return {}


@pytest.fixture
def cases_once(monkeypatch, kept_cases):
    """repro looks the case id up in every profile's cases (session.all_cases, about a
    CPU-second to generate); both runs here look it up among the bundled target's, which
    are the same whatever its options: generated once for the module, by the same function."""
    from harness.engine import session
    real = session.all_cases

    def all_cases(target):
        key = (target.name, tuple(target.routes), repr(target.capabilities.dtypes))
        if key not in kept_cases:
            kept_cases[key] = real(target)
        return kept_cases[key]
    monkeypatch.setattr(session, "all_cases", all_cases)


def repro(argv: list[str]) -> dict:
    from harness import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cli.main(argv + ["--in-process"])
    rows = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    assert len(rows) == 1, out.getvalue()[-2000:] + err.getvalue()[-2000:]
    return rows[0]


def test_the_readme_row_is_what_its_command_writes(monkeypatch, cases_once):
    monkeypatch.setenv(GUARDS_ENV, "")   # restored after, whatever repro sets
    shown, argv = shown_row(), shown_command()
    assert "--json" in argv and shown["case_id"] in argv
    row = repro(argv)
    for column, value in shown.items():
        assert row.get(column) == value, (column, row.get(column), value)


def test_with_the_guards_on_the_same_case_is_refused_naming_q_and_its_stride(monkeypatch,
                                                                          cases_once):
    monkeypatch.delenv(GUARDS_ENV, raising=False)
    shown = shown_row()
    row = repro(["repro", shown["case_id"], "--json"])
    assert (row["outcome"], row["pass"]) == ("refused", True), row
    assert re.search(r"\bq\b", row["message"]) and "stride" in row["message"], row["message"]


@pytest.mark.parametrize("column", ["outcome", "pass", "n_wrong", "n_total", "expect"])
def test_the_readme_row_shows_the_columns_a_reader_needs(column):
    assert column in shown_row()
