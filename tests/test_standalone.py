"""`harness repro CASE --standalone`: the script reproduces the row with torch and the library
alone, in an interpreter where the harness cannot be imported (harness/tools/standalone.py
isolated_command: `python -I` is not that here, the editable install's .pth puts the checkout
on sys.path; run from a folder outside the repository)."""
from __future__ import annotations

import argparse
import ast
import functools
import signal
from pathlib import Path

import pytest
import torch

from harness.engine import child
# Bound at import: generated_once replaces session.all_cases with a reader of _all_cases.
from harness.engine.session import all_cases as generate_all_cases
from harness.model.case import Case
from harness.targets.base import Target
from harness.tools.standalone import (Unavailable, assert_harness_hidden, decode_tensor,
                                      encode_tensor, run_isolated, script_text,
                                      write_standalone)

REPO = Path(__file__).resolve().parents[1]


def script_about(text: str) -> dict:
    """The script's ABOUT literal (the case, versions and command, as data)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["ABOUT"]:
            return ast.literal_eval(node.value)
    raise AssertionError("the script has no ABOUT")

# (target, disabled guards, case id, the outcome its row has on the host)
SAMPLE = [
    ("bundled", "all", "fa2.ragged_prefill/strided.q_stride2/fp16-d64-h4x2", "wrong"),
    ("bundled", "all", "fa2.single_prefill/gqa.q12_over_kv8/bf16-d128-h12x8", "silent"),
    ("bundled", "all", "fa2.single_prefill/gqa.q4_over_kv8/bf16-d128-h4x8", "crash"),
    ("bundled", "all", "fa2.batch_decode/gqa.q12_over_kv8/bf16-d128-h12x8", "silent"),
    ("bundled", "all", "fa2.paged_prefill/gqa.q6_over_kv3/bf16-d128-h6x3", "match"),
    ("bundled", None, "fa2.single_decode/gqa.q12_over_kv8/fp16-d128-h12x8", "refused"),
    ("torch-sdpa", None, "sdpa_math.single_prefill/gqa.q6_over_kv3/bf16-d128-h6x3", "match"),
    ("torch-sdpa", None, "sdpa_math.single_prefill/strided.k_stride2/bf16-d128-h4x2-nhd", "match"),
]


def _row(target: str, guards: str | None, case_id: str) -> dict:
    out = child.run(child.Spec(target=target, cases=[], case_id=case_id, disable_guards=guards,
                               case_timeout=120))
    assert out.rows, out.stderr[-2000:]
    return out.rows[-1]


@functools.lru_cache(maxsize=None)
def _all_cases(target: str) -> tuple:
    """Every case of the target, generated once per test process (about 2 CPU-seconds for
    the bundled one; Case is frozen, so the tests share them safely)."""
    from harness.targets import load_target
    return tuple(generate_all_cases(load_target(target)))


def _case(target: str, case_id: str) -> Case:
    return next(c for c in _all_cases(target) if c.id == case_id)


@pytest.fixture
def generated_once(monkeypatch):
    """`repro` looks a case id up among every case of the target (session.all_cases): here
    from _all_cases' list, generated once per test process, not again at each command.
    The lookup, its miss and what repro does with the case are unchanged."""
    from harness.engine import session
    monkeypatch.setattr(session, "all_cases", lambda target: list(_all_cases(target.name)))


def _run_isolated(path: Path, tmp_path: Path, **env):
    # No site (so no editable-install .pth), site-packages alone on the path, cwd outside the
    # checkout: the harness is not importable unless the script puts the library's folder there.
    assert_harness_hidden(tmp_path)
    return run_isolated(path, tmp_path, timeout=300, **env)


@pytest.mark.system
@pytest.mark.parametrize("target,guards,case_id,outcome", SAMPLE,
                         ids=[s[2].split("/", 1)[1] + f"@{s[0]}" for s in SAMPLE])
def test_script_agrees_with_the_row(tmp_path, target, guards, case_id, outcome):
    row = _row(target, guards, case_id)
    assert row["outcome"] == outcome, row["message"]
    path = write_standalone(_case(target, case_id), target, row, tmp_path / "repro.py", guards)
    text = path.read_text()
    assert "harness" not in {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(text))
                             if isinstance(n, ast.Import)}
    assert not any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("harness")
                   for n in ast.walk(ast.parse(text)))
    assert text.startswith(f"# The harness recorded `{outcome}`" if not row["pass"]
                           else "# This case passes")
    about = script_about(text)
    assert about["torch"] == torch.__version__ and about["made_by"].startswith("harness repro ")
    assert about["case"] == case_id
    done = _run_isolated(path, tmp_path)
    if outcome == "crash":
        # The script simply makes the call, so it dies of the row's signal.
        sig = signal.Signals(-done.returncode).name if done.returncode < 0 else str(done.returncode)
        assert sig in row["message"], (done.returncode, done.stdout, done.stderr[-1500:])
        return
    verdict = [line for line in done.stdout.splitlines() if line.startswith("VERDICT ")]
    assert len(verdict) == 1, (done.stdout, done.stderr[-2000:])
    assert verdict[0].startswith(f"VERDICT {outcome}"), verdict
    assert done.returncode == (0 if row["pass"] else 1), (done.stdout, done.stderr[-2000:])


@pytest.mark.system
def test_the_guards_env_is_only_a_default(tmp_path):
    """A guards-off script with the guards turned back on shows the fix: the refusal."""
    case_id = "fa2.single_prefill/gqa.q12_over_kv8/bf16-d128-h12x8"
    row = {"outcome": "silent", "pass": False, "message": "ran without error"}
    path = write_standalone(_case("bundled", case_id), "bundled", row, tmp_path / "r.py", "all")
    done = _run_isolated(path, tmp_path, KERNELS_DISABLE_GUARDS="")
    assert done.returncode == 0 and "VERDICT refused" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_inputs_keep_their_bits(dtype):
    t = torch.randn(3, 2, 5).to(dtype)
    t[0, 0, 0] = float("nan")
    t[1, 1, 1] = -0.0
    back = decode_tensor(encode_tensor(t))
    assert back.dtype == dtype and back.shape == t.shape
    bits = {2: torch.int16, 4: torch.int32}[t.element_size()]
    assert torch.equal(back.view(bits), t.view(bits))
    assert decode_tensor(encode_tensor(torch.empty(0, 4, dtype=dtype))).shape == (0, 4)


class _NoScripts(Target):
    name = "no-scripts"

    def version(self):
        return "0"


def test_a_target_without_standalone_source_says_so(tmp_path):
    case = _case("bundled", "fa2.single_prefill/gqa.q6_over_kv3/bf16-d128-h6x3")
    with pytest.raises(Unavailable, match="cannot write standalone scripts"):
        script_text(case, _NoScripts(), {"outcome": "match", "pass": True}, "harness repro x")


def test_a_case_the_adapter_cannot_write_names_why():
    from dataclasses import replace
    from harness.targets import load_target
    case = replace(_case("bundled", "fa2.single_prefill/gqa.q6_over_kv3/bf16-d128-h6x3"),
                   route="nope.single_prefill")
    with pytest.raises(Unavailable, match="no route 'nope.single_prefill'"):
        script_text(case, load_target("bundled"), {"outcome": "silent"}, "harness repro x")


def _shared_tail(texts: list[str]) -> str:
    """The longest text every one of `texts` ends with (binary search: endswith is C)."""
    first, low, high = texts[0], 0, min(map(len, texts))
    while low < high:
        mid = (low + high + 1) // 2
        if all(t.endswith(first[len(first) - mid:]) for t in texts):
            low = mid
        else:
            high = mid - 1
    return first[len(first) - low:]


def _parse_each(texts: list[str]) -> None:
    """ast.parse(text) for every text, the ~90 kB they all end with (the pasted core) parsed
    once: the same verdict as parsing each whole, at a fraction of the cost.

    Why it is the same: the shared tail is cut where it parses alone, at a line start. A
    text's head (what comes before) that parses alone ends outside any bracket, string or
    continuation, so head + tail tokenizes as the two token streams one after the other and
    parses as the two modules' statements: the whole parses. A head that does not parse
    alone is parsed whole (a cut inside one of its constructs must not fail a good text),
    so a text that does not parse fails here as ast.parse(text) fails."""
    tail = _shared_tail(texts)
    at = 0
    while True:   # the tail from its first line start where it parses alone
        at = tail.find("\n", at) + 1
        if at == 0:
            tail = ""
            break
        try:
            ast.parse(tail[at:])
        except SyntaxError:
            continue
        tail = tail[at:]
        break
    for text in texts:
        try:
            ast.parse(text[:len(text) - len(tail)])
        except SyntaxError:
            ast.parse(text)


def test_every_bundled_case_gets_a_script():
    """Mis-planned runs, multi-call scenarios, features, merge and mixed batches included:
    the script's call() is the adapter's own code (the plan_run core, pasted)."""
    from harness.targets.bundled import standalone_call_source, standalone_unsupported
    by_family = {}
    for c in _all_cases("bundled"):
        assert standalone_unsupported(c) is None, c.id
        by_family.setdefault((c.family, c.op, bool(c.params.get("scenario"))), c)
    texts = []
    for c in by_family.values():
        text = standalone_call_source(c)
        texts.append(text)
        assert "import harness" not in text and "from harness" not in text.replace(
            "# from harness", ""), c.id
    _parse_each(texts)
    assert "def perturb(c, q" in text and "class Buffers:" in text and "def run_scenario(" in text


def _args(**over) -> argparse.Namespace:
    base = dict(case_id="fa2.paged_prefill/gqa.q6_over_kv3/bf16-d128-h6x3", target="bundled",
                disable_guards=None, case_json=None, cases_file=None, json=True, verbose=False,
                in_process=False, case_timeout=None, standalone=True, output=None)
    return argparse.Namespace(**{**base, **over})


def test_repro_standalone_writes_the_script_and_keeps_the_exit_code(tmp_path, capsys,
                                                                  forked_children,
                                                                  generated_once):
    # The row's child forks from a warm server (tests/warm_children.py); the script is
    # made from its row as from a spawned child's.
    from harness.tools.repro import cmd_repro
    assert cmd_repro(_args()) == 2                              # no -o
    assert "needs -o" in capsys.readouterr().err
    out = tmp_path / "s.py"
    assert cmd_repro(_args(output=str(out))) == 0
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and out.exists()
    assert "--standalone -o" in script_about(out.read_text())["made_by"]
    miss = _args(case_id="fa2.paged_prefill/gqa.q6_over_kv3/nope", output=str(out))
    assert cmd_repro(miss) == 4


def test_repro_standalone_on_an_unwritable_case_is_one_line_exit_2(tmp_path, capsys,
                                                                   monkeypatch, generated_once):
    from harness.tools import standalone
    from harness.tools.repro import cmd_repro
    monkeypatch.setattr(standalone, "MAX_INPUT_BYTES", 1024)     # every case is too large
    assert cmd_repro(_args(output=str(tmp_path / "x.py"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("repro: fa2.paged_prefill/") and "too large to embed" in err[-1]
    assert not (tmp_path / "x.py").exists()


@pytest.mark.system
def test_one_script_per_failure_class(tmp_path):
    from harness.tools.standalone import write_class_repros
    ids = ["fa2.ragged_prefill/strided.q_stride2/fp16-d64-h4x2",
           "fa2.paged_prefill/gqa.q6_over_kv3/bf16-d128-h6x3"]
    rows = [_row("bundled", "all", cid) for cid in ids]
    done = write_class_repros(rows, tmp_path / "repros")   # target, guards: the rows' own
    assert [cid for _, cid, _ in done] == [ids[0]]        # the passing row is no class
    slug, _, where = done[0]
    script = Path(where)
    assert script == tmp_path / "repros" / f"{slug}.py" and script.exists()
    run = _run_isolated(script, tmp_path)
    assert run.returncode == 1 and "VERDICT wrong" in run.stdout, run.stdout + run.stderr[-1500:]


def test_repro_standalone_refuses_a_case_over_the_ceiling_before_building_it(tmp_path, capsys,
                                                                            monkeypatch,
                                                                            generated_once):
    """The check skips it for size; the script would build it all the same: one line,
    exit 2, before the child or the problem is made."""
    from harness.model import budget
    from harness.tools import repro
    monkeypatch.setenv(budget.CEILING_ENV, "1000")

    def never(*a, **k):
        raise AssertionError("the case was run")
    monkeypatch.setattr(repro, "repro_in_child", never)
    out = tmp_path / "x.py"
    assert repro.cmd_repro(_args(output=str(out))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over the ceiling of 1,000 bytes" in err[0], err
    assert err[0].startswith("repro: fa2.paged_prefill/") and not out.exists()
