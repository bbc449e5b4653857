"""attempts: no combination of attempts turns a failing one into a pass."""
import math

import pytest
import torch

from harness.engine.attempts import answers_differ, combine_results, combine_rows
from harness.engine.execute import CaseResult


def result(outcome, passed, diff=None, o=None, message=""):
    return CaseResult(outcome, passed, diff, None, None, None, message, "", "run", 0.0,
                      outputs={"o": o} if o is not None else {})


def test_agreeing_repeats_keep_the_first_result_and_every_record():
    o = torch.ones(2, 3)
    r, records = combine_results([result("match", True, 0.0, o), result("match", True, 0.0, o)])
    assert (r.outcome, r.passed) == ("match", True) and len(records) == 2


def test_one_bit_of_difference_is_nondeterministic():
    a = torch.ones(4, dtype=torch.bfloat16)
    b = a.clone()
    b[2] = 1.0078125                              # the next bf16 after 1.0
    r, _ = combine_results([result("match", True, 0.0, a), result("match", True, 0.0, b)])
    assert (r.outcome, r.passed) == ("nondeterministic", False)
    assert "1/4 elements" in r.message and "max |diff| 0.00781" in r.message


def test_nan_in_the_same_places_is_not_a_difference():
    a = torch.tensor([1.0, math.nan])
    assert answers_differ({"o": a}, {"o": a.clone()}) is None


def test_outcomes_that_differ_name_both():
    r, _ = combine_results([result("wrong", False, 0.5), result("match", True, 0.0)])
    assert (r.outcome, r.passed) == ("nondeterministic", False)
    assert "attempt 1 wrong (max|diff| 0.5)" in r.message and "attempt 2 match" in r.message


def test_all_failing_alike_stays_that_outcome_and_fails():
    r, _ = combine_results([result("wrong", False, 0.5), result("wrong", False, 0.5)])
    assert (r.outcome, r.passed) == ("wrong", False)


@pytest.mark.parametrize("prior,final,outcome,passed", [
    ([{"outcome": "wrong", "pass": False}], {"outcome": "match", "pass": True},
     "nondeterministic", False),
    ([{"outcome": "crash", "pass": False}], {"outcome": "crash", "pass": False}, "crash", False),
    ([{"outcome": "wrong", "pass": False}] * 2, {"outcome": "wrong", "pass": False}, "wrong", False),
])
def test_reruns_are_judged_over_every_attempt(prior, final, outcome, passed):
    row = combine_rows(prior, dict(final, message=""))
    assert (row["outcome"], row["pass"]) == (outcome, passed)
    assert len(row["attempts"]) == len(prior) + 1


# An attempt the harness failed itself (its own allocation ran out of device memory) is ours:
# attempts that disagree because of it are never the library's `nondeterministic` (measured on
# an H200: attempt 1 harness_error OOM, attempt 2 match was written nondeterministic).
def test_an_attempt_of_ours_beside_a_match_is_ours_and_fails():
    r, records = combine_results([result("harness_error", False, message="OutOfMemoryError"),
                                  result("match", True, 0.0)])
    assert (r.outcome, r.passed) == ("harness_error", False)
    assert "OutOfMemoryError" in r.message and len(records) == 2


def test_an_attempt_of_ours_never_hides_the_librarys_failure():
    r, _ = combine_results([result("harness_error", False), result("wrong", False, 0.5),
                            result("wrong", False, 0.5)])
    assert (r.outcome, r.passed) == ("wrong", False)
    assert "harness's own failure" in r.message


@pytest.mark.parametrize("prior,final,outcome", [
    ([{"outcome": "harness_error", "pass": False}], {"outcome": "match", "pass": True},
     "harness_error"),
    ([{"outcome": "harness_error", "pass": False}], {"outcome": "wrong", "pass": False}, "wrong"),
    ([{"outcome": "harness_error", "pass": False}, {"outcome": "match", "pass": True}],
     {"outcome": "wrong", "pass": False}, "nondeterministic"),
])
def test_reruns_with_an_attempt_of_ours(prior, final, outcome):
    row = combine_rows(prior, dict(final, message=""))
    assert (row["outcome"], row["pass"]) == (outcome, False)
