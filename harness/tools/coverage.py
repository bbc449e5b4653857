"""Branch coverage of the bundled library under a check: its C++ (gcov) and its Python.

    python -m harness.tools.coverage [--profile ci] [CHECK ARGS...]

Builds the library's coverage variant (kernels/build.py --coverage), runs `harness check
--target bundled` with env KERNELS_COVERAGE_DIR pointing at a fresh folder under
results/coverage/, then prints line and branch coverage of kernels/csrc and of kernels/*.py,
per file and in total, and every branch no case takes, as `file:line: source (branch k of n
not taken: what)`. The same text goes to results/coverage/coverage.txt. Exit 0 when it
measured (a number is never pass or fail), 1 when the check could not run, 2 on bad usage.

Every process of the run counts: each interpreter starts the Python tracer below from a
sitecustomize.py the run puts first on PYTHONPATH (child_env keeps it for every child), and
writes its counters before it leaves, by os._exit too (harness/engine/fast_exit.py).

The Python tracer: sys.settrace, for code under kernels/ only (every other frame gets no
local tracer, so costs one lookup per call), with opcode events, so it records which way
every conditional jump went. A branch is a conditional jump whose source is one of ast's
branch points (if, while, for, a conditional expression, and/or, a comprehension's for and
if, except, match case, assert): a line's branches are its jumps' two ways, in code order.
Test-only code is left out: kernels/testonly.py, csrc/testonly/, csrc/crash.cpp (injected
crashes), and kernels/build.py (the build, which a check runs once, not the library).
"""
from __future__ import annotations

import ast
import atexit
import dis
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

# kernels.build.COVERAGE_ENV, spelled out: importing kernels here would run its modules
# before the tracer starts (sitecustomize imports this module first), so their top-level
# lines would count as never run.
COVERAGE_ENV = "KERNELS_COVERAGE_DIR"

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CSRC = KERNELS / "csrc"
OUT_ROOT = ROOT / "results" / "coverage"
PY_EXCLUDED = {"testonly.py", "build.py"}
CPP_EXCLUDED = {"crash.cpp"}
CPP_EXCLUDED_DIRS = {"testonly", "coverage"}
EXIT_MEASURED, EXIT_NO_CHECK, EXIT_USAGE = 0, 1, 2
CASE_TIMEOUT_S = 600
SITECUSTOMIZE = f"""\
# Written by harness.tools.coverage for one run: every interpreter of the run traces kernels/.
import os
if os.environ.get({COVERAGE_ENV!r}):
    from harness.tools import coverage
    coverage.start_tracing()
"""

# ----------------------------------------------------------------------- the Python tracer

# (way when it falls through, way when it jumps) of each conditional jump of Python 3.11.
JUMP_WAYS = {
    "POP_JUMP_FORWARD_IF_FALSE": ("true", "false"), "POP_JUMP_BACKWARD_IF_FALSE": ("true", "false"),
    "POP_JUMP_FORWARD_IF_TRUE": ("false", "true"), "POP_JUMP_BACKWARD_IF_TRUE": ("false", "true"),
    "POP_JUMP_FORWARD_IF_NONE": ("not None", "None"), "POP_JUMP_BACKWARD_IF_NONE": ("not None", "None"),
    "POP_JUMP_FORWARD_IF_NOT_NONE": ("None", "not None"),
    "POP_JUMP_BACKWARD_IF_NOT_NONE": ("None", "not None"),
    "JUMP_IF_FALSE_OR_POP": ("true", "false"), "JUMP_IF_TRUE_OR_POP": ("false", "true"),
    "POP_JUMP_IF_FALSE": ("true", "false"), "POP_JUMP_IF_TRUE": ("false", "true"),
    "POP_JUMP_IF_NONE": ("not None", "None"), "POP_JUMP_IF_NOT_NONE": ("None", "not None"),
    "FOR_ITER": ("next item", "exhausted"),
}


