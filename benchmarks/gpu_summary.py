"""Outcome counts and failing-row classes of a device run's tables, as Markdown.

  python benchmarks/gpu_summary.py RESULTS_DIR OUT_DIR

Reads every non-empty *.jsonl under RESULTS_DIR; writes OUT_DIR/summary.md (per target,
version and arch: a route x family x outcome table, each failing class with one case id,
the skip reasons) and OUT_DIR/counts.csv. Used by the GPU scripts, which run it last so a
run cut short still leaves its summary.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def _cell(text, width: int) -> str:
    return str(text or "").replace("|", "/").replace("\n", " ")[:width]


def summarize(df: pd.DataFrame) -> list[str]:
    md = ["# GPU run: outcome counts and failing-row classes", ""]
    for (target, version, arch), part in df.groupby(["target", "target_version", "arch"]):
        md += [f"## {target} {version} on {arch}: {len(part)} rows, "
               f"{int((~part['pass']).sum())} failing", ""]
        table = pd.crosstab([part["route"], part["family"]], part["outcome"], margins=True,
                            margins_name="total")
        try:
            md += [table.to_markdown(), ""]
        except ImportError:       # to_markdown needs tabulate
            md += ["```", table.to_string(), "```", ""]
        failing = part[~part["pass"]]
        if len(failing):
            md += ["Failing-row classes (route, family, outcome): count, one example", "",
                   "| route | family | outcome | n | example case id | message |",
                   "|---|---|---|---|---|---|"]
            for (route, fam, outcome), cls in failing.groupby(["route", "family", "outcome"]):
                ex = cls.iloc[0]
                md.append(f"| {route} | {fam} | {outcome} | {len(cls)} | {ex['case_id']} | "
                          f"{_cell(ex.get('message'), 220)} |")
            md.append("")
        skipped = part[part["outcome"] == "skipped"]
        if len(skipped):
            md += ["Skip reasons: count", ""]
            for why, n in skipped["message"].fillna("").str[:160].value_counts().items():
                md.append(f"- {n}: {why}")
            md.append("")
    return md


def main(argv: list[str]) -> int:
    res, out = Path(argv[0]), Path(argv[1])
    frames = [pd.read_json(f, lines=True) for f in sorted(res.glob("*.jsonl"))
              if f.stat().st_size]
    if not frames:
        (out / "summary.md").write_text("No rows yet.\n")
        return 0
    df = pd.concat(frames, ignore_index=True)
    df["pass"] = df["pass"].astype(bool)
    (df.groupby(["target", "route", "family", "outcome"]).size().rename("n").reset_index()
       .to_csv(out / "counts.csv", index=False))
    md = summarize(df)
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:60]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
