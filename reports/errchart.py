"""Per family, an inline SVG of each case's error relative to its tolerance.

One dot per row with numbers (max |diff| / tolerance, the row's error_ratio
when it recorded one), sorted low to high on a log scale with a dashed line
at 1: above it the row is wrong, just below it is a near miss. A ratio of 0
sits on the floor, an infinite one in a band over the top. Plain SVG text,
no script.
"""
from __future__ import annotations

import math
from html import escape

import pandas as pd
from markupsafe import Markup

from . import error_ratio, fmt_diff

WIDTH, HEIGHT = 640, 170
LEFT, RIGHT, TOP, BOTTOM = 46, 70, 2, 10
INF_BAND = 22
NEAR_MISS = 0.5     # a passing ratio above this is a near miss


def _points(part: pd.DataFrame) -> list[dict]:
    points = []
    for row in part.to_dict("records"):
        ratio = error_ratio(row)
        if ratio is not None and ratio >= 0:
            points.append({"ratio": ratio, "case_id": str(row["case_id"]),
                           "outcome": str(row["outcome"]), "pass": bool(row["pass"]),
                           "diff": fmt_diff(row["max_abs_diff"])})
    return sorted(points, key=lambda p: (p["ratio"], p["case_id"]))


def _decades(points: list[dict]) -> tuple[int, int]:
    finite = [p["ratio"] for p in points if 0 < p["ratio"] < math.inf]
    lo = min(-2, math.floor(math.log10(min(finite)))) if finite else -2
    hi = max(1, math.ceil(math.log10(max(finite)))) if finite else 1
    # 10.0 ** d must stay a float: a hostile table's ratio near 1e308 is drawn at the top.
    return max(lo, -12), min(hi, 300)


def _fmt_decade(d: int) -> str:
    return f"{10.0 ** d:g}" if -3 <= d <= 3 else f"1e{d}"


def chart_svg(points: list[dict], family: str, colors: dict[str, str]) -> Markup:
    lo, hi = _decades(points)
    plot_top, plot_bottom = TOP + INF_BAND, HEIGHT - BOTTOM
    plot_w = WIDTH - LEFT - RIGHT

    def y_of(ratio: float) -> float:
        if ratio == math.inf:
            return TOP + INF_BAND / 2
        d = math.log10(ratio) if ratio > 0 else lo
        d = min(max(d, lo), hi)
        return plot_bottom - (d - lo) / (hi - lo) * (plot_bottom - plot_top)

    out = [f'<svg class="errchart" width="{WIDTH}" '
           f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
           f'data-family="{escape(family)}" data-points="{len(points)}" data-lo="{lo}" '
           f'data-hi="{hi}">',
           f'<title>{escape(family)}: max |diff| / tolerance per case, log scale</title>',
           f'<rect x="{LEFT}" y="{plot_top}" width="{plot_w}" height="{plot_bottom - plot_top}" '
           f'fill="#fafafa" stroke="#ccc"/>']
    for d in range(lo, hi + 1):
        y = y_of(10.0 ** d)
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#eee"/><text x="{LEFT - 4}" y="{y + 3:.1f}" font-size="10" '
                   f'text-anchor="end" fill="#666">{_fmt_decade(d)}</text>')
    if any(p["ratio"] == math.inf for p in points):
        out.append(f'<text x="{LEFT - 4}" y="{y_of(math.inf) + 3:.1f}" font-size="10" '
                   f'text-anchor="end" fill="#666">∞</text>')
    y1 = y_of(1.0)
    out.append(f'<line class="tol" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y1:.1f}" '
               f'y2="{y1:.1f}" stroke="#c62828" stroke-dasharray="5 3" data-y="{y1:.1f}"/>'
               f'<text x="{LEFT + plot_w + 4}" y="{y1 + 3:.1f}" font-size="10" '
               f'fill="#c62828">tolerance</text>')
    step = plot_w / max(len(points), 1)
    for i, p in enumerate(points):
        x, y = LEFT + (i + 0.5) * step, y_of(p["ratio"])
        color = colors.get(p["outcome"], "#555") if not p["pass"] else colors.get("match", "#2e7d32")
        out.append(f'<circle class="pt" cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{color}" '
                   f'data-case-id="{escape(p["case_id"])}" data-ratio="{p["ratio"]:.6g}">'
                   f'<title>{escape(p["case_id"])}: {escape(p["outcome"])}, max |diff| '
                   f'{escape(p["diff"])}, {p["ratio"]:.3g}× tolerance</title></circle>')
    out.append("</svg>")
    return Markup("".join(out))


def family_charts(df: pd.DataFrame, colors: dict[str, str]) -> list[dict]:
    """[{family, svg, n_points, n_skipped, n_over, n_near}] for each family with a number."""
    charts = []
    for family, part in df.groupby("family", sort=True):
        points = _points(part)
        if not points:
            continue
        charts.append({
            "family": family, "svg": chart_svg(points, str(family), colors),
            "n_points": len(points), "n_skipped": len(part) - len(points),
            "n_over": sum(p["ratio"] > 1 for p in points),
            "n_near": sum(NEAR_MISS < p["ratio"] <= 1 for p in points),
        })
    return charts
