"""The one table a benchmark run prints, and its JSON record under results/bench/."""
from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import ROOT, Section

RESULTS = ROOT / "results" / "bench"


def _value(v: float | None) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def format_table(sections: list[Section]) -> str:
    rows = [r for s in sections for r in s.rows]
    head = ("section", "measure", "value", "unit", "note")
    cells = [(r.section, r.what, _value(r.value), r.unit, r.note) for r in rows]
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) if cells else len(head[i])
              for i in range(4)]
    lines = []
    for cell in [head, tuple("-" * w for w in widths) + ("-" * 4,), *cells]:
        left = f"{cell[0]:<{widths[0]}}  {cell[1]:<{widths[1]}}  {cell[2]:>{widths[2]}}  "
        lines.append((left + f"{cell[3]:<{widths[3]}}  {cell[4]}").rstrip())
    return "\n".join(lines)


def print_sections(sections: list[Section]) -> None:
    print(format_table(sections), flush=True)


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> dict:
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": _git("rev-parse", "HEAD"), "dirty": dirty}


def machine() -> dict:
    import torch
    gpu = torch.cuda.is_available()
    return {
        "node": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_device": torch.cuda.get_device_name(0) if gpu else None,
        "cuda_device_count": torch.cuda.device_count() if gpu else 0,
    }


def write_record(sections: list[Section], mode: str, wall_s: float,
                 out_dir: Path = RESULTS) -> Path:
    """results/bench/<UTC date-time>-<short commit>.json: the table, the raw figures, where and when."""
    now = datetime.now(timezone.utc)
    rev = commit()
    short = (rev["commit"][:10] or "unknown") + ("-dirty" if rev["dirty"] else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{short}.json"
    record = {
        "date": now.isoformat(timespec="seconds"), **rev, "mode": mode, "wall_s": wall_s,
        "machine": machine(),
        "table": [asdict(r) for s in sections for r in s.rows],
        "raw": {s.name: s.raw for s in sections},
    }
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return path
