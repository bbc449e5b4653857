"""execute_case end to end with a tiny fake target that plays every kind of library."""
import pytest
import torch

from harness.model.capabilities import Capabilities
from harness.model.case import Case
from harness.engine.execute import CaseBug, execute_case
from harness.model.reference import attention_reference
from harness.targets.base import Skip, Target

P = {"dtype": "bf16", "head_dim": 8, "num_qo_heads": 4, "num_kv_heads": 2,
     "qo_lens": [3, 1], "kv_lens": [5, 4], "causal": True}


class FakeTarget(Target):
    """Computes the answer with the reference, then misbehaves as its `mode` says."""
    name = "fake"
    capabilities = Capabilities(ops=frozenset({"single_prefill"}))

    def __init__(self, mode):
        self.mode = mode

    def run(self, case, problem, buffers):
        k = problem.k_packed()
        for name, t in (("q", problem.q_packed()), ("k", k), ("v", problem.v_packed())):
            buffers.watch(t, name)
        buffers.stage("plan")
        if self.mode == "skip":
            raise Skip("route cannot express HND")
        if self.mode == "refuse":
            raise ValueError("num_kv_heads: 8 does not divide num_qo_heads 12")
        buffers.stage("run")
        total = sum(problem.qo_lens)
        o = buffers.output((total, problem.num_qo_heads, problem.head_dim_vo), problem.dtype, "o")
        lse = buffers.output((total, problem.num_qo_heads), torch.float32, "lse")
        if self.mode == "silent_no_reference":
            o.zero_()
            return {"o": o}
        ref = attention_reference(problem)
        o.copy_(ref["o"])
        lse.copy_(ref["lse"])
        if self.mode == "wrong":
            o[2, 1, 5] += 1.0
        if self.mode == "nan":
            o.view(-1)[7] = float("nan")
        if self.mode == "corrupt":      # one element past the end of o
            o.as_strided((1,), (1,), o.storage_offset() + o.numel()).zero_()
        if self.mode == "touch_input":
            k.view(-1)[0] += 1
        if self.mode == "expected_override":
            return {"o": o, "expected": {"o": ref["o"] * 0 + o.double()}}
        return {"o": o, "lse": lse}


def case(expect="match", words=(), **params):
    return Case("fa2.single_prefill", "fake", f"v_{expect}_{len(params)}", {**P, **params},
                expect=expect, refuse_words=words)


# (id, case, target mode, outcome, passed)
CASES = [
    ("match", case(), "ok", "match", True),
    ("match_with_lse", case(return_lse=True), "ok", "match", True),
    ("wrong", case(), "wrong", "wrong", False),
    ("wrong_nan", case(return_lse=True), "nan", "wrong", False),
    ("refused", case("refuse", ("num_kv_heads",)), "refuse", "refused", True),
    ("refused_missing_word", case("refuse", ("page_size",)), "refuse", "refused", False),
    ("unexpected_refusal", case(), "refuse", "unexpected_refusal", False),
    ("corrupt_write_past_end", case(), "corrupt", "corrupt", False),
    ("corrupt_input", case(), "touch_input", "corrupt", False),
    ("silent", case("refuse", ("num_kv_heads",)), "wrong", "silent", False),
    ("refuse_case_computed_right", case("refuse"), "ok", "silent", False),
    ("silent_no_reference", case("refuse", num_qo_heads=8, num_kv_heads=0),
     "silent_no_reference", "silent", False),
    ("skipped", case(), "skip", "skipped", True),
    ("expected_override", case(), "expected_override", "match", True),
]


@pytest.mark.parametrize("c,mode,outcome,passed", [r[1:] for r in CASES], ids=[r[0] for r in CASES])
def test_execute(c, mode, outcome, passed):
    stages = []
    r = execute_case(c, FakeTarget(mode), device="cpu", on_stage=stages.append)
    assert (r.outcome, r.passed) == (outcome, passed), r
    assert stages[0] == "build inputs" and r.stage == stages[-1] and r.duration_s >= 0
    if outcome in ("match", "wrong"):
        assert r.stage == "compare"
        assert r.n_total == 4 * 4 * 8 + (4 * 4 if c.params.get("return_lse") else 0)
    if outcome == "refused" or outcome == "unexpected_refusal":
        assert r.error_type == "ValueError" and r.stage == "plan"


