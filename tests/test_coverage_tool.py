"""`make coverage` (harness/tools/coverage.py): the Python tracer's branches, the coverage
build's counters through a real check, and the flush that makes a process that leaves by
os._exit (an xdist worker, a forked child) count at all."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.tools import coverage
from kernels import build

REPO = Path(__file__).resolve().parent.parent
needs_gcov = pytest.mark.skipif(not (coverage.shutil.which("gcov") and coverage.shutil.which("g++")),
                                reason="g++ and gcov not installed")

SYNTHETIC = '''\
def pick(x, items):
    if x > 0:
        y = "pos"
    else:
        y = "neg"
    for i in items:
        y += str(i)
    z = 1 if x else 2
    try:
        int(y)
    except ValueError:
        z += 1
    return y, z
'''


def _trace(tmp_path: Path, calls: list, source: str = SYNTHETIC) -> dict:
    """The synthetic module's python_file result after `calls` under a fresh Tracer."""
    src = tmp_path / "pkg" / "synthetic.py"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(src), "exec"), namespace)
    tracer = coverage.Tracer(src.parent, tmp_path / "py")
    old = sys.gettrace()
    tracer.start()
    try:
        for args in calls:
            namespace["pick"](*args)
    finally:
        sys.settrace(old)
        import threading
        threading.settrace(None)
    tracer.write()
    arcs = coverage.python_arcs(tmp_path / "py")
    return coverage.python_file(src, arcs.get(str(src), {}))


def _ways(result: dict, line: int) -> dict:
    return {what: taken for ln, _, _, taken, what in result["branches"] if ln == line}


def test_the_tracer_sees_a_branch_not_taken_then_taken(tmp_path):
    once = _trace(tmp_path / "a", [(1, [])])
    assert _ways(once, 2) == {"if true": True, "if false": False}
    assert _ways(once, 6) == {"for next item": False, "for exhausted": True}
    assert _ways(once, 8) == {"conditional expression true": True, "conditional expression false": False}
    assert _ways(once, 11) == {"except true": True, "except false": False}
    assert once["lines"][5] is False and once["lines"][3] is True

    both = _trace(tmp_path / "b", [(1, []), (0, [1, 2])])
    assert all(_ways(both, 2).values()) and all(_ways(both, 6).values())
    assert all(_ways(both, 8).values())
    assert both["lines"][5] is True
    # "neg12" is not an int either: the handler's no-match way stays untaken, and says so.
    assert _ways(both, 11)["except false"] is False


# A jump over a long body needs an EXTENDED_ARG prefix: the tracer sees the jump at the
# prefix's offset, and python_file must credit the jump with it.
LONG_JUMP = "def pick(x, items):\n    y = 0\n    if x > 0:\n" + "        y += 1\n" * 300 + \
    "    return y\n"


def test_a_jump_behind_an_extended_arg_is_seen_both_ways(tmp_path):
    import dis
    code = compile(LONG_JUMP, "x", "exec").co_consts[0]
    assert any(i.opname == "EXTENDED_ARG" for i in dis.get_instructions(code))
    both = _trace(tmp_path, [(1, []), (0, [])], LONG_JUMP)
    assert _ways(both, 3) == {"if true": True, "if false": True}
    once = _trace(tmp_path / "once", [(1, [])], LONG_JUMP)
    assert _ways(once, 3) == {"if true": True, "if false": False}


def test_a_forked_child_clears_what_it_inherited(tmp_path):
    tracer = coverage.Tracer(tmp_path, tmp_path / "py")
    tracer.codes[test_a_forked_child_clears_what_it_inherited.__code__] = {(-1, 0)}
    tracer.clear()
    tracer.write()
    assert not (tmp_path / "py").exists()


def test_the_env_names_agree():
    assert coverage.COVERAGE_ENV == build.COVERAGE_ENV


@needs_gcov
def test_the_default_build_is_untouched_by_the_coverage_one(tmp_path, monkeypatch):
    plain = build.build_hash("host", "native")
    assert build.build_hash("host", "native", coverage=True) != plain
    monkeypatch.setenv("KERNELS_CACHE_DIR", str(tmp_path))
    info = build.ensure_built("host", "native", coverage=True)
    objs = sorted(p.name for p in Path(info["coverage"]).iterdir())
    assert "api.gcno" in objs and "plan.gcno" in objs
    assert "-coverage-" in Path(info["path"]).parent.name and build.build_hash("host", "native") == plain


# Run in a fresh interpreter with the coverage env: a child forked by the one child runner
# (harness/engine/child.py, as explore does) runs one case and leaves by os._exit; this
# process then leaves by os._exit too, writing nothing, so every count is the child's.
FORKED = textwrap.dedent('''
    import os, sys
    from harness.engine import child, fast_exit
    from harness.engine.session import all_cases
    from harness.targets import load_target
    if sys.argv[1] == "off":   # what the child would do without the flush: nothing written
        fast_exit.flush_coverage = lambda: None
    target = load_target("bundled")
    case = next(c for c in all_cases(target) if c.id == sys.argv[2])
    out = child.run(child.Spec(target="bundled", cases=[case]), fork_from=target, budget_s=120)
    print(out.rows[0]["outcome"], flush=True)
    os._exit(0)
''')
CASE = "fa2.single_prefill/valid.grid/fp16-d32-h2x2-q1k1-full-nhd"


def _forked_run(tmp_path: Path, flush: str) -> tuple[str, int]:
    run_dir = tmp_path / flush
    env = coverage.prepare_run(run_dir)
    proc = subprocess.run([sys.executable, "-c", FORKED, flush, CASE], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip(), coverage.function_hits(run_dir / "gcda", "kernels_prefill")


@pytest.mark.system
@needs_gcov
def test_a_forked_child_that_leaves_by_os_exit_writes_its_counts(tmp_path):
    outcome, hits = _forked_run(tmp_path, "on")
    assert outcome == "match" and hits == 1
    outcome, hits = _forked_run(tmp_path, "off")
    assert outcome == "match" and hits == 0


@needs_gcov
@pytest.mark.system
def test_a_check_counts_the_kernel_it_ran_in_its_workers(tmp_path, monkeypatch):
    """A real run: its xdist worker leaves by os._exit, so every count is flushed ones."""
    monkeypatch.setattr(coverage, "OUT_ROOT", tmp_path)
    rc = coverage.main(["--family", "valid", "--case-id",
                        "single_prefill/valid.grid/fp16-d32-h2x2", "-n", "1"])
    assert rc == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert coverage.function_hits(run_dir / "gcda", "kernels_prefill") == 4
    assert coverage.function_hits(run_dir / "gcda", "kernels_decode") == 0
    text = (tmp_path / "coverage.txt").read_text()
    assert "kernels/csrc/attention.h" in text and "kernels/single.py" in text
    named = {ln.split(":")[0].split()[0] for ln in text.splitlines() if ln.startswith("  kernels/")
             or ln.startswith("kernels/")}
    assert not named & {"kernels/csrc/crash.cpp", "kernels/csrc/testonly/api.cpp",
                        "kernels/testonly.py", "kernels/build.py"}, named
    single = coverage.python_file(REPO / "kernels" / "single.py",
                                  coverage.python_arcs(run_dir / "py").get(
                                      str(REPO / "kernels" / "single.py"), {}))
    assert sum(single["lines"].values()) > 20


def test_usage_errors_exit_2(capsys):
    assert coverage.main(["--target", "flashinfer"]) == 2
    assert "--target" in capsys.readouterr().err
