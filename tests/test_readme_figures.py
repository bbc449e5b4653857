"""Every figure README.md states can be traced: it is in a block a test recomputes (the
results row between `<!-- readme-row -->` markers: tests/test_readme_row.py), or its
paragraph names the command that produces it (a code span such as `make bench`).

A figure is a number standing alone in the prose: digits inside a name (`fp64`, `sm_90`,
`bf16-d128`) or inside a code span or block (a command, a path, a case id) are not figures.
"""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
CHECKED_BLOCKS = [("<!-- readme-row -->", "<!-- /readme-row -->")]
# A code span that is a command a reader can run to get the figure again.
COMMAND = re.compile(r"`(?:make|harness|python3?|pytest|bash)\b[^`]*`")
FIGURE = re.compile(r"(?<![\w.\-/^])\d+(?:[.,]\d+)*(?![\w])")


def paragraphs(text: str) -> list[str]:
    """The prose: the checked blocks and every fenced code block taken out, then split on
    blank lines."""
    for begin, end in CHECKED_BLOCKS:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), "", text, flags=re.S)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def untraced(text: str) -> list[tuple[str, str]]:
    """(figure, its paragraph's start) for each figure whose paragraph names no command."""
    found = []
    for para in paragraphs(text):
        if COMMAND.search(para):
            continue
        prose = re.sub(r"`[^`]*`", "", para)              # code spans: names, not figures
        prose = re.sub(r"\]\([^)]*\)", "]", prose)          # link targets: paths
        found += [(m.group(0), para.strip()[:80]) for m in FIGURE.finditer(prose)]
    return found


def test_every_readme_figure_is_checked_or_beside_its_command():
    assert untraced(README.read_text()) == []


def test_a_figure_without_its_command_is_caught_and_one_beside_it_is_not():
    bare = "The suite runs 1,486 tests in 115 s on two cores.\n"
    assert [f for f, _ in untraced(bare)] == ["1,486", "115"]
    assert untraced("`make test` prints it: 1,486 tests in 115 s.\n") == []
    # Names and code are not figures; a checked block is not prose.
    assert untraced("fp64 and `bf16-d128`, sm_90, [docs](docs/x1.md)\n") == []
    row = "<!-- readme-row -->\n```json\n{\"n_wrong\": 8256}\n```\n<!-- /readme-row -->\n"
    assert untraced(row) == []
    assert untraced("```sh\nharness list | head -10\n```\nten 10\n") == [("10", "ten 10")]


def test_the_readme_is_a_first_page():
    """At most 150 lines: what it is, the two commands, a row, the layout, links."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    for heading in ("## Two commands", "## A results row", "## Layout"):
        assert heading in lines, heading
