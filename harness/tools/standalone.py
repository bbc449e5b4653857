"""`harness repro CASE --standalone -o FILE.py`: one Python file a library's maintainers can run.

The file imports torch and the library under test, nothing of this project. It holds:
the case's logical inputs with their exact bits (zlib + base64 of the raw bytes, decoded
with torch.frombuffer), the target adapter's calls as source (Target.standalone_source),
an fp64 reference written out inline, and the tolerance bound the harness computed for the
case from its same-dtype baseline. It prints a verdict and exits 1 on the defect, 0 when
the library behaved as the case's contract allows; a case that crashes the library
crashes the script the same way, since the script simply makes the call.
"""
from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import re
import sys
import sysconfig
import zlib
from typing import Mapping
from pathlib import Path

# Inputs past this many raw bytes would make a script nobody attaches to an issue.
MAX_INPUT_BYTES = 64 << 20
_PLAIN_IMPORTS = {"torch", "numpy", "math", "os", "sys", "zlib", "base64", "re", "warnings"}


# A table's text as a terminal line may show it (repro's messages use it too).
from harness.results.cause import shown  # noqa: E402,F401

# What the targets' standalone_source writes with (their layer may not import this one).
from harness.targets.standalone_paste import (data_literal, encode_tensor,  # noqa: E402,F401
                                              paste_source)


class Unavailable(Exception):
    """This case cannot be written as a standalone script (the message says why)."""


