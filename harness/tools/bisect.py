"""`harness bisect --good REV --bad REV CASE_ID`: the commit that broke a case.

Drives `git bisect start/run/reset` in a repository. Each step runs
`python -m harness repro CASE_ID` in that checkout, in its own process (a
crash is a bad commit, not a dead bisect), with KERNELS_CACHE_DIR shared
across steps so the content-hash cache rebuilds the library only when its
sources change. The step maps repro's exit codes onto git's: 0 good;
1, a signal or a timeout bad; 4 (unknown case), 5 (build failed) and a harness that
died before printing its row (a traceback at an old commit) skip: git bisect run's 125.

Each step appends one line to a steps file, which the bisection prints as it
goes: commit (short), subject, verdict and the case's outcome.

Both ends are checked first, with the same step: a --good where the case fails, or a --bad
where it passes, would send git after a commit that does not exist, so the bisection stops
there with one line (EndsError, exit 1). A --good or --bad that cannot answer (the library
does not build there) stops it too.

The step script is written outside the repository: bisect checks out old
commits, which may not have this module.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.results.repro_command import repro_args
from harness.tools.options import add_target_options, positive_seconds, target_options

GOOD, BAD, SKIP = 0, 1, 125
# repro's exit codes that say "this commit cannot answer", not "the case fails".
SKIP_CODES = {4: "unknown case id", 5: "library build failed"}

STEP_SOURCE = r'''
import json, os, re, subprocess, sys
cfg = json.load(open(sys.argv[1]))
env = dict(os.environ, **cfg["env"])
head = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=cfg["repo"],
                      capture_output=True, text=True).stdout.strip()
try:
    proc = subprocess.run(cfg["command"], cwd=cfg["repo"], env=env, timeout=cfg["timeout"],
                          capture_output=True, text=True)
    rc, out, err = proc.returncode, proc.stdout, proc.stderr
except subprocess.TimeoutExpired:
    rc, out, err = None, "", ""
# repro prints its row as `key  value` lines: the outcome says what the verdict means.
outcome = re.search(r"^outcome\s+(\S+)", out, re.M)
outcome = outcome.group(1) if outcome else ""
skip = {int(k): v for k, v in cfg["skip_codes"].items()}
if rc == 0:
    verdict, code = "good", 0
elif rc in skip:
    verdict, code = "skip (" + skip[rc] + ")", 125
elif rc == 1 and not outcome and "Traceback (most recent call last)" in err:
    # The harness itself died before printing a row (an import error at an old commit):
    # this commit cannot answer, which is not the case failing.
    verdict, code = "skip (the harness did not run: " + (err.strip().splitlines() or ["?"])[-1][:120] + ")", 125
elif rc is None or rc == 1 or rc < 0:
    verdict, code = "bad", 1
    outcome = "timeout" if rc is None else "signal %d" % -rc if rc < 0 else outcome
else:
    verdict, code = "skip (repro exit %d)" % rc, 125
line = "%s -> %s%s" % (head, verdict, " (" + outcome + ")" if outcome and code != 125 else "")
with open(cfg["steps"], "a") as f:
    f.write(line + "\n")
print("bisect step " + line, file=sys.stderr)
sys.exit(code)
'''
STEP_POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case_id", metavar="CASE_ID")
    parser.add_argument("--good", required=True, metavar="REV", help="a revision where the case passes")
    parser.add_argument("--bad", required=True, metavar="REV", help="a revision where it fails")
    parser.add_argument("--repo", default=".", metavar="PATH", help="the git checkout to bisect")
    add_target_options(parser)   # each passed to repro at every step
    parser.add_argument("--target", default=None, help="passed to repro at every step")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the steps (default: this one, the venv's)")
    parser.add_argument("--timeout", type=positive_seconds, default=600.0,
                        help="seconds per step; a step that runs longer is a bad commit (hang)")
    parser.add_argument("--cache-dir", default=None,
                        help="KERNELS_CACHE_DIR for every step (default: $KERNELS_CACHE_DIR "
                             "or <repo>/.cache/kernels)")


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def repro_command(python: str, case_id: str, options: dict | None = None,
                  target: str | None = None) -> list[str]:
    return [python, "-m", "harness", *repro_args(case_id, target, options)]


def first_bad(output: str) -> str | None:
    match = re.search(r"^([0-9a-f]{7,40}) is the first bad commit", output, re.M)
    return match.group(1) if match else None


def candidates(output: str) -> list[str]:
    """The commits git names when skipped ones hide which of them is first bad."""
    if "could be any of" not in output:
        return []
    tail = output.split("could be any of:", 1)[1]
    return re.findall(r"^([0-9a-f]{40})$", tail, re.M)


def _run_steps(cmd: list[str], steps: Path, out) -> tuple[str, list[str]]:
    """`git bisect run`, printing each step's line to `out` as it lands in `steps`.
    Returns git's output and the step lines."""
    import tempfile
    shown: list[str] = []

    def show_new() -> None:
        lines = steps.read_text().splitlines() if steps.exists() else []
        for line in lines[len(shown):]:
            if out is not None:
                print("bisect: " + line, file=out, flush=True)
            shown.append(line)

    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        while True:
            try:
                proc.wait(timeout=STEP_POLL_S)
                break
            except subprocess.TimeoutExpired:
                show_new()
        show_new()
        log.seek(0)
        return log.read(), shown


class EndsError(RuntimeError):
    """--good does not pass, or --bad does not fail: there is nothing to bisect."""


