"""classify: every outcome, from small Case records and hand-made comparisons."""
import signal

import pytest

from harness.model.case import Case
from harness.model.classify import OUTCOMES, classify, crash_verdict, hang_verdict, severity
from harness.model.compare import Comparison

P = {"head_dim": 8, "num_qo_heads": 2, "qo_lens": [1], "kv_lens": [1]}


def case(expect="match", words=(), **params):
    return Case("fa2.single_prefill", "fake", f"v_{expect}", {**P, **params}, expect=expect,
                refuse_words=words)


OK = Comparison(True, 1e-3, 0, 16, None)
BAD = Comparison(False, 0.75, 3, 16, (2, 1, 0))
ERR = ValueError("head_dim: planned 128, given 64")

# (id, case, classify kwargs, outcome, passed, words in message)
CASES = [
    ("match", case(), {"comparisons": [("o", OK)]}, "match", True, []),
    ("match_no_comparisons", case(), {}, "match", True, []),
    ("wrong", case(), {"comparisons": [("o", OK), ("lse", BAD)]}, "wrong", False,
     ["max|diff| 0.75", "3/32 wrong", "first at lse(2, 1, 0)"]),
    ("wrong_bare_comparison", case(), {"comparisons": [BAD]}, "wrong", False, ["o(2, 1, 0)"]),
    ("refused", case("refuse", ("head_dim",)), {"error": ERR}, "refused", True, ["ValueError", "planned 128"]),
    ("refused_words_case_insensitive", case("refuse", ("HEAD_DIM", "planned")), {"error": ERR},
     "refused", True, []),
    ("refused_missing_word", case("refuse", ("page_size",)), {"error": ERR}, "refused", False,
     ["'page_size'"]),
    # Whole words only: a substring of another word, or a digit inside a number, is not a name.
    ("refused_word_inside_another", case("refuse", ("q",)),
     {"error": ValueError("q_stride must be 1; seq too short")}, "refused", False, ["'q'"]),
    ("refused_lse_inside_false", case("refuse", ("lse",)),
     {"error": ValueError("contiguous is false")}, "refused", False, ["'lse'"]),
    ("refused_digit_inside_number", case("refuse", ("head_dim", "4")), {"error": ERR},
     "refused", False, ["'4'"]),
    ("refused_alternative_names", case("refuse", ("kv_cache|k_cache",)),
     {"error": ValueError("k_cache has stride 2")}, "refused", True, []),
    ("refused_or_match", case("match_or_refuse"), {"error": RuntimeError("no")}, "refused", True,
     ["RuntimeError"]),
    ("unexpected_refusal", case(), {"error": ERR}, "unexpected_refusal", False, ["ValueError"]),
    ("silent_no_reference", case("refuse", ("num_kv_heads",)), {}, "silent", False,
     ["must be refused"]),
    # A must-refuse case has no defined answer: running is `silent`, its values only noted.
    ("refuse_case_run_wrong", case("refuse"), {"comparisons": [("o", BAD)]}, "silent", False,
     ["must be refused", "3/16 wrong"]),
    ("refuse_case_run_right", case("refuse"), {"comparisons": [("o", OK)]}, "silent", False,
     ["must be refused", "values match"]),
    ("match_or_refuse_wrong", case("match_or_refuse"), {"comparisons": [("o", BAD)]}, "wrong",
     False, ["3/16 wrong"]),
    ("match_or_refuse_right", case("match_or_refuse"), {"comparisons": [("o", OK)]}, "match",
     True, []),
    ("corrupt_beats_match", case(), {"comparisons": [("o", OK)], "corruption": ["input k changed"]},
     "corrupt", False, ["input k changed"]),
    ("corrupt_beats_refusal", case("refuse"), {"error": ERR, "corruption": ["canary after o: 1"]},
     "corrupt", False, ["canary after o"]),
    ("skipped", case(), {"skip_reason": "route has no HND layout"}, "skipped", True, ["HND"]),
    ("skipped_beats_everything", case("refuse"), {"skip_reason": "x", "corruption": ["y"]},
     "skipped", True, []),
]


@pytest.mark.parametrize("c,kwargs,outcome,passed,words",
                         [row[1:] for row in CASES], ids=[row[0] for row in CASES])
def test_classify(c, kwargs, outcome, passed, words):
    v = classify(c, **kwargs)
    assert (v.outcome, v.passed) == (outcome, passed), v
    assert v.outcome in OUTCOMES
    for w in words:
        assert w in v.message


@pytest.mark.parametrize("how,text", [(-signal.SIGSEGV, "SIGSEGV"), (signal.SIGFPE, "SIGFPE"),
                                      ("SIGABRT", "SIGABRT"), (3, "exit 3")], ids=str)
