"""The explorer: drawn cases keep the families' contracts, a found failure is shrunk,
saved and replays the same through repro and check, guards on it finds nothing, and a
bad option is one line and exit 2."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cases import generate
from harness import cli
from harness.tools import explore
from harness.model.case import Case
from harness.engine.row import case_row
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.tools.strategies import contract

ROOT = Path(__file__).resolve().parent.parent
CLASS_LINE = re.compile(r"^(\w+)\s+(\S+)\s+(\S+\.json)")


def harness(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def harness_here(capfd, *args) -> subprocess.CompletedProcess:
    """`harness ARGS` through this process's cli.main, for repro and check: each runs its
    case in a child of its own (repro's isolated child, check's pytest and its workers),
    so only the parent's start-up is saved. explore runs in a fresh process: it forks
    its examples from one that has never run a kernel."""
    capfd.readouterr()
    rc = cli.main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["harness", *args], rc, out, err)


# `harness explore ARGS` in a fresh interpreter, except that the search stops as soon as
# WANT classes are found and replayed, instead of running out its budget: the test that
# uses it asserts on the classes found, their files and their replays, none of which the
# rest of the budget changes. That a search goes on after its classes until the budget is
# spent is test_search_shrinks_each_class_and_keeps_looking's to prove. The searches here are
# bounded by an example count, never by how fast a loaded machine is.
#
# Each class's replay in a fresh process (Explorer.confirm, shrink's trial step) forks from a
# warm server that has never run a case (tests/warm_children.py), not an interpreter each; the
# examples still fork from the explorer itself (fork_from, which the server leaves alone).
EXPLORE_UNTIL_FOUND = """
import sys, time
from harness import cli
from harness.engine import child
from harness.tools import explore
sys.path.insert(0, sys.argv.pop(1))
from warm_children import forking
child.run = forking(child.run)
want = int(sys.argv[1])
confirm = explore.Explorer.confirm
def confirm_then_stop(self, finding):
    confirm(self, finding)
    if len(self.found) >= want:
        self.deadline = min(self.deadline, time.monotonic())