class Tracer:
    """Per code object, the (previous offset, offset) pairs its frames executed."""

    def __init__(self, root: Path, out_dir: Path):
        self.prefix = str(root) + os.sep
        self.out_dir = out_dir
        self.codes: dict = {}   # code -> set of arcs, or None for code outside root

    def _global(self, frame, event, arg):
        code = frame.f_code
        arcs = self.codes.get(code, False)
        if arcs is False:
            arcs = self.codes[code] = set() if code.co_filename.startswith(self.prefix) else None
        if arcs is None:
            return None
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        last = -1

        def local(frame, event, arg):
            nonlocal last
            if event == "opcode":
                at = frame.f_lasti
                arcs.add((last, at))
                last = at
            return local
        return local

    def start(self) -> None:
        sys.settrace(self._global)
        threading.settrace(self._global)

    def clear(self) -> None:
        """A forked child's: what it inherited is its parent's to write."""
        for arcs in self.codes.values():
            if arcs:
                arcs.clear()

    def write(self) -> None:
        """This process's arcs since the last write, to a file of their own; then none."""
        data: dict = {}
        for code, arcs in list(self.codes.items()):
            if arcs:
                key = f"{code.co_qualname}:{code.co_firstlineno}"
                data.setdefault(code.co_filename, {}).setdefault(key, []).extend(sorted(arcs))
                arcs.clear()
        if not data:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)


_TRACER: Tracer | None = None


def start_tracing() -> Tracer:
    """Trace kernels/ in this process into <KERNELS_COVERAGE_DIR>/py/, written at exit, at
    every fast_exit flush, and never twice (a forked child starts from nothing)."""
    global _TRACER
    if _TRACER is None:
        from harness.engine import fast_exit
        _TRACER = Tracer(KERNELS, Path(os.environ[COVERAGE_ENV]) / "py")
        fast_exit.on_flush(_TRACER.write)
        atexit.register(_TRACER.write)
        os.register_at_fork(after_in_child=_TRACER.clear)
        _TRACER.start()
    return _TRACER


# ----------------------------------------------------------------------- Python analysis

def _code_objects(code):
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from _code_objects(c)


def _span(node) -> tuple:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


def _inside(pos, span) -> bool:
    return (pos[0], pos[1]) >= (span[0], span[1]) and (pos[2], pos[3]) <= (span[2], span[3])


def branch_points(tree) -> list[tuple[tuple, tuple, str]]:
    """(whole span, part span, kind) of every ast branch point: a jump is the point's when
    its position is the whole node (3.11 gives an if's jumps the whole statement) or lies in
    the part that decides (a while's test, a case's pattern)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            found.append((_span(node), _span(node.test), "if"))
        elif isinstance(node, ast.While):
            found.append((_span(node), _span(node.test), "while"))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            found.append((_span(node), _span(node.iter), "for"))
        elif isinstance(node, ast.IfExp):
            found.append((_span(node), _span(node.test), "conditional expression"))
        elif isinstance(node, ast.BoolOp):
            found.append((_span(node), _span(node), "and" if isinstance(node.op, ast.And) else "or"))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            found.append((_span(node), _span(node), "comprehension"))
        elif isinstance(node, ast.ExceptHandler):
            found.append((_span(node), _span(node.type or node), "except"))
        elif isinstance(node, ast.match_case):
            found.append((_span(node.pattern), _span(node.guard or node.pattern), "case"))
        elif isinstance(node, ast.Assert):
            found.append((_span(node), _span(node.test), "assert"))
    return found


def _kind_of(pos, points) -> str | None:
    best = None
    for whole, part, kind in points:
        if pos == whole or _inside(pos, part):
            size = (whole[2] - whole[0], whole[3] - whole[1])
            if best is None or size < best[0]:
                best = (size, kind)
    return best and best[1]


def python_file(path: Path, arcs_by_code: dict) -> dict:
    """{lines: {line: hit}, branches: [(line, k, n, taken, what)]} of one source file."""
    source = path.read_text()
    tree = ast.parse(source)
    points = branch_points(tree)
    lines: dict[int, bool] = {}
    per_line: dict[int, list] = {}
    for code in _code_objects(compile(source, str(path), "exec")):
        arcs = arcs_by_code.get(f"{code.co_qualname}:{code.co_firstlineno}", set())
        executed = {b for _, b in arcs}
        for start, end, line in code.co_lines():
            if line is not None and start != end:
                hit = any(start <= off < end for off in executed)
                lines[line] = lines.get(line, False) or hit
        instrs = list(dis.get_instructions(code))
        for i, ins in enumerate(instrs):
            ways = JUMP_WAYS.get(ins.opname)
            if ways is None or i + 1 == len(instrs) or ins.positions.lineno is None:
                continue
            pos = (ins.positions.lineno, ins.positions.col_offset, ins.positions.end_lineno,
                   ins.positions.end_col_offset)
            kind = _kind_of(pos, points)
            if kind is None:  # the compiler's own (a with statement's exit), no source branch
                continue
            nxt = instrs[i + 1].offset
            # A jump behind EXTENDED_ARG prefixes is traced at its first prefix's offset:
            # the arcs from the prefixes are the jump's.
            sources, j = {ins.offset}, i - 1
            while j >= 0 and instrs[j].opname == "EXTENDED_ARG":
                sources.add(instrs[j].offset)
                j -= 1
            went = {b for a, b in arcs if a in sources} - sources
            for way, taken in ((ways[0], nxt in went), (ways[1], bool(went - {nxt}))):
                per_line.setdefault(ins.positions.lineno, []).append((taken, f"{kind} {way}"))
    branches = [(line, k + 1, len(bs), taken, what)
                for line, bs in sorted(per_line.items()) for k, (taken, what) in enumerate(bs)]
    return {"lines": lines, "branches": branches}


def python_arcs(py_dir: Path) -> dict:
    """{filename: {code key: set of arcs}} over every process's files."""
    merged: dict = {}
    for f in sorted(py_dir.glob("*.json")) if py_dir.is_dir() else []:
        for filename, codes in json.loads(f.read_text()).items():
            for key, arcs in codes.items():
                merged.setdefault(filename, {}).setdefault(key, set()).update(map(tuple, arcs))
    return merged