def decode_tensor(spec: dict):
    """encode_tensor's inverse, the same code the script carries (tests compare the two)."""
    import torch
    raw = bytearray(zlib.decompress(base64.b64decode(spec["data"])))
    dtype = getattr(torch, spec["dtype"])
    if not raw:
        return torch.empty(spec["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(spec["shape"]).clone()


_IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b"
                          r"|import[ \t]+([^#\n]+))", re.MULTILINE)


def _imported_names(source: str) -> set[str]:
    """The top-level modules `source` imports, read from its import lines (the scripts'
    data is one-line literals, so no text of a case starts a line). A regex, not ast: the
    call source of the bundled library is ~100 kB, parsed once a script otherwise."""
    wanted = set()
    for m in _IMPORT_LINE.finditer(source):
        if m.group(1):
            wanted.add(m.group(1))
        else:
            for item in m.group(2).split(","):
                name = item.strip().split(" ")[0].split(".")[0]
                if name.isidentifier():
                    wanted.add(name)
    return wanted


@functools.lru_cache(maxsize=1)
def _installed_dirs() -> frozenset:
    return frozenset(os.path.realpath(p) for p in (sysconfig.get_paths().get("purelib"),
                                                   sysconfig.get_paths().get("platlib")) if p)


def _library_paths(source: str) -> list[str]:
    """Folders to put on sys.path for the modules call() imports that a plain interpreter
    cannot find (a library living in a checkout, as the bundled one does)."""
    wanted = _imported_names(source)
    installed = _installed_dirs()
    paths = []
    for name in sorted(wanted - _PLAIN_IMPORTS):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            continue
        origin = Path(spec.origin)
        root = origin.parent.parent if origin.name == "__init__.py" else origin.parent
        root_s = os.path.realpath(root)
        if root_s not in installed and not root_s.startswith(os.path.realpath(sys.base_prefix)) \
                and root_s not in paths:
            paths.append(root_s)
    return paths


def _one_sentence(row: dict) -> str:
    """What the harness recorded, for the script's ABOUT (data: the message is the table's)."""
    outcome, message = row.get("outcome", "?"), " ".join(str(row.get("message") or "").split())
    if len(message) > 240:
        message = message[:237] + "..."
    if row.get("pass"):
        return f"This case passes on the harness ({outcome}{': ' + message if message else ''})."
    return f"The harness recorded `{outcome}` for this case: {message or 'no message'}."


def _headline(row: dict) -> str:
    """The script's first comment: the row's outcome where it is one of the harness's own
    words, else no outcome at all (a table's text goes into ABOUT, never a comment)."""
    from harness.model.classify import OUTCOMES
    outcome = row.get("outcome")
    if row.get("pass") is True:
        return "# This case passes on the harness (ABOUT below says how)."
    if isinstance(outcome, str) and outcome in OUTCOMES:
        return f"# The harness recorded `{outcome}` for this case (ABOUT below says why)."
    return "# The harness recorded a failure for this case (ABOUT below says which)."


# Hostile text stays data: every value from a case, a table or an id reaches the script
# through data_literal (harness/targets/standalone_paste.py), never a comment or code.
_literal = data_literal


# What a target option's value may be to reach a script: names joined by commas.
_OPTION_VALUE = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")


def option_env(target, options) -> dict[str, str]:
    """The variables a script sets for the target options its row ran with: each option's
    own (its declaration's env). Unavailable for a value that is not a comma list of names."""
    from harness.engine.session import declared_options
    from harness.model.target_options import given, merged
    declared = {o.name: o for o in merged((*declared_options(), *getattr(target, "options", ())))}
    env = {}
    for name, value in given(options).items():
        if not _OPTION_VALUE.fullmatch(value):
            raise Unavailable(f"{shown(name)} {shown(value)!r} is not a comma list of names "
                              "(letters, digits, _ . -): a script would not set it")
        if name in declared and declared[name].env:
            env[declared[name].env] = value
    return env


def over_budget(case) -> str | None:
    """Why `case` is too big to write as a script, from its params alone (before a tensor is
    made), or None: over the run's memory ceiling (the check skipped it too), or inputs
    too large to embed."""
    from harness.model import budget
    from harness.model.sizes import qkv_elements
    over = budget.over_ceiling(dict(case.params), budget.run_ceiling(), case.op)
    if over is not None:
        return f"{shown(case.id)}: {over}; a script would build it too"
    width = budget.DTYPE_BYTES.get(str(case.params.get("dtype", "bf16")), 8)
    raw = qkv_elements(case.params) * width
    if raw > MAX_INPUT_BYTES:
        return (f"{shown(case.id)}: its inputs are {raw >> 20} MiB, too large to embed "
                f"(at most {MAX_INPUT_BYTES >> 20} MiB)")
    return None


def script_text(case, target, row: dict, command: str, options=None) -> str:
    """The standalone script for `case` on `target`, whose harness row is `row`, made with
    the target options {name: value}."""
    import torch
    from harness.model import platform_info
    from harness.model.classify import in_their_words
    from harness.model.problem import build_problem
    from harness.model.reference import NoReference, attention_baseline, attention_reference
    from harness.model.tolerance import lse_tolerance, output_tolerance
    from harness.targets.base import Skip

    try:
        source = target.standalone_source(case)
    except Skip as why:
        raise Unavailable(f"target {target.name!r} cannot write {case.id} as a standalone "
                          f"script: {why}") from None
    if source is None:
        raise Unavailable(f"target {target.name!r} cannot write standalone scripts "
                          "(its adapter has no standalone_source)")
    too_big = over_budget(case)
    if too_big:
        raise Unavailable(too_big)
    # The input bits do not depend on the device (harness/model/problem.py): drawn here on
    # the CPU, they are the ones the row's run used.
    problem = build_problem(case.params, case.seed, "cpu")
    raw = sum(t.numel() * t.element_size() for ts in (problem.q, problem.k, problem.v) for t in ts)
    if raw > MAX_INPUT_BYTES:
        raise Unavailable(f"{case.id}: its inputs are {raw >> 20} MiB, too large to embed "
                          f"(at most {MAX_INPUT_BYTES >> 20} MiB)")
    inputs = {name: [encode_tensor(t) for t in ts]
              for name, ts in (("q", problem.q), ("k", problem.k), ("v", problem.v))}
    if problem.custom_mask is not None:
        inputs["custom_mask"] = [encode_tensor(m) for m in problem.custom_mask]
    features = {"k_scale": problem.k_scale, "v_scale": problem.v_scale,
                "cap": problem.logits_soft_cap,
                "slopes": None if problem.alibi_slopes is None
                else [float(x) for x in problem.alibi_slopes],
                "sinks": None if problem.sinks is None else [float(x) for x in problem.sinks]}
    tol = {"o": None, "lse": None, "baseline_error": None}
    try:
        ref, base = attention_reference(problem), attention_baseline(problem)
        tol["o"], tol["baseline_error"] = output_tolerance(
            ref["o"], base["o"], problem.dtype_name, ref["lse"], problem.head_dim)
        tol["lse"] = lse_tolerance(ref["lse"])
    except NoReference:
        pass     # no defined answer (no kv heads): only a refusal is right
    device = platform_info.device()
    try:
        lib_version = target.version()
    except Exception as e:  # noqa: BLE001 - the header says what it could not read
        lib_version = f"unknown ({type(e).__name__})"
    problem_cfg = {
        "num_qo_heads": problem.num_qo_heads, "num_kv_heads": problem.num_kv_heads,
        "causal": problem.causal, "window_left": problem.window_left,
        "sm_scale": problem.sm_scale, "return_lse": problem.return_lse,
    }
    env = option_env(target, options)
    paths = _library_paths(source)
    vocabulary = getattr(getattr(target, "capabilities", None), "vocabulary", None)
    refuse_words = [in_their_words(w, vocabulary) for w in case.refuse_words]
    about = {"harness": _one_sentence(row), "case": case.id, "expect": case.expect,
             "seed": case.seed, "torch": torch.__version__, "target": target.name,
             "library": lib_version, "commit": row.get("commit") or None,
             "device": device.type, "made_by": command}
    header = [
        _headline(row),
        "# What case, which versions and the command that made this file: ABOUT, below.",
        "# Run: python THIS_FILE.py  -> exit 0 when the library behaves as the contract allows,",
        "# 1 on the defect (the verdict line says which); a crash in the library ends it the same way.",
    ]
    parts = [
        "\n".join(header),
        '"""Standalone reproducer: the inputs (exact bits), the library call, an fp64 reference."""',
        "from __future__ import annotations",
        "import base64\nimport math\nimport os\nimport re\nimport sys\nimport zlib",
        "",
    ]
    if env:
        parts.append("# The target options this row was made with, as the variables its library\n"
                     "# reads; set one yourself (an empty value: the option off) to compare.\n"
                     + "\n".join(f"os.environ.setdefault({_literal(k)}, {_literal(v)})"
                                 for k, v in env.items()))
    if paths:
        parts.append("# The library lives in a checkout, not in site-packages.\n"
                     + "\n".join(f"sys.path.insert(0, {_literal(p)})" for p in paths))
    parts.append("import torch")
    parts.append(f"# The case, its row and how this file was made (printed by main()).\n"
                 f"ABOUT = {_literal(about)}\n"
                 f"CASE_ID = ABOUT['case']\nEXPECT = {_literal(case.expect)}\n"
                 f"# A refusal must name each as a word (one of its |-separated names: the library's own).\n"
                 f"REFUSE_WORDS = {_literal(refuse_words)}\nDEVICE = {_literal(str(device))}\n"
                 f"PROBLEM = {_literal(problem_cfg)}\n"
                 f"# The problem's features, as the reference applies them (fp32 values).\n"
                 f"FEATURES = {_literal(features)}\n"
                 f"# From the harness's tolerance model: K x the same-dtype baseline's error + floor.\n"
                 f"TOLERANCE = {_literal(tol)}\n"
                 f"HARNESS_ROW = {_literal({k: row.get(k) for k in ('outcome', 'pass', 'max_abs_diff', 'n_wrong', 'n_total', 'stage')})}")
    parts.append("# ---- the library's calls (from the target adapter) ----\n" + source.strip("\n"))
    parts.append("# ---- the harness's fp64 reference (harness/model/reference.py), verbatim ----\n"
                 + _reference_source())
    parts.append(_SCRIPT_TAIL.strip("\n"))
    parts.append("INPUTS = " + json.dumps(inputs, indent=1))
    parts.append('if __name__ == "__main__":\n    sys.exit(main())')
    return "\n\n\n".join(p for p in parts if p is not None) + "\n"


@functools.lru_cache(maxsize=1)
def _reference_source() -> str:
    """The harness's own reference functions, so the script judges as the row was judged
    (the same text for every script of a process)."""
    import inspect
    from harness.model import reference
    parts = [f"_LOGITS_BUDGET = {reference._LOGITS_BUDGET!r}"]
    parts += [inspect.getsource(f).rstrip() for f in
              (reference.NoReference, reference.compute_dtype, reference.kv_head_map,
               reference.visible_mask, reference._weighted_values, reference._one_request,
               reference._features,
               reference._attention, reference.attention_reference)]
    return "\n\n\n".join(parts)


def write_standalone(case, target_spec, row: dict, path, options=None,
                     command: str | None = None) -> Path:
    """Write the standalone script for `case` (its harness row `row`) on the target named
    by `target_spec` (a registry name, module:factory or a file), with the target options
    the row ran with (its own columns: repro_command.options_of; `options`, a mapping, when
    given). Raises Unavailable."""
    from harness.targets import load_target
    from harness.results.repro_command import options_of, repro_args, typed
    path = Path(path)
    if not isinstance(options, Mapping):   # a caller's text of the row's own column
        options = options_of(row)
    if command is None:
        spec = target_spec if isinstance(target_spec, str) else getattr(target_spec, "name", None)
        command = typed(repro_args(case.id, spec, options)
                        + ["--standalone", "-o", str(path)])
    target = load_target(target_spec) if isinstance(target_spec, str) else target_spec
    text = script_text(case, target, row, command, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------ running a script as its reader would
#
# A fresh interpreter the harness cannot be imported in. `python -I` alone is not that here:
# the project's editable install puts the checkout on sys.path through a .pth file, which
# site runs. So: -S (no site, no .pth), -s, and a PYTHONPATH of site-packages alone, from a
# folder outside the repository. tests/test_standalone*.py and benchmarks/repro_agreement.py
# all run scripts through these.

def _repo_root() -> str:
    return os.path.realpath(Path(__file__).resolve().parents[2])


def site_dirs() -> list[str]:
    """The interpreter's installed packages (torch, numpy, an installed library), never the
    repository."""
    repo = _repo_root()
    dirs = []
    for key in ("purelib", "platlib"):
        d = os.path.realpath(sysconfig.get_paths()[key])
        if d not in dirs and d != repo and not d.startswith(repo + os.sep + "harness"):
            dirs.append(d)
    return dirs


def isolated_command(python: str = sys.executable) -> list[str]:
    """The interpreter to run a script with (isolated_env's environment, a folder outside
    the repository as its cwd): no site, no user site, so no editable-install .pth."""
    return [python, "-S", "-s"]


def isolated_env(**extra: str) -> dict:
    """A plain environment whose PYTHONPATH is site-packages alone (not the repository);
    extra: variables to add (an option's variable set to "" turns that option off)."""
    import tempfile
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": tempfile.gettempdir(),
           "PYTHONPATH": os.pathsep.join(site_dirs()), "PYTHONNOUSERSITE": "1"}
    for key in ("LD_LIBRARY_PATH", "ROCM_PATH", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    return env


def assert_harness_hidden(workdir, python: str = sys.executable) -> None:
    """`import harness` must fail where the scripts run (else a script could lean on it)."""
    import subprocess
    workdir = Path(workdir)
    assert not os.path.realpath(workdir).startswith(_repo_root() + os.sep), \
        f"{workdir} is inside the repository: scripts must run outside it"
    done = subprocess.run(isolated_command(python) + ["-c", "import harness"], cwd=workdir,
                          env=isolated_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (
        f"the harness is importable from {workdir}: the scripts would not be standalone")


def run_isolated(path, workdir, timeout: float = 300, python: str = sys.executable, **env):
    """subprocess.run of the script at `path` in isolated_command/isolated_env from workdir."""
    import subprocess
    return subprocess.run(isolated_command(python) + [str(path)], cwd=workdir,
                          env=isolated_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def plain_row(row: dict) -> dict:
    """A table row (a DataFrame's) with numpy scalars as Python values, for the literals."""
    out = {}
    for key, value in row.items():
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        out[key] = value
    return out


def target_spec_of(target_label: str) -> str:
    """The --target spec whose label a table's `target` column holds (harness/targets
    label()): a registry name, an alias or an entry point. ValueError when none has it."""
    from harness.targets import known_names, label
    named = [name for name in known_names() if label(name) == target_label]
    if not named:
        raise ValueError(f"no target this checkout knows is labelled {target_label!r} (its "
                         f"table came from a --target spec; name it with HARNESS_TARGETS)")
    return target_label if target_label in named else named[0]


def row_settings(row) -> tuple[str, dict]:
    """(target spec, target options) a row was made with, from its target column and its
    options' columns (repro_command.options_of)."""
    from harness.results.repro_command import options_of
    target = row.get("target")
    if not isinstance(target, str) or not target:
        raise ValueError("the row names no target")
    return target_spec_of(target), options_of(row)


def table_settings(rows) -> tuple[str, dict]:
    """row_settings of rows that all share them (ValueError when they do not)."""
    found = {(spec, tuple(sorted(opts.items()))) for spec, opts in map(row_settings, rows)}
    if len(found) != 1:
        raise ValueError(f"the rows were made with {len(found)} target/option settings, not one")
    spec, opts = found.pop()
    return spec, dict(opts)


def write_class_repros(table_rows, out_dir, target_spec: str | None = None,
                       options=None) -> list[tuple[str, str, str]]:
    """One standalone script per failure class of a table's rows, `out_dir/<class slug>.py`,
    for the class's example case. The target and its options are the example row's own
    (its target and option columns) unless target_spec is given. Returns
    (slug, case id, the path written or the reason none was) per class, worst first."""
    import pandas as pd
    from harness.engine.session import all_cases
    from harness.results.failure_classes import failure_classes
    from harness.targets import load_target
    rows = list(table_rows)
    df = pd.DataFrame(rows)
    out_dir = Path(out_dir)
    targets: dict = {}
    done = []
    for cls in failure_classes(df):
        case_id, slug = cls.example, file_slug(cls.slug)
        row = plain_row(cls.rows.iloc[0].to_dict())
        try:
            if target_spec is not None:
                spec, opts = target_spec, dict(options or {})
            else:
                spec, opts = row_settings(row)
            if spec not in targets:
                target = load_target(spec)
                targets[spec] = (target, {c.id: c for c in all_cases(target)})
        except Exception as why:  # noqa: BLE001 - a class's line says why, the rest go on
            done.append((slug, shown(case_id), f"not written: {shown(why)}"))
            continue
        target, by_id = targets[spec]
        case = by_id.get(case_id)
        if case is None:
            done.append((slug, shown(case_id), "not written: not in this checkout's cases"))
            continue
        path = out_dir / f"{slug}.py"
        try:
            write_standalone(case, target, row, path, opts)
            done.append((slug, shown(case_id), str(path)))
        except Unavailable as why:
            done.append((slug, shown(case_id), f"not written: {shown(why)}"))
        except OSError as why:
            done.append((slug, shown(case_id), f"not written: cannot write {shown(path)}: "
                         f"{shown(why.strerror or why)}"))
    return done


_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")


def file_slug(slug) -> str:
    """A class's slug as a file name: letters, digits, `_`, `-` and single inner dots, at
    most 80; anything else (a slug is computed from a table's text) becomes `class-<digest>`."""
    import hashlib
    text = str(slug)
    if len(text) <= 80 and _SLUG.fullmatch(text):
        return text
    return "class-" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


_SCRIPT_TAIL = r'''
# ---- inputs, reference, verdict ----

def decode(spec):
    """A tensor from its raw bytes: the exact bits the harness built for this case."""
    raw = bytearray(zlib.decompress(base64.b64decode(spec["data"])))
    dtype = getattr(torch, spec["dtype"])
    if not raw:
        return torch.empty(spec["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(spec["shape"]).clone()


def reference(qs, ks, vs):
    """Attention in fp64, per request, as the harness computes it (its functions above):
    bottom-right causal, sliding window, GQA head map, soft cap, ALiBi, sinks, the KV scales
    and a custom mask; natural-log LSE; a row that sees no key gives output 0."""
    heads = kv_head_map(PROBLEM["num_qo_heads"], PROBLEM["num_kv_heads"])
    feats = {key: (torch.tensor(value, dtype=torch.float32) if isinstance(value, list) else value)
             for key, value in FEATURES.items()}
    masks = [decode(m) for m in INPUTS.get("custom_mask") or []]
    outs, lses = [], []
    for n, (q, k, v) in enumerate(zip(qs, ks, vs)):
        q, k, v = (t.to("cpu") for t in (q, k, v))
        mask = visible_mask(q.shape[0], k.shape[0], PROBLEM["causal"], PROBLEM["window_left"])
        if masks:
            mask = mask & masks[n]
        o, lse = _one_request(q, k, v, heads, PROBLEM["sm_scale"], mask, torch.float64,
                              None, feats)
        outs.append(o)
        lses.append(lse)
    return {"o": torch.cat(outs), "lse": torch.cat(lses)}


def compare(name, got, exp, tol):
    """(wrong elements, total, max |diff|, first wrong index or None) of got against exp."""
    if tuple(got.shape) != tuple(exp.shape):
        return exp.numel(), exp.numel(), float("inf"), f"shape {tuple(got.shape)} != {tuple(exp.shape)}"
    g = got.detach().to("cpu", torch.float64)
    finite = torch.isfinite(exp)
    diff = (g - exp).abs()
    wrong = (finite & ~(diff <= tol)) | (~finite & ~((g == exp) | (torch.isnan(g) & torch.isnan(exp))))
    d = torch.where(finite, torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf")),
                    torch.where(wrong, float("inf"), 0.0))
    first = None
    if bool(wrong.any()):
        first = tuple(int(x) for x in wrong.nonzero()[0])   # row-major: the first wrong one
    return int(wrong.sum()), exp.numel(), float(d.max()) if d.numel() else 0.0, first


def names_word(message, word):
    """word (or one of its |-separated names) occurs in message as a whole token."""
    return any(re.search(r"(?<![A-Za-z0-9_])" + re.escape(alt) + r"(?![A-Za-z0-9_])", message,
                         re.IGNORECASE) for alt in word.split("|") if alt)


def judged(got, ref):
    """(name, wrong, total, max |diff|, tol, first) for o, and the LSE where it was returned."""
    out = []
    for name in ("o", "lse"):
        if name == "lse" and not (PROBLEM["return_lse"] and "lse" in got):
            continue
        if got.get(name) is None:
            out.append((name, ref[name].numel(), ref[name].numel(), float("inf"), TOLERANCE[name], "not returned"))
            continue
        wrong, total, worst, first = compare(name, got[name], ref[name], TOLERANCE[name])
        out.append((name, wrong, total, worst, TOLERANCE[name], first))
    return out


def where(name, first):
    if first is None:
        return ""
    if isinstance(first, str):
        return f" ({first})"
    return f", first at {name}[{', '.join(map(str, first))}] (row, head, dim)"


def corrupted():
    """Whether the call wrote outside its outputs or into its inputs, as the harness checks
    it (its canary bands and input fingerprints: the adapter's corruption(), where the
    script's call() has one); prints the verdict when it did."""
    found = globals()["corruption"]() if "corruption" in globals() else []
    if found:
        print(f"VERDICT corrupt: {'; '.join(found)}")
    return bool(found)


def main():
    # As the harness's worker runs every case: a fatal signal prints where the library was
    # (and the process still dies of that signal, as the row's did).
    import faulthandler
    faulthandler.enable()
    # ascii(): the id is anyone's text, and a terminal obeys the escapes it may hold.
    print(f"case {ascii(CASE_ID)} ({EXPECT}); torch {torch.__version__} on {DEVICE}")
    print(f"harness: {ascii(ABOUT['harness'])}")
    inputs = {name: [decode(t).to(DEVICE) for t in INPUTS[name]] for name in ("q", "k", "v")}
    try:
        got = call(inputs)
        if DEVICE.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as error:  # a refusal: the library raised something a caller can catch
        text = f"{type(error).__name__}: {error}"
        if corrupted():
            return 1
        if EXPECT == "match":
            print(f"VERDICT unexpected_refusal: a valid input was refused: {text}")
            return 1
        missing = [w for w in REFUSE_WORDS if not names_word(str(error), w)]
        if missing:
            print(f"VERDICT refused, but the message does not name {missing} as words: {text}")
            return 1
        print(f"VERDICT refused (the contract allows it): {text}")
        return 0
    if corrupted():
        return 1
    ref = reference(inputs["q"], inputs["k"], inputs["v"]) if TOLERANCE["o"] is not None else None
    results = judged(got, ref) if ref is not None else []
    detail = "; ".join(f"{n} max|diff| {m:.3g} (tol {t:.3g}), {w}/{tot} wrong{where(n, f)}"
                       for n, w, tot, m, t, f in results)
    if EXPECT == "refuse":
        print("VERDICT silent: the call returned without raising; this input has no defined "
              f"answer and must be refused ({detail or 'no reference'})")
        return 1
    bad = [r for r in results if r[1]]
    if bad:
        print(f"VERDICT wrong: {detail}")
        return 1
    print(f"VERDICT match: {detail}")
    return 0
'''