explore.Explorer.confirm = confirm_then_stop
sys.exit(cli.main(sys.argv[2:]))
"""


def explore_until_found(want: int, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", EXPLORE_UNTIL_FOUND, str(Path(__file__).parent),
                           str(want), "explore", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def found_classes(stdout: str) -> list[tuple[str, str, Path]]:
    """(outcome, case id, file) of each class line explore printed."""
    return [(m[1], m[2], Path(m[3])) for m in map(CLASS_LINE.match, stdout.splitlines()) if m]


# ---- the contract is the families' ------------------------------------------------------------

CONTRACT_FAMILIES = ["valid", "strided", "misplanned", "gqa", "small_head", "values",
                     "edge_rows", "mixed_batch"]


@pytest.mark.parametrize("profile", ["ci", "full"])
def test_contract_gives_every_family_case_its_own_expectation(profile):
    family_cases = [c for c in generate(CONTRACT_FAMILIES, BUNDLED_ROUTES, profile=profile)
                    if not c.params.get("scenario")]
    wrong = [(c.id, contract(op_of(c.route), c.params), c.expect, c.refuse_words)
             for c in family_cases
             if contract(op_of(c.route), c.params) != (c.expect, tuple(c.refuse_words))]
    assert len(family_cases) > 500 and not wrong, wrong[:5]


def test_contract_of_partial_state_without_lse_is_graph_replans():
    # graph_replan states it through its scenario's prefix; a drawn case through partial_state.
    case = next(c for c in generate(["graph_replan"], BUNDLED_ROUTES)
                if c.variant == "partial_state_without_lse")
    params = {**case.params, "partial_state": True}
    assert contract("paged_prefill", params) == (case.expect, tuple(case.refuse_words))


def test_contract_of_drawn_mismatches_names_any_dtype_torchs_way():
    base = {"dtype": "fp32", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
            "qo_lens": [3], "kv_lens": [9]}
    assert contract("ragged_prefill", {**base, "mismatch": {"field": "dtype", "value": "bf16"}}) \
        == ("refuse", ("dtype", "float32", "bfloat16"))
    assert contract("ragged_prefill", {**base, "mismatch": {"field": "q_rows", "value": 4}}) \
        == ("match", ())
    assert contract("batch_decode", {**base, "qo_lens": [1, 1], "kv_lens": [4, 5],
                                     "mismatch": {"field": "q_rows", "value": 0}}) \
        == ("refuse", ("batch_size|rows", "2", "0"))


# ---- the search loop, with a fake runner ---------------------------------------------------------

def _opts(tmp_path, **over) -> explore.Options:
    base = dict(target="bundled", routes=["fa2.paged_prefill", "fa2.single_prefill"],
                families=["valid", "gqa"], budget_s=3600.0, seed=3, disable_guards=None,
                out=tmp_path, case_timeout=None, saved=True, max_examples=300)
    return explore.Options(**{**base, **over})


def _fake_run(case: Case, timeout_s: float, cut_s: float) -> dict:
    """Two planted defects: a paged request with kv_len >= 17 is wrong; a GQA group
    that does not divide crashes. Everything else passes."""
    p = case.params
    if case.variant.startswith("gqa."):
        outcome = "crash"
    elif case.route == "fa2.paged_prefill" and max(p["kv_lens"]) >= 17:
        outcome = "wrong"
    else:
        outcome = "refused" if case.expect == "refuse" else "match"
    return case_row(case, outcome=outcome, message="", **{"pass": outcome in case.allowed()})


def test_search_shrinks_each_class_and_keeps_looking(tmp_path, monkeypatch):
    replays = []

    def fake_step(*a, **kw):
        def step(case):
            replays.append(case.id)
            return (_fake_run(case, 0, 0)["outcome"], False)
        return step
    monkeypatch.setattr("harness.tools.shrink.subprocess_step", fake_step)
    explorer = explore.Explorer(_opts(tmp_path), _fake_run)
    explorer.search()
    found = explorer.found
    assert set(found) == {("valid", "fa2.paged_prefill", "wrong"), ("gqa", "crash")}
    wrong = found[("valid", "fa2.paged_prefill", "wrong")].case.params
    # Minimal: one request, at the first length a tile edge list offers past 16.
    assert wrong["kv_lens"] == [17] and wrong["qo_lens"] == [1], wrong
    assert "max_kv_chunk" not in wrong and "values" not in wrong, wrong
    crash = found[("gqa", "crash")].case
    # The first route, the first head counts gqa refuses.
    assert crash.route == "fa2.paged_prefill" and crash.expect == "refuse"
    assert (crash.params["num_qo_heads"], crash.params["num_kv_heads"]) == (12, 8)
    # Each class saved once, replayed once, and the saved file reads back as the case.
    assert sorted(replays) == sorted(f.case.id for f in found.values())
    for f in found.values():
        assert [Case.from_json(d) for d in json.loads(f.path.read_text())] == [f.case]
    # Both classes found, the search went on until its example count was spent.
    assert explorer.stats.ran == 300 and explorer.stats.rounds > 2
    lines = explore.report_lines(explorer)
    assert len(lines) == 3 and "2 failure class(es)" in lines[-1]

    # A second search re-runs the saved files first: both classes, no round needed.
    again = explore.Explorer(_opts(tmp_path, max_examples=len(found)), _fake_run)
    again.search()
    assert set(again.found) == set(found) and all(f.saved for f in again.found.values())


# ---- each example in a forked child --------------------------------------------------------------

@pytest.fixture(scope="module")
def faults_runner():
    return explore.ForkRunner("faults")


@pytest.mark.parametrize("fault, outcome, says", [
    ("none", "match", ""), ("wrong", "wrong", "max|diff|"),
    ("sigfpe", "crash", "SIGFPE during run"), ("segv", "crash", "SIGSEGV"),
    ("exit3", "crash", "exit code 3"),
])
def test_fork_runner_turns_a_dying_case_into_its_row(faults_runner, fault, outcome, says):
    from fault_target import fault_case
    row = faults_runner.run(fault_case(fault), timeout_s=60, cut_s=60)
    assert row["outcome"] == outcome and says in row["message"], row


def test_fork_runner_hang_and_budget_cut(faults_runner):
    from fault_target import fault_case
    start = time.monotonic()
    # The hang never ends, so any limit ends it alike: half a second each, not one.
    row = faults_runner.run(fault_case("hang"), timeout_s=0.5, cut_s=30)
    assert row["outcome"] == "hang" and not row["pass"], row
    # Stopped by the caller's budget before its own timeout: no verdict at all.
    assert faults_runner.run(fault_case("hang"), timeout_s=30, cut_s=0.5) is None


def test_fork_runner_child_runs_after_the_target_computed_while_loading():
    # torch-sdpa probes its backends when it loads: OpenMP's pool starts in this process.
    runner = explore.ForkRunner("torch-sdpa")
    case = Case(route="sdpa_math.single_prefill", family="explore", variant="valid.drawn",
                params={"dtype": "fp32", "head_dim": 64, "num_qo_heads": 4, "num_kv_heads": 2,
                        "qo_lens": [33], "kv_lens": [129], "causal": True})
    row = runner.run(case, timeout_s=20, cut_s=20)
    assert row["outcome"] == "match", row


# ---- the whole loop, on the bundled library ------------------------------------------------------

def test_found_failures_are_saved_and_replay_the_same(tmp_path, capfd, forked_children):
    """Guards off, gqa on single prefill: a silent run and a SIGFPE, each shrunk, saved,
    and the same again through repro; the SIGFPE also through check's crash-isolated
    workers."""
    out = tmp_path / "found"
    # Seed 1 finds the silent class at its first case and the SIGFPE at its tenth, shrunk
    # in 8 more; the search stops once both are found and replayed (explore_until_found).
    # An example count bounds it, never the clock.
    r = explore_until_found(2, "--route", "fa2.single_prefill", "--family", "gqa",
                            "--examples", "80", "--budget", "1h", "--seed", "1",
                            "--disable-guards", "all", "--out", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    classes = found_classes(r.stdout)
    assert {o for o, _, _ in classes} == {"silent", "crash"}, r.stdout
    assert "not the same in a fresh process" not in r.stdout, r.stdout
    assert sorted(out.glob("*.json")) == sorted(p for _, _, p in classes)
    for outcome, case_id, path in classes:
        case = Case.from_json(json.loads(path.read_text())[0])
        assert case.id == case_id and case.expect == "refuse"
        rep = harness_here(capfd, "repro", case_id, "--case-json", str(path), "--json",
                           "--disable-guards", "all")
        row = json.loads(rep.stdout.strip().splitlines()[-1])
        assert (row["outcome"], row["pass"]) == (outcome, False), rep.stdout + rep.stderr
        if outcome != "crash":
            continue   # check's pytest run costs seconds; the dying case is the one to see
        results = tmp_path / f"check-{outcome}"
        chk = harness_here(capfd, "check", "--cases-file", str(path), "--disable-guards", "all",
                           "--results-dir", str(results), "-n", "1")
        assert chk.returncode == 1, chk.stdout + chk.stderr
        rows = [json.loads(l) for t in results.glob("*.jsonl") for l in t.read_text().splitlines()]
        assert [(x["case_id"], x["outcome"]) for x in rows] == [(case_id, outcome)], rows


def test_with_guards_on_a_short_search_finds_nothing(tmp_path):
    out = tmp_path / "none"
    # With guards on these are refused or small: 40 drawn cases (every family and route
    # several rounds over), however long a loaded machine takes for them.
    r = harness("explore", "--route", "fa2.single_prefill,fa2.ragged_prefill",
                "--family", "gqa,strided", "--examples", "40", "--budget", "1h", "--seed", "1",
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not found_classes(r.stdout) and not list(out.glob("*.json"))
    tail = r.stdout.strip().splitlines()[-1]
    ran = int(re.search(r"(\d+) cases run \((\d+) skipped", tail)[1])
    assert ran == 40 and "(0 skipped" in tail and "0 failure class(es)" in tail, tail


# ---- options -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, option", [
    (["--budget", "soon"], "--budget"), (["--budget", "0s"], "--budget"),
    (["--seed", "one"], "--seed"), (["--target", "nope"], "--target"),
    (["--route", "fa2.nope"], "--route"), (["--family", "scale"], "--family"),
    (["--disable-guards", "no_such_guard"], "--disable-guards"),
    (["--case-timeout", "-1"], "--case-timeout"),
    (["--route", "fa2.single_decode", "--family", "misplanned"], "--family"),
])
def test_bad_option_is_one_line_and_exit_2(args, option, capsys, tmp_path):
    assert cli.main(["explore", "--out", str(tmp_path), *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"explore: {option}"), err
    assert "Traceback" not in err and not out and not list(tmp_path.iterdir())


# ---- drawn from the target's signature -----------------------------------------------------

def _signature_fields():
    from harness.targets.block_table.mismatch import FIELDS as BLOCK_FIELDS
    from harness.targets.descriptors import bundled, flaggems, flashinfer
    return {"bundled": set(bundled.CAPABILITIES.metadata),
            "flaggems": set(flaggems.CAPABILITIES.metadata),
            "flashinfer": set(flashinfer.CAPABILITIES.metadata),
            "block_table": set(BLOCK_FIELDS)}


@pytest.mark.parametrize("which", ["bundled", "flaggems", "flashinfer", "block_table"])
def test_misplanned_draws_only_the_signatures_fields(which):
    """Every drawn mismatch is on a field the target's signature carries, its contract is the
    relation's, and no signature makes the strategy fail to draw (it did: 'mismatch field
    batch_size has no values here')."""
    from hypothesis import HealthCheck, given, settings
    from cases import misplanned
    from harness.tools.strategies import cases as drawn_cases
    fields = _signature_fields()[which]
    routes = ("x.paged_prefill", "x.ragged_prefill", "x.batch_decode")
    seen = set()

    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(drawn_cases(routes, "misplanned", fields))
    def check(case):
        mm = case.params["mismatch"]
        assert mm["field"] in fields, case.id
        r = misplanned.relation_of(case.op, case.params)
        assert case.variant == f"misplanned.{r.variant}"
        assert case.expect == r.expect
        seen.add(mm["field"])
    check()
    assert len(seen) >= 3, seen


def test_explore_options_take_a_block_table_target():
    import argparse
    from pathlib import Path
    adapter = Path(__file__).parent / "user_targets" / "tinyvllm.py"
    p = argparse.ArgumentParser()
    explore.add_arguments(p)
    opts = explore.read_options(p.parse_args(["--target", str(adapter), "--family",
                                              "misplanned", "--examples", "5"]))
    assert opts.families == ["misplanned"]
    assert set(opts.routes) == {"tiny.paged_prefill", "tiny.batch_decode"}
