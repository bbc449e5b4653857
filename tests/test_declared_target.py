"""A vLLM-shaped library declared by its signature alone is checked by `harness check`.

tests/user_targets/tinyvllm.py is a small pure-torch library and an adapter made of its
signature and one function per call (harness/targets/block_table/declared.py performs every
case). Its three planted bugs must each be found by the families the signature reaches, with
no scenario code in the adapter; the same library with the bugs fixed must pass those rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli

ADAPTER = Path(__file__).parent / "user_targets" / "tinyvllm.py"


def _selection() -> list:
    """The cases both libraries run: the bf16 cases of the families the signature reaches
    (misplanned, restaged_indptr), and the values cases that put a NaN or inf past the last
    token of a block (normal_tail_*) on the decode route. One check per library runs them
    all (a cases file holds both selections): each check is a pytest child of its own."""
    from harness.targets import load_target
    target = load_target(f"{ADAPTER}:make_target")
    return [c for c in target.cases(["misplanned", "restaged_indptr"], "ci") if "bf16" in c.id] \
        + [c for c in target.cases(["values"], "ci")
           if "normal_tail_" in c.id and c.route == "tiny.batch_decode"]


def _check(tmp_path, factory: str) -> dict:
    table = tmp_path / f"{factory}.jsonl"
    cases = tmp_path / "cases.json"
    if not cases.exists():
        cases.write_text(json.dumps([c.to_json() for c in _selection()]))
    rc = cli.main(["check", "--target", f"{ADAPTER}:{factory}", "-n", "0",
                   "--cases-file", str(cases), "--results", str(table)])
    rows = {}
    for line in table.read_text().splitlines():
        row = json.loads(line)
        rows[row["case_id"]] = row
    return rc, rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both libraries' runs, once per session (shared_run.once): a module fixture alone is
    made again in each xdist worker that picks up one of these tests."""
    from shared_run import once
    return once(tmp_path_factory, "declared-target-runs",
                lambda tmp: {f: _check(tmp, f) for f in ("make_target", "make_fixed_target")})


def _variant_rows(rows, variant):
    return [r for i, r in rows.items() if f"/{variant}/" in i]


@pytest.mark.parametrize("variant, outcome", [
    ("restaged_indptr.seq_lens", "wrong"),             # (a) plan() kept the caller's seq_lens
    ("misplanned.block_table_negative", "silent"),     # (b) a negative block id wraps around
    ("misplanned.num_qo_heads_more", "silent"),        # (c) run with more heads than planned
    ("misplanned.plan_handle_other_batch", "wrong"),   # (a) again: another batch's plan
])
def test_each_planted_bug_is_found(runs, variant, outcome):
    rc, rows = runs["make_target"]
    found = _variant_rows(rows, variant)
    assert found, variant
    assert {r["outcome"] for r in found} == {outcome}, [(r["case_id"], r["outcome"]) for r in found]
    assert all(not r["pass"] and r["severity"] == "correctness" for r in found)
    assert rc != 0
    # the fixed library passes the same rows
    _, fixed = runs["make_fixed_target"]
    again = _variant_rows(fixed, variant)
    assert len(again) == len(found) and all(r["pass"] for r in again), \
        [(r["case_id"], r["outcome"], r["message"]) for r in again if not r["pass"]]


def test_a_causal_flag_planned_the_other_way_is_found_where_it_changes_the_answer(runs):
    # (d) run() masks by plan()'s causal flag: a prefill planned non-causal and run causal
    # is wrong; a decode row sees every key either way (bottom-right aligned), so it matches.
    rc, rows = runs["make_target"]
    found = _variant_rows(rows, "misplanned.causal")
    by_route = {}
    for r in found:
        by_route.setdefault(r["route"], set()).add(r["outcome"])
    assert by_route == {"tiny.paged_prefill": {"wrong"}, "tiny.batch_decode": {"match"}}, by_route
    _, fixed = runs["make_fixed_target"]
    assert all(r["pass"] for r in _variant_rows(fixed, "misplanned.causal"))


def test_nan_past_the_last_token_of_a_block_is_found(runs):
    # (e) run() weights the slots past a request's length by 0 instead of leaving them out:
    # a NaN or inf there (values.normal_tail_*) reaches every row that reads that block.
    found = {factory: {i: r["outcome"] for i, r in runs[factory][1].items()
                       if "/values.normal_tail_" in i and r["route"] == "tiny.batch_decode"}
             for factory in ("make_target", "make_fixed_target")}
    ran = {i for i, o in found["make_fixed_target"].items() if o != "skipped"}
    assert ran and all(found["make_fixed_target"][i] == "match" for i in ran)
    assert {found["make_target"][i] for i in ran} == {"wrong"}, found["make_target"]