def test_wrong_reports_diff_count_and_named_index():
    r = execute_case(case(), FakeTarget("wrong"), device="cpu")
    assert r.n_wrong == 1 and r.first_bad_index == ("o", 2, 1, 5)
    assert r.max_abs_diff == pytest.approx(1.0, abs=0.05)
    assert "first at o(2, 1, 5)" in r.message
    assert r.as_dict()["first_bad_index"] == ["o", 2, 1, 5]


def test_corrupt_names_the_band():
    r = execute_case(case(), FakeTarget("corrupt"), device="cpu")
    assert r.message == "canary after o: 1 elements changed, first at +0"


def test_missing_lse_is_wrong():
    class NoLse(FakeTarget):
        def run(self, case, problem, buffers):
            return {"o": super().run(case, problem, buffers)["o"]}
    r = execute_case(case(return_lse=True), NoLse("ok"), device="cpu")
    assert r.outcome == "wrong" and "lse was not returned" in r.message


def test_match_case_without_reference_is_a_case_bug():
    with pytest.raises(CaseBug, match="no reference"):
        execute_case(case(num_qo_heads=8, num_kv_heads=0), FakeTarget("silent_no_reference"),
                     device="cpu")


def test_bad_params_propagate():
    with pytest.raises(ValueError, match="dtype"):
        execute_case(case(dtype="fp8"), FakeTarget("ok"), device="cpu")


def test_platform_facts(tmp_path):
    import re
    import subprocess
    from harness.model import platform_info
    assert re.fullmatch(r"gfx\w+|sm_\d+|cpu-\w+", platform_info.arch())
    assert platform_info.device().type in ("cpu", "cuda") and platform_info.host_name()
    assert platform_info.repo_commit(tmp_path) == ""
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "f").write_text("a")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "f"], check=True)
    clean = platform_info.repo_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{4,}", clean)
    (tmp_path / "f").write_text("b")
    assert platform_info.repo_commit(tmp_path) == clean + "+dirty"


def test_sticky_device_error_is_a_crash_not_a_refusal():
    class Faulting(FakeTarget):
        def run(self, case, problem, buffers):
            buffers.stage("run")
            raise RuntimeError("HIP error: an illegal memory access was encountered\n"
                               "For debugging consider passing AMD_SERIALIZE_KERNEL=3")
    r = execute_case(case("match_or_refuse"), Faulting("ok"), device="cpu")
    assert (r.outcome, r.passed, r.stage, r.error_type) == ("crash", False, "run", "RuntimeError")
    assert "illegal memory access" in r.message
    assert "For debugging" not in r.message   # the runtime's advice text stays off the row


@pytest.mark.parametrize("error", [AttributeError, KeyError, AssertionError], ids=lambda e: e.__name__)
def test_adapter_bug_is_not_a_refusal(error):
    class Buggy(FakeTarget):
        def run(self, case, problem, buffers):
            raise error("adapter bug")
    r = execute_case(case(), Buggy("ok"), device="cpu")
    # Ours, naming what was raised and where: never the library's refusal or crash.
    assert (r.outcome, r.passed, r.error_type) == ("harness_error", False, error.__name__)
    assert "adapter bug" in r.message and "test_execute.py:" in r.message
    assert "not the library's refusal" in r.message


def test_a_case_needing_what_the_target_lacks_is_skipped_naming_it():
    c = Case("fa2.single_prefill", "fake", "needs_graphs", P, requires=("graphs",))
    r = execute_case(c, FakeTarget("ok"), device="cpu")
    assert (r.outcome, r.passed) == ("skipped", True) and "fake lacks feature graphs" in r.message
    fp32 = Case("fa2.single_decode", "fake", "other_op", P)
    assert "lacks op single_decode" in execute_case(fp32, FakeTarget("ok"), device="cpu").message


class RaisesWhileBuilding(FakeTarget):
    """An adapter bug that happens to raise ValueError before the library is called."""

    def run(self, case, problem, buffers):
        raise ValueError("cannot reshape tensor of 0 elements")


def test_an_adapter_error_before_the_library_is_never_a_refusal():
    # A must-refuse case would pass on any refusal naming its words: an adapter bug
    # raised before the library ran must not count as one.
    c = case("refuse", ("tensor",))
    r = execute_case(c, RaisesWhileBuilding("ok"), device="cpu")
    assert (r.outcome, r.passed) == ("harness_error", False), r
    assert "before calling the library" in r.message