def python_sources() -> list[Path]:
    return sorted(p for p in KERNELS.glob("*.py") if p.name not in PY_EXCLUDED)


# ----------------------------------------------------------------------- gcov analysis

def cpp_included(path: Path) -> bool:
    try:
        rel = path.resolve().relative_to(CSRC)
    except ValueError:
        return False
    return rel.name not in CPP_EXCLUDED and not (set(rel.parts[:-1]) & CPP_EXCLUDED_DIRS)


def gcov_files(gcda_dir: Path) -> dict:
    """{source path: {lines: {line: hit}, branches: [(line, k, n, taken, what)]}} from gcov's
    JSON. Template instantiations of a line are merged: a branch is taken when any
    instantiation takes it. Branches gcc adds for a call that may throw are left out."""
    gcdas = sorted(gcda_dir.glob("*.gcda"))
    if not gcdas:
        return {}
    out = subprocess.run(["gcov", "--json-format", "--stdout", "-b", "-c", *(str(g.resolve()) for g in gcdas)],
                         cwd=gcda_dir, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gcov failed: {out.stderr.strip()}")
    lines: dict = {}
    branches: dict = {}
    decoder = json.JSONDecoder()
    text, at = out.stdout, 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        doc, at = decoder.raw_decode(text, at)
        cwd = Path(doc.get("current_working_directory") or gcda_dir)
        for f in doc["files"]:
            path = (cwd / f["file"]).resolve()
            if not cpp_included(path):
                continue
            fl, fb = lines.setdefault(path, {}), branches.setdefault(path, {})
            for ln in f["lines"]:
                n = ln["line_number"]
                fl[n] = fl.get(n, False) or ln["count"] > 0
                real = [b for b in ln["branches"] if not b.get("throw")]
                had = fb.setdefault(n, [])
                for k, b in enumerate(real):
                    if k == len(had):
                        had.append(False)
                    had[k] = had[k] or b["count"] > 0
    return {p: {"lines": lines[p],
                "branches": [(n, k + 1, len(bs), t, "") for n, bs in sorted(branches[p].items())
                             for k, t in enumerate(bs) if bs]}
            for p in lines}


def function_hits(gcda_dir: Path, name: str) -> int:
    """Calls of the functions whose demangled name contains `name` (for the tests)."""
    gcdas = sorted(gcda_dir.glob("*.gcda"))
    if not gcdas:
        return 0
    out = subprocess.run(["gcov", "--json-format", "--stdout", "--demangled-names", *(str(g.resolve()) for g in gcdas)],
                         cwd=gcda_dir, capture_output=True, text=True, check=True).stdout
    total, decoder, at = 0, json.JSONDecoder(), 0
    while at < len(out):
        if out[at].isspace():
            at += 1
            continue
        doc, at = decoder.raw_decode(out, at)
        for f in doc["files"]:
            for fn in f.get("functions", []):
                if name in fn.get("demangled_name", fn["name"]):
                    total += fn["execution_count"]
    return total


# ----------------------------------------------------------------------- the report

def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:5.1f}%" if b else "  n/a "


