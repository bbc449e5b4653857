"""A case that asks for an LSE runs output-only on a target that returns none.

The row is a real comparison of o (a wrong o fails, a right one matches) and names the LSE
as not compared; a case about the LSE buffer itself has nothing to run there."""
from __future__ import annotations

from harness.engine.execute import execute_case
from harness.model.capabilities import Capabilities
from harness.model.case import Case
from harness.model.reference import attention_reference
from harness.targets.base import Target

NO_LSE = Capabilities(ops=frozenset({"single_prefill"}), call_forms=frozenset({"out"}))
BASE = {"dtype": "fp16", "head_dim": 64, "num_qo_heads": 2, "num_kv_heads": 2,
        "qo_lens": [3], "kv_lens": [9], "causal": True, "return_lse": True}


class OutputOnly(Target):
    """The reference's o (nudged where `bend` says), never an LSE."""
    name = "output-only"
    routes = ("oo.single_prefill",)
    capabilities = NO_LSE

    def __init__(self, bend: float = 0.0):
        self.bend = bend

    def version(self):
        return "0"

    def platform(self):
        return "cpu"

    def run(self, case, problem, buffers):
        o = attention_reference(problem)["o"].to(problem.dtype).clone()
        o[0, 0, 0] += self.bend
        return {"o": o}


def _case(**extra):
    return Case("oo.single_prefill", "t", "lse", {**BASE, **extra})


def test_lacks_no_longer_skips_an_lse_case_but_skips_a_strided_lse():
    assert NO_LSE.lacks("single_prefill", BASE) is None
    why = NO_LSE.lacks("single_prefill", {**BASE, "strided": "lse"})
    assert why is not None and "lse" in why
    # A target that returns the LSE runs both.
    both = Capabilities(ops=frozenset({"single_prefill"}))
    assert both.lacks("single_prefill", {**BASE, "strided": "lse"}) is None
    assert both.not_returned(BASE) == {}
    assert set(NO_LSE.not_returned(BASE)) == {"lse"}
    assert NO_LSE.not_returned({**BASE, "return_lse": False}) == {}


def test_output_only_target_matches_on_o_and_says_the_lse_was_not_compared():
    result = execute_case(_case(), OutputOnly(), device="cpu")
    assert result.outcome == "match" and result.passed, result.message
    assert "lse not compared" in result.message and "returns no LSE" in result.message
    # o was compared in full: every element of it, and only it.
    assert result.n_total == 3 * 2 * 64 and result.n_wrong == 0
    assert result.lse_max_abs_diff is None and result.o_max_abs_diff is not None


def test_a_wrong_o_still_fails_when_the_lse_is_not_compared():
    result = execute_case(_case(), OutputOnly(bend=4.0), device="cpu")
    assert result.outcome == "wrong" and not result.passed
    assert result.n_wrong == 1 and "lse not compared" in result.message


def test_an_output_only_run_of_a_must_refuse_case_is_silent():
    case = Case("oo.single_prefill", "t", "lse", {**BASE, "num_kv_heads": 2}, expect="refuse")
    result = execute_case(case, OutputOnly(), device="cpu")
    assert result.outcome == "silent" and not result.passed


def test_a_strided_lse_case_is_skipped_naming_the_call_form():
    result = execute_case(_case(strided="lse"), OutputOnly(), device="cpu")
    assert result.outcome == "skipped" and "lse" in result.message
