"""The manual's case counts are the generator's: recomputed here, so they cannot go stale.

`python -m tests.test_readme_counts` prints the table docs/families.md holds between its
`<!-- case-counts -->` markers (what `harness list` lists for the bundled target, per family
and per feature), and the profile totals its prose quotes; docs/commands.md's example of a
two-family check quotes its count too.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

from cases import family_names, generate
from harness.model.routes import BUNDLED_ROUTES

DOCS = Path(__file__).resolve().parents[1] / "docs"
FAMILIES, COMMANDS = DOCS / "families.md", DOCS / "commands.md"
FEATURES = ("softcap", "sinks", "alibi", "fp8_kv", "multi_token_decode", "custom_mask")
BEGIN, END = "<!-- case-counts -->", "<!-- /case-counts -->"


@lru_cache(maxsize=None)
def profile_cases(profile: str) -> tuple:
    """Every case of the profile on the bundled target's routes, generated once for the
    table and the totals both."""
    return tuple(generate(None, BUNDLED_ROUTES, profile=profile))


def table(profile: str = "ci") -> str:
    """Markdown: cases per family, then cases per feature (a case using several features
    counts under each), for the bundled target's routes."""
    cases = profile_cases(profile)
    fams = Counter(c.family for c in cases)
    feats = Counter(f for c in cases for f in c.requires if f in FEATURES)
    lines = ["| family | cases |", "| --- | ---: |"]
    lines += [f"| `{f}` | {fams[f]} |" for f in family_names()]
    lines += [f"| total | {len(cases)} |", "", "| feature | cases |", "| --- | ---: |"]
    lines += [f"| `{f}` | {feats[f]} |" for f in FEATURES]
    return "\n".join(lines)


def _block(text: str) -> str:
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert m, f"docs/families.md has no {BEGIN} ... {END} block"
    return m.group(1)


def test_readme_case_count_table_is_current():
    assert _block(FAMILIES.read_text()) == table("ci"), \
        "docs/families.md's case counts are stale: paste `python -m tests.test_readme_counts`"


def test_readme_profile_totals_are_current():
    text = FAMILIES.read_text()
    ci, full = len(profile_cases("ci")), len(profile_cases("full"))
    m = re.search(r"`--profile ci` \(the\s+default\s+without\s+a\s+GPU\)\s+has\s+(\d+)\s+cases", text)
    assert m and int(m.group(1)) == ci, (m and m.group(1), ci)
    m = re.search(r"`--profile full` \(the\s+default\s+with\s+a\s+GPU\)\s+has\s+(\d+)", text)
    assert m and int(m.group(1)) == full, (m and m.group(1), full)


def test_readme_command_counts_are_current():
    text = COMMANDS.read_text()
    m = re.search(r"--family gqa,strided\s+# (\d+) cases", text)
    assert m, "docs/commands.md's gqa,strided example lost its count"
    assert int(m.group(1)) == len(generate(["gqa", "strided"], BUNDLED_ROUTES, profile="ci"))


if __name__ == "__main__":
    print(BEGIN)
    print(table("ci"))
    print(END)
    print("ci", len(generate(None, BUNDLED_ROUTES, profile="ci")),
          "full", len(generate(None, BUNDLED_ROUTES, profile="full")))
