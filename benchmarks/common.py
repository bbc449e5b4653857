"""What every benchmark shares: the repository root, fresh-process timing, the engine command,
the case sets of a quick and a full run, and the rows of the one table bench.py prints."""
from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (python benchmarks/x.py) as well as with -m
    sys.path.insert(0, str(ROOT))

# Cases a quick run measures: every k-th case of the default set, so every family and route
# keeps its share while the matrix grows, and the run stays a few minutes long.
QUICK_CASES = 150


@dataclass
class Row:
    """One line of the table: section, what, value (None: not measured), unit, note."""
    section: str
    what: str
    value: float | None
    unit: str = ""
    note: str = ""


@dataclass
class Section:
    """A benchmark's rows plus the raw figures that go into the JSON record only."""
    name: str
    rows: list[Row] = field(default_factory=list)
    raw: dict = field(default_factory=dict)

    def add(self, what: str, value: float | None, unit: str = "", note: str = "") -> None:
        self.rows.append(Row(self.name, what, value, unit, note))

    def to_json(self) -> dict:
        return {"name": self.name, "rows": [asdict(r) for r in self.rows], "raw": self.raw}

    @classmethod
    def from_json(cls, data: dict) -> "Section":
        return cls(data["name"], [Row(**r) for r in data["rows"]], data.get("raw", {}))


def one_thread_env() -> dict:
    """A child's environment with one OpenMP thread (unless the caller chose a number): the host
    kernels and torch's CPU ops otherwise spread over every core, and on a shared machine their
    threads' waits make the same small call vary by 10x from one second to the next."""
    return child_env(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


@dataclass
class Timed:
    wall_s: float
    cpu_s: float    # user + system of the process and every descendant it waited for
    proc: subprocess.CompletedProcess


def children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def timed(cmd: list[str], env: dict | None = None) -> Timed:
    """One command run from the repository root, with its wall and CPU seconds.

    CPU time barely moves with other load on the machine, wall time does: a ratio of CPU
    times stays meaningful on a busy machine, but misses time spent waiting (disk flushes)."""
    cpu0, start = children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env or child_env(), capture_output=True, text=True)
    return Timed(time.perf_counter() - start, children_cpu() - cpu0, proc)


def last_json_line(proc: subprocess.CompletedProcess) -> dict:
    """A child's result: the last stdout line, as JSON; the child's stderr when there is none."""
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{proc.args[:4]}... printed no result (exit {proc.returncode}): "
                       f"{proc.stderr[-1500:]}")


def python_json(module: str, *args: str, env: dict | None = None) -> tuple[Timed, dict]:
    """(its times, its JSON result) of `python -m module args` in a fresh process."""
    run = timed([sys.executable, "-m", module, *args], env)
    return run, last_json_line(run.proc)


def rows_of(results: Path) -> list[dict]:
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


@dataclass
class EngineRun:
    wall_s: float
    cpu_s: float
    rows: list[dict]
    exit_code: int

    @property
    def case_seconds(self) -> float:
        """Time inside execute_case, summed over the rows (their duration_s)."""
        return sum(float(r.get("duration_s") or 0.0) for r in self.rows)


@dataclass(frozen=True)
class Selection:
    """The cases a run covers, as options that both `harness check` and bare_loop take."""
    args: tuple[str, ...]
    label: str


def selection(families=None, sample: int | None = None) -> Selection:
    """The families' cases (all when None); with `sample`, every k-th of them, at most that many."""
    scope = f"families {','.join(families)}" if families else "the default case set"
    if not sample:
        return Selection(("--family", ",".join(families)) if families else (), scope)
    from harness.engine.session import select_cases
    cases = select_cases("bundled", list(families) if families else None)
    step = max(1, -(-len(cases) // sample))
    picked = cases[::step]
    folder = Path(tempfile.mkdtemp(prefix="bench-cases-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "cases.json"
    path.write_text(json.dumps([c.to_json() for c in picked]))
    return Selection(("--cases-file", str(path)),
                     f"every {step} of {len(cases)} cases of {scope}: {len(picked)}")


def add_selection_arguments(ap) -> None:
    ap.add_argument("--family", default=None, help="families, comma-separated [all]")
    ap.add_argument("--sample", type=int, default=None, help="at most this many cases, evenly spread")


def selection_from(args) -> Selection:
    return selection([f for f in (args.family or "").split(",") if f] or None, args.sample)


def engine_run(selection_args, workers: int, env: dict | None = None) -> EngineRun:
    """`python -m harness check` on the bundled target, as a user runs it, into a scratch table.

    selection_args: the check's selection options (Selection.args, ["--case-id", ...])."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        results = Path(tmp) / "rows.jsonl"
        run = timed([sys.executable, "-m", "harness", "check", "--target", "bundled",
                     "-n", str(workers), "--results", str(results), *selection_args], env)
        return EngineRun(run.wall_s, run.cpu_s, rows_of(results), run.proc.returncode)


def best(values) -> float:
    """The figure of several rounds: the least disturbed one (other load only adds time)."""
    return min(values)


def median(values) -> float:
    return statistics.median(values)