def _check_ends(repo: Path, step: Path, config: Path, tmp: str, good_sha: str, bad_sha: str,
                out) -> list[str]:
    """Run the step at --good and at --bad (in this checkout, put back after); EndsError
    unless the first is good and the second bad. Returns their step lines."""
    back = _git(repo, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip() \
        or _git(repo, "rev-parse", "HEAD").stdout.strip()
    cfg = json.loads(config.read_text())
    lines, codes = [], {}
    try:
        for name, sha in (("good", good_sha), ("bad", bad_sha)):
            ends = Path(tmp) / f"ends-{name}"
            config.write_text(json.dumps({**cfg, "steps": str(ends)}))
            _git(repo, "checkout", "-q", "--detach", sha)
            proc = subprocess.run([sys.executable, str(step), str(config)], capture_output=True,
                                  text=True)
            line = ends.read_text().strip() if ends.exists() else f"{sha[:7]} -> exit {proc.returncode}"
            codes[name] = proc.returncode
            lines.append(line)
            if out is not None:
                print(f"bisect: --{name} " + line, file=out, flush=True)
    finally:
        config.write_text(json.dumps(cfg))
        _git(repo, "checkout", "-q", back, check=False)
    for name, want in (("good", GOOD), ("bad", BAD)):
        code, line = codes[name], lines[0 if name == "good" else 1]
        if code == want:
            continue
        said = line.split(" -> ", 1)[-1]
        if code == SKIP:
            said = said.removeprefix("skip (").removesuffix(")")
            raise EndsError(f"--{name} {line.split(' -> ')[0]} cannot be tested ({said}); "
                            f"pick a --{name} where the case runs")
        raise EndsError(f"--{name} {line.split(' -> ')[0]} is {said}, not {name}: the case "
                        + ("already fails there; pick an older --good" if name == "good"
                           else "passes there; pick a --bad where it fails"))
    return lines


def bisect(repo, good: str, bad: str, case_id: str, *, python: str = sys.executable,
           options: dict | None = None, target: str | None = None,
           timeout: float = 600.0, cache_dir: str | None = None, out=None) -> dict:
    """Run the bisection; returns {"commit", "subject", "candidates", "steps", "output",
    "good", "bad"}.

    `commit` is None when git could not name one; `candidates` then lists
    what skipped steps left undecided. `steps` has one line per step (commit,
    subject, verdict, outcome), each also printed to `out` as it finishes.

    The repository is always left with `git bisect reset` done.
    """
    repo = Path(_git(Path(repo), "rev-parse", "--show-toplevel").stdout.strip())
    if _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise RuntimeError(f"{repo}: tracked files have uncommitted changes; bisect checks out "
                           f"other commits, so commit or stash them first")
    if _git(repo, "bisect", "log", check=False).returncode == 0:
        raise RuntimeError(f"{repo}: a bisect is already in progress; `git bisect reset` it first")
    good_sha = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}").stdout.strip()
    bad_sha = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}").stdout.strip()
    cache = cache_dir or os.environ.get("KERNELS_CACHE_DIR") or str(repo / ".cache" / "kernels")
    with tempfile.TemporaryDirectory(prefix="harness-bisect-") as tmp:
        step = Path(tmp) / "step.py"
        step.write_text(STEP_SOURCE)
        config = Path(tmp) / "step.json"
        env = {"KERNELS_CACHE_DIR": cache, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
        config.write_text(json.dumps({
            "repo": str(repo), "timeout": timeout, "env": env, "steps": str(Path(tmp) / "steps"),
            "skip_codes": {str(k): v for k, v in SKIP_CODES.items()},
            "command": repro_command(python, case_id, options, target),
        }))
        ends = _check_ends(repo, step, config, tmp, good_sha, bad_sha, out)
        try:
            _git(repo, "bisect", "start", bad_sha, good_sha)
            output, steps = _run_steps(["git", "-C", str(repo), "bisect", "run", sys.executable,
                                        str(step), str(config)], Path(tmp) / "steps", out)
            commit = first_bad(output)
        finally:
            _git(repo, "bisect", "reset", check=False)
    subject = ""
    if commit:
        commit, subject = _git(repo, "log", "-1", "--format=%H%x00%s", commit).stdout.strip().split("\0", 1)
    return {"commit": commit, "subject": subject, "output": output, "steps": steps, "ends": ends,
            "candidates": [] if commit else candidates(output),
            "good": good_sha, "bad": bad_sha}


def main(args: argparse.Namespace) -> int:
    try:
        result = bisect(args.repo, args.good, args.bad, args.case_id, python=args.python,
                        options=target_options(args), target=args.target,
                        timeout=args.timeout, cache_dir=args.cache_dir, out=sys.stderr)
    except EndsError as e:
        print(f"bisect: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"bisect: {e}", file=sys.stderr)
        return 2
    if not result["commit"] and result["candidates"]:
        print("bisect: skipped commits (build failed or case unknown) hide the first bad one; "
              "it is one of:")
        for sha in result["candidates"]:
            print("  " + _git(Path(args.repo), "log", "-1", "--format=%H %s", sha).stdout.strip())
        return 1
    if not result["commit"]:
        print("bisect: no first bad commit found:", file=sys.stderr)
        print(result["output"].strip()[-3000:], file=sys.stderr)
        return 1
    print(f"first bad commit: {result['commit']} {result['subject']}")
    if result["commit"] == result["bad"]:
        repro = repro_command("", args.case_id, target_options(args), args.target)[3:]
        print(f"bisect: that is the --bad revision itself; check that the case passes at "
              f"--good and fails at --bad ({shlex.join(['harness', *repro])})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="harness bisect")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