def summarize(title: str, files: dict) -> tuple[list[str], list[str]]:
    """(table lines, not-taken lines) of {path: {lines, branches}}."""
    table = [title, f"  {'file':<28} {'lines':>16} {'branches':>18}"]
    missing: list[str] = []
    tl = th = tb = tt = 0
    for path in sorted(files):
        d = files[path]
        nl, nh = len(d["lines"]), sum(d["lines"].values())
        nb, nt = len(d["branches"]), sum(1 for b in d["branches"] if b[3])
        tl, th, tb, tt = tl + nl, th + nh, tb + nb, tt + nt
        rel = Path(path).relative_to(ROOT).as_posix()
        table.append(f"  {rel:<28} {nh:>5}/{nl:<5} {_pct(nh, nl)} {nt:>5}/{nb:<5} {_pct(nt, nb)}")
        src = Path(path).read_text().splitlines()
        for line, k, n, taken, what in d["branches"]:
            if not taken:
                text = src[line - 1].strip() if line <= len(src) else ""
                why = f": {what}" if what else ""
                missing.append(f"{rel}:{line}: {text} (branch {k} of {n} not taken{why})")
    table.append(f"  {'total':<28} {th:>5}/{tl:<5} {_pct(th, tl)} {tt:>5}/{tb:<5} {_pct(tt, tb)}")
    return table, missing


def report(run_dir: Path) -> str:
    cpp = gcov_files(run_dir / "gcda")
    arcs = python_arcs(run_dir / "py")
    py = {p: python_file(p, arcs.get(str(p), {})) for p in python_sources()}
    ct, cm = summarize("kernels/csrc (gcov; lines hit/total, branches taken/total)", cpp)
    pt, pm = summarize("kernels/*.py (lines hit/total, branches taken/total)", py)
    out = ct + [""] + pt + ["", f"branches no case takes ({len(cm) + len(pm)}):"] + cm + pm
    if not cpp:
        out.insert(0, "kernels/csrc: no counters were written (no process loaded the library)")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------- the run

def prepare_run(run_dir: Path) -> dict:
    """The coverage build, its .gcno files beside where the run's .gcda files will go, and
    the environment every process of the run inherits."""
    from kernels.build import ensure_built
    info = ensure_built("host", "native", coverage=True)
    gcda = run_dir / "gcda"
    gcda.mkdir(parents=True, exist_ok=True)
    for gcno in Path(info["coverage"]).glob("*.gcno"):
        shutil.copy2(gcno, gcda / gcno.name)
    site = run_dir / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)] + kept)
    env[COVERAGE_ENV] = str(run_dir)
    env["KERNELS_PLATFORM"] = "host"
    return env


def run_check(run_dir: Path, check_args: list[str]) -> int:
    env = prepare_run(run_dir)
    cmd = [sys.executable, "-m", "harness", "check", "--target", "bundled",
           "--results", str(run_dir / "rows.jsonl"), *check_args]
    print("coverage: " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


USAGE = "usage: python -m harness.tools.coverage [--profile ci|full] [harness check args...]"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE + "\n\n" + __doc__.split("\n\n", 2)[2].split("\n\n")[0])
        return EXIT_MEASURED
    for bad in ("--target", "--results", "--resume"):
        if any(a == bad or a.startswith(bad + "=") for a in args):
            print(f"coverage: {bad} is the coverage run's own; {USAGE}", file=sys.stderr)
            return EXIT_USAGE
    if not shutil.which("gcov") or not shutil.which("g++"):
        print("coverage: needs g++ and gcov (apt install g++)", file=sys.stderr)
        return EXIT_USAGE
    if "--profile" not in args and not any(a.startswith("--profile=") for a in args):
        args = ["--profile", "ci", *args]
    if not any(a == "--case-timeout" or a.startswith("--case-timeout=") for a in args):
        # -O0 and the tracer make the longest cases slow past the usual timeout, and a hang
        # ends its worker by os._exit from a C thread: every count it had not flushed is lost.
        args = ["--case-timeout", str(CASE_TIMEOUT_S), *args]
    run_dir = OUT_ROOT / time.strftime("run-%Y%m%d-%H%M%S")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    try:
        rc = run_check(run_dir, args)
    except Exception as e:  # the build, most likely
        print(f"coverage: the check could not run: {e}", file=sys.stderr)
        return EXIT_NO_CHECK
    rows = run_dir / "rows.jsonl"
    if rc not in (0, 1) or not rows.exists() or not rows.stat().st_size:
        print(f"coverage: the check could not run (exit {rc}, no rows)", file=sys.stderr)
        return EXIT_NO_CHECK
    text = report(run_dir)
    (OUT_ROOT / "coverage.txt").write_text(text)
    (run_dir / "coverage.txt").write_text(text)
    print(text, end="")
    print(f"coverage: written to {os.path.relpath(OUT_ROOT / 'coverage.txt', ROOT)}")
    return EXIT_MEASURED


if __name__ == "__main__":
    sys.exit(main())