def test_the_fixed_library_passes_every_row_it_runs(runs):
    rc, rows = runs["make_fixed_target"]
    failing = [(i, r["outcome"], r["message"]) for i, r in rows.items() if not r["pass"]]
    assert not failing and rc == 0, failing
    ran = [r for r in rows.values() if r["outcome"] != "skipped"]
    # the bounds, counts and restaged relations all ran, refused by name or matched
    variants = {r["case_id"].split("/")[1] for r in ran}
    assert {"misplanned.kv_lens_past_table", "misplanned.kv_lens_negative",
            "misplanned.block_table_one_past", "misplanned.batch_size_fewer",
            "misplanned.query_start_loc_decreasing", "misplanned.num_kv_heads_more",
            "restaged_indptr.block_table", "restaged_indptr.query_start_loc"} <= variants


def test_the_adapter_holds_no_scenario_code():
    """Its module defines the library, the signature and the call functions: nothing of the
    harness's cases (no params, mismatch, rewrite or buffers)."""
    text = ADAPTER.read_text()
    adapter = text[text.index("PLAN, RUN = "):]
    for word in ("params", "mismatch", "rewrite", "buffers", "Skip", "case"):
        assert word not in adapter, word


def test_descriptor_of_the_adapter_imports_no_torch_for_the_signature():
    code = ("import sys; from harness.targets import Arg, Signature, Capabilities; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.stdout.strip() == "False", out.stderr


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "vllm_shaped_target" / \
    "vllm_shaped_target.py"


def test_the_vllm_shaped_example_is_a_complete_adapter():
    """examples/vllm_shaped_target: a valid batch matches, relations it checks are refused
    naming the field and the values, and it stays about a hundred lines."""
    from harness.engine.execute import execute_case
    from harness.targets import load_target
    target = load_target(str(EXAMPLE))
    picked = {}
    for c in target.cases(["valid", "misplanned"]):
        key = (c.route, c.variant)
        if c.params.get("dtype") == "bf16" and key not in picked and (
                c.family == "valid" or c.variant in ("block_table_negative",
                                                     "kv_lens_past_table",
                                                     "num_qo_heads_more")):
            picked[key] = c
    outcomes = {}
    chosen = [c for c in picked.values() if c.family == "valid"][:12] + \
        [c for c in picked.values() if c.family == "misplanned"]
    for c in chosen:
        r = execute_case(c, target, "cpu")
        assert r.passed, (c.id, r.outcome, r.message)
        outcomes.setdefault(c.family, set()).add(r.outcome)
    assert "match" in outcomes["valid"] and outcomes["misplanned"] == {"refused"}
    assert len(EXAMPLE.read_text().splitlines()) <= 110


def test_an_argument_the_core_never_gives_is_the_adapters_error_not_a_refusal():
    # A signature with a role DeclaredTarget hands no value (kv_offsets) for a parameter
    # without a default: the library would raise TypeError, which reads as a refusal and
    # passes refuse / match_or_refuse rows. It is the adapter's error, named.
    import sys
    sys.path.insert(0, str(ADAPTER.parent))
    import tinyvllm
    from harness.engine.execute import execute_case
    from harness.targets import Arg, Signature

    sig = Signature(args=tinyvllm.SIGNATURE.args + (Arg("indptr", "kv_offsets", "plan"),),
                    core="declared")

    class Strict(tinyvllm.TinyVllmTarget):
        signature = sig

        def functions(self):
            lib = self.lib

            def plan(seq_lens, query_start_loc, num_reqs, num_heads, num_kv_heads, head_size,
                     block_size, causal, indptr):
                return lib.plan(seq_lens, query_start_loc, num_reqs, num_heads, num_kv_heads,
                                head_size, block_size, causal)
            return {"plan": plan, "run": lib.run}

    target = Strict(bugs=())
    case = next(c for c in target.cases(["misplanned"], "ci")
                if c.expect == "refuse" and c.route == "tiny.batch_decode")
    r = execute_case(case, target, "cpu")
    assert (r.outcome, r.passed) == ("harness_error", False), (r.outcome, r.message)
    assert "'indptr'" in r.message and "kv_offsets" in r.message