def test_crash_verdict(how, text):
    v = crash_verdict(case(), how, "run")
    assert (v.outcome, v.passed) == ("crash", False)
    assert text in v.message and "during run" in v.message


def test_hang_verdict_never_passes():
    v = hang_verdict(case("match_or_refuse"), 30, "plan")
    assert (v.outcome, v.passed, v.message) == ("hang", False, "no result after 30 s during plan")


@pytest.mark.parametrize("outcome,passed,expected", [
    ("match", True, ""), ("refused", True, ""), ("skipped", True, ""),
    ("wrong", False, "correctness"), ("silent", False, "correctness"),
    ("corrupt", False, "correctness"), ("crash", False, "correctness"),
    ("hang", False, "correctness"), ("nondeterministic", False, "correctness"),
    ("unexpected_refusal", False, "capability"), ("refused", False, "clarity"),
    ("harness_error", False, "harness")])
def test_severity(outcome, passed, expected):
    assert severity(outcome, passed) == expected


def test_a_crash_under_mps_says_it_may_be_another_workers_fault(tmp_path, monkeypatch):
    import os
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert "MPS" not in crash_verdict(case(), -8, "run").message     # no control pipe there
    os.mkfifo(tmp_path / "control")
    v = crash_verdict(case(), -8, "run")
    assert v.outcome == "crash" and not v.passed
    assert v.message.startswith("worker died: SIGFPE during run; the GPU was shared through "
                                f"NVIDIA MPS ({tmp_path})")


# A status prefix a library's messages carry (Target.message_prefix): not part of the reason.
STATUS_PREFIX = r"\[\w+Error\] : \d+ : \w+ "


def test_a_value_in_a_declared_prefix_is_not_the_reasons():
    c = case("refuse", ("num_kv_heads", "1"))
    error = RuntimeError("[LibError] : 1 : FAIL num_kv_heads does not divide num_qo_heads")
    v = classify(c, error=error, message_prefix=STATUS_PREFIX)
    assert (v.outcome, v.passed) == ("refused", False), v
    assert "'1'" in v.message and "in its reason" in v.message
    # The whole message is still on the row, prefix included.
    assert "[LibError] : 1 : FAIL" in v.message
    # Without a declared prefix the same text passes: the prefix is what made the difference.
    assert classify(c, error=error).passed
    # A reason that states the value passes with the prefix declared.
    said = RuntimeError("[LibError] : 1 : FAIL num_kv_heads 1 does not divide num_qo_heads 3")
    assert classify(c, error=said, message_prefix=STATUS_PREFIX).passed


def test_a_prefix_that_does_not_match_leaves_the_message_whole():
    c = case("refuse", ("head_dim", "128"))
    v = classify(c, error=ValueError("head_dim: planned 128, given 64"),
                 message_prefix=STATUS_PREFIX)
    assert v.passed, v


def _bare_assert_error():
    from harness.targets.flaggems import LibraryAssertionError

    class Out:
        def stride(self, dim):
            return 2

    # Compiled here, not in this module: pytest rewrites a test module's asserts.
    import linecache
    source = "def library_call(out):\n    assert out.stride(-1) == 1\n"
    linecache.cache["library_ops.py"] = (len(source), None, source.splitlines(True),
                                         "library_ops.py")   # as if read from its file
    scope: dict = {}
    exec(compile(source, "library_ops.py", "exec"), scope)
    try:
        scope["library_call"](Out())
    except AssertionError as error:
        return LibraryAssertionError.from_assert(error)
    raise AssertionError("the bare assert did not fire")


def test_a_bare_assert_fails_clarity_its_quoted_line_is_context_only():
    error = _bare_assert_error()
    # The adapter quotes the statement, which names `out` and `1`: shown, never judged.
    assert "out.stride(-1) == 1" in getattr(error, "adapter_context")
    assert "out" not in str(error)
    v = classify(case("refuse", ("out", "1")), error=error)
    assert (v.outcome, v.passed) == ("refused", False), v
    assert "'out', '1'" in v.message
    assert "adapter context, not the library's words: `assert out.stride(-1) == 1`" in v.message
    assert "at library_ops.py:2" in v.message


def test_a_long_message_keeps_its_reason():
    # A prefix and a C++ signature of ~2,500 characters, then the reason: the row keeps it.
    long = "RuntimeError in " + "void kernel<" + "int, " * 500 + "> : q_stride must be 1"
    c = case("refuse", ("q",))
    v = classify(c, error=RuntimeError(long + ", q has stride 2"))
    assert v.passed and v.message.endswith("q has stride 2"), v.message[-80:]
    v = classify(case(), error=RuntimeError(long + ", q has stride 2"))
    assert v.outcome == "unexpected_refusal" and v.message.endswith("q has stride 2")
