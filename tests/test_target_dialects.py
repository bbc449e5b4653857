"""Targets a user brings: by package.module:factory, by file path and by entry point, each
under check, repro, shrink and explore; refusals judged in the library's own words; and no
case the adapter did not perform ever passes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.model.case import Case
from harness.model.classify import classify

ROOT = Path(__file__).resolve().parent.parent
USER = ROOT / "tests" / "user_targets"


def harness(*args, env=None, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True,
                          text=True, env=env, cwd=cwd or ROOT, timeout=timeout)


def harness_here(capfd, *args) -> subprocess.CompletedProcess:
    """`harness ARGS` through this process's cli.main: check, repro, shrink and
    check-target still run the cases in children of their own (which inherit this
    process's environment), so only the parent's interpreter start-up is saved. The
    command as a process of its own is test_a_target_from_a_file_runs_under_check_and_explore's."""
    from harness import cli
    capfd.readouterr()
    rc = cli.main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["harness", *args], rc, out, err)


@pytest.fixture
def fresh_user_modules():
    """A user's target loaded here (the parent of list, repro, shrink, check-target loads
    it) is dropped afterwards: a module reads its environment when imported (ignoring.py's
    IGNORED_PARAMS), and the next test may set another."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("usersdpa", "harness_user_target_")):
            del sys.modules[name]


def user_env(tmp_path, monkeypatch, entry_point: bool = False) -> None:
    """The user's environment, in this process and its children: their package on the path
    (never the harness's business), and, for the entry point, an installed distribution's
    metadata beside it."""
    paths = [str(USER)]
    if entry_point:
        dist = tmp_path / "site" / "usersdpa-0.1.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: usersdpa\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(
            "[attention_harness.targets]\nusersdpa-nocausal = usersdpa:make_nocausal\n")
        paths.insert(0, str(tmp_path / "site"))
    for path in reversed(paths):
        monkeypatch.syspath_prepend(path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def causal_case_id(spec: str, capfd) -> str:
    proc = harness_here(capfd, "list", "--target", spec, "--family", "valid")
    assert proc.returncode == 0, proc.stderr
    import re
    # Several query rows under a causal mask and no window: dropping the mask shows there.
    ids = [i for i in proc.stdout.split()
           if (m := re.search(r"-q(\d+)k(\d+)-causal-(nhd|hnd)$", i)) and int(m.group(1)) > 1]
    assert ids, proc.stdout[-2000:]
    return ids[0]


@pytest.mark.parametrize("spec,entry_point", [
    ("usersdpa:make_nocausal", False),
    ("usersdpa-nocausal", True),
])
def test_an_installed_target_catches_its_planted_defect_everywhere(tmp_path, spec, entry_point,
                                                                   monkeypatch, capfd,
                                                                   fresh_user_modules,
                                                                   forked_children):
    user_env(tmp_path, monkeypatch, entry_point)
    case_id = causal_case_id(spec, capfd)   # `harness list` with the target: exit 0, its ids

    # -n 0: the cases run in check's pytest child itself; what its xdist workers add (crash
    # isolation) is not this test's subject.
    check = harness_here(capfd, "check", "--target", spec, "--family", "valid",
                         "--case-id=-causal-", "--results-dir", str(tmp_path / "r"), "-n", "0")
    assert check.returncode == 1, check.stdout[-3000:] + check.stderr[-2000:]
    table = next((tmp_path / "r").glob("*.jsonl"))
    rows = [json.loads(l) for l in table.read_text().splitlines()]
    outcomes = {r["outcome"] for r in rows}
    assert "crash" not in outcomes and "harness_error" not in outcomes, outcomes
    assert any(r["outcome"] == "wrong" and "causal" in r["case_id"] for r in rows)

    repro = harness_here(capfd, "repro", case_id, "--target", spec, "--json")
    assert repro.returncode == 1, repro.stderr
    assert json.loads(repro.stdout.strip().splitlines()[-1])["outcome"] == "wrong"

    shrunk = harness_here(capfd, "shrink", case_id, "--target", spec, "--max-trials", "3",
                          "--out-dir", str(tmp_path / "s"))
    assert shrunk.returncode == 0, shrunk.stderr[-2000:]
    assert json.loads(shrunk.stdout)["outcome"] == "wrong"


@pytest.mark.system
def test_a_target_from_a_file_runs_under_check_and_explore(tmp_path):
    spec = str(USER / "usersdpa" / "__init__.py") + ":make_nocausal"
    env = dict(os.environ)   # nothing on PYTHONPATH: the file path alone finds it
    check = harness("check", "--target", spec, "--family", "valid", "--case-id=-causal-",
                    "--results-dir", str(tmp_path / "r"), "-n", "2", env=env)
    rows = [json.loads(l) for p in (tmp_path / "r").glob("*.jsonl")
            for l in p.read_text().splitlines()]
    assert check.returncode == 1 and rows, check.stderr[-2000:]
    assert not {"crash", "harness_error"} & {r["outcome"] for r in rows}
    assert any(r["outcome"] == "wrong" for r in rows)

    explore = harness("explore", "--target", spec, "--family", "valid", "--examples", "30",
                      "--budget", "10m", "--seed", "2", "--out", str(tmp_path / "e"),
                      "--no-saved", env=env)
    assert "crash" not in explore.stdout, explore.stdout[-3000:]
    assert explore.returncode == 1 and "wrong" in explore.stdout, (
        explore.stdout[-3000:] + explore.stderr[-2000:])


@pytest.mark.system
def test_a_target_that_cannot_load_is_our_error_never_a_crash(tmp_path):
    case = {"route": "sdpa.single_prefill", "family": "valid", "variant": "x",
            "params": {"dtype": "fp32", "head_dim": 8, "num_qo_heads": 1, "qo_lens": [2],
                       "kv_lens": [3]}, "expect": "match"}
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([case]))
    proc = harness("repro", Case.from_json(case).id, "--target", "no_such_module:make",
                   "--cases-file", str(cases), "--json")
    assert proc.returncode in (1, 2), proc.stderr
    if proc.returncode == 1:
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        assert row["outcome"] == "harness_error" and "no_such_module" in row["message"]
    else:
        assert "no_such_module" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("ignored", ["scenario", "mismatch"])
def test_an_adapter_that_ignores_a_param_gives_harness_error(ignored, monkeypatch,
                                                             fresh_user_modules):
    """Judged in this process as a worker judges each case (execute_case): the row's verdict
    is the subject. The adapter loaded from its file under check's pytest child is
    test_an_installed_target_catches_its_planted_defect_everywhere's, its findings through
    the one child runner test_check_target_names_what_the_adapter_does_wrong's."""
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    monkeypatch.setenv("IGNORED_PARAMS", ignored)     # read when the adapter's module loads
    variant = "plan_rejected_first" if ignored == "scenario" else "num_qo_heads"
    target = load_target(str(USER / "ignoring.py"))
    cases = [c for c in target.cases(["misplanned"], "ci")
             if c.route == "fa2.paged_prefill" and f"misplanned.{variant}/bf16" in c.id]
    assert cases
    results = [execute_case(c, target, "cpu") for c in cases]
    assert {r.outcome for r in results} == {"harness_error"}, [r.message for r in results]
    assert all(f"params['{ignored}']" in r.message for r in results)
    assert not any(r.passed for r in results)


def gqa_case() -> Case:
    return Case(route="x.single_prefill", family="gqa", variant="q12_over_kv8",
                params={"dtype": "bf16", "head_dim": 8, "num_qo_heads": 12, "num_kv_heads": 8,
                        "qo_lens": [1], "kv_lens": [2]},
                expect="refuse", refuse_words=("num_qo_heads", "12", "num_kv_heads", "8"))


def test_a_refusal_in_the_librarys_own_words_passes_clarity():
    said = ValueError("key_heads 8 must divide num_qo_heads 12")
    assert classify(gqa_case(), error=said,
                    vocabulary={"num_kv_heads": ("key_heads",)}).passed
    # Without the vocabulary its name for the field is not ours: a clarity finding.
    assert not classify(gqa_case(), error=said).passed


def test_the_same_refusal_without_the_values_fails_clarity():
    said = ValueError("key_heads must divide num_qo_heads")
    verdict = classify(gqa_case(), error=said, vocabulary={"num_kv_heads": ("key_heads",)})
    assert verdict.outcome == "refused" and not verdict.passed
    assert "'12'" in verdict.message and "'8'" in verdict.message


def test_vocabulary_names_must_be_a_tuple_of_words():
    from harness.targets import Capabilities
    with pytest.raises(ValueError, match="vocabulary"):
        Capabilities(ops=frozenset(), vocabulary={"num_kv_heads": "kv_heads"})


def test_check_target_names_what_the_adapter_does_wrong(monkeypatch, capfd, fresh_user_modules,
                                                       forked_children):
    # The cases run in a child forked from a warm interpreter (tests/warm_children.py): it
    # loads the adapter from its file with IGNORED_PARAMS set, as a spawned child would.
    monkeypatch.setenv("IGNORED_PARAMS", "mismatch")
    bad = harness_here(capfd, "check-target", str(USER / "ignoring.py"), "--per-family", "1")
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "params['mismatch']" in bad.stdout and "harness_error" in bad.stdout
    good = harness_here(capfd, "check-target",
                        str(ROOT / "examples" / "sdpa_target" / "sdpa_target.py"), "--per-family", "1")
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    assert "no adapter error found" in good.stdout
