"""Each feature's test-only kernel fault (kernels.testonly.FEATURE_FAULTS) fails that feature's
cases of the features family and passes every case of it without the feature (issue 25).

In this process: testonly.fault_library(name) points the bundled adapter's kernels.* calls at
the test-only library with the fault active, and execute_case judges each case as a worker
would. Which cases a fault must reach is the defect's own reach, written per fault below: a
soft cap applied after the mask only leaks keys that are masked; a sink counted in the
numerator hides below a large-logits LSE; kv-head slopes equal q-head slopes without GQA;
a scale applied twice is a no-op at scale 1; the tensor-core decode runs the prefill kernel,
whose rows carry their own positions.
"""
from __future__ import annotations

import pytest

from cases import generate
from detection_helpers import keep_references
from harness.engine.execute import execute_case
from harness.model.routes import BUNDLED_ROUTES, op_of
from harness.targets import load_target
from kernels import testonly
from kernels.build import detect

pytestmark = pytest.mark.skipif(detect()[0] != "host", reason="runs the host library in this process")

FEATURE_OF = {
    "softcap_after_mask": "softcap",
    "sink_in_numerator": "sinks",
    "alibi_kv_head": "alibi",
    "fp8_scale_twice": "fp8_kv",
    "decode_rows_at_last_position": "multi_token_decode",
    "custom_mask_transposed": "custom_mask",
}


def _masks_keys(p) -> bool:
    causal_cut = p.get("causal") and any(k > 1 for k in p["kv_lens"])
    return bool(causal_cut or p.get("window_left", -1) >= 0 or p.get("custom_mask"))


def _gqa(p) -> bool:
    return p["num_qo_heads"] != p.get("num_kv_heads", p["num_qo_heads"])


# fault -> (params of cases that must fail, routes on which they must)
MUST_FAIL = {
    # At large logits the cap saturates every visible key alike, so only the LSE shows
    # the masked keys' weight: without it (a -nolse form) the defect cannot show.
    "softcap_after_mask": (lambda p: p.get("logits_soft_cap") == 2.0 and _masks_keys(p)
                           and any(p["kv_lens"])
                           and (p.get("return_lse") or p.get("values") != "large_logits"),
                           set(BUNDLED_ROUTES) - {"fa2.merge_state",
                                                                         "fa2.mixed_batch"}),
    "sink_in_numerator": (lambda p: p.get("sinks") not in (None, False)
                          and p.get("values", "normal") == "normal",
                          set(BUNDLED_ROUTES) - {"fa2.merge_state", "fa2.mixed_batch"}),
    "alibi_kv_head": (lambda p: p.get("alibi_slopes") not in (None, False) and _gqa(p)
                      and any(p["kv_lens"]),
                      set(BUNDLED_ROUTES) - {"fa2.merge_state", "fa2.mixed_batch"}),
    "fp8_scale_twice": (lambda p: bool(p.get("kv_dtype")) and p.get("k_scale", 1.0) != 1.0,
                        {r for r in BUNDLED_ROUTES if op_of(r) in ("paged_prefill", "batch_decode")}),
    "decode_rows_at_last_position": (lambda p: p.get("q_len_per_req", 1) > 1,
                                     {"fa2.batch_decode", "aiter.batch_decode",
                                      "ll4mi.batch_decode"}),
    "custom_mask_transposed": (lambda p: bool(p.get("custom_mask")),
                               {"fa2.single_prefill", "fa2.paged_prefill"}),
}


@pytest.fixture(scope="module")
def feature_cases():
    return generate(["features"])


@pytest.fixture(scope="module")
def references() -> dict:
    """Each feature case's reference, computed once for this module's runs of it
    (detection_helpers.keep_references)."""
    return {}


def _run(cases, fault, monkeypatch, references):
    monkeypatch.setenv("KERNELS_TESTONLY", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    keep_references(references, monkeypatch)
    target = load_target("bundled")
    with testonly.fault_library(fault):
        return [(c, execute_case(c, target, "cpu")) for c in cases]


def _sample_per_route(cases, per_key: int = 2) -> list:
    """The first `per_key` cases (generation order) of each route and set of features."""
    kept: dict = {}
    for c in cases:
        kept.setdefault((c.route, frozenset(c.requires)), [])
        if len(kept[(c.route, frozenset(c.requires))]) < per_key:
            kept[(c.route, frozenset(c.requires))].append(c)
    return [c for group in kept.values() for c in group]


def fault_sample(fault: str, feature_cases) -> list:
    """What a fault's test runs. Of the cases the defect reaches (the detection), the first
    two of each route and set of features: the fault is caught on every route that carries
    it, beside every other feature. Of the other cases with the feature, and of those
    without it, the first of each: they show the fault stays inside the inputs it reaches,
    on every route and beside every other feature. test_kernels_features holds each defect
    to its feature on hand-built inputs."""
    feature, (must, routes) = FEATURE_OF[fault], MUST_FAIL[fault]

    def reaches(c) -> bool:
        return c.expect == "match" and must(c.params) and c.route in routes
    with_feature = [c for c in feature_cases if feature in c.requires]
    return (_sample_per_route([c for c in with_feature if reaches(c)], 2)
            + _sample_per_route([c for c in with_feature if not reaches(c)], 1)
            + _sample_per_route([c for c in feature_cases if feature not in c.requires], 1))


def test_every_feature_fault_has_a_feature():
    assert set(FEATURE_OF) == set(testonly.FEATURE_FAULTS) == set(MUST_FAIL)


@pytest.mark.parametrize("fault", testonly.FEATURE_FAULTS)
def test_fault_fails_its_feature_and_passes_every_case_without_it(fault, feature_cases,
                                                                  monkeypatch, references):
    feature = FEATURE_OF[fault]
    must, routes = MUST_FAIL[fault]

    def reaches(c) -> bool:
        return c.expect == "match" and must(c.params) and c.route in routes
    results = _run(fault_sample(fault, feature_cases), fault, monkeypatch, references)
    with_it = [(c, r) for c, r in results if feature in c.requires]
    without = [(c, r) for c, r in results if feature not in c.requires]
    assert with_it and without
    assert {c.route for c, _ in without} == {c.route for c in feature_cases}
    # Without the feature the fault is not there: every such case (refusals too) passes.
    failing_without = [(c.id, r.outcome, r.message[:80]) for c, r in without if not r.passed]
    assert not failing_without, failing_without[:5]
    # With it, every case the defect reaches is wrong, on every route that carries it.
    reached = [(c, r) for c, r in with_it if reaches(c)]
    assert {c.route for c, _ in reached} == routes
    missed = [c.id for c, r in reached if r.passed]
    assert not missed, missed[:5]
    assert {r.outcome for c, r in reached} == {"wrong"}
    # Whatever else fails carries the feature and fails by its values.
    assert {r.outcome for c, r in with_it if not r.passed} == {"wrong"}


def test_the_faultless_test_only_library_passes_every_case_the_faults_run(
        feature_cases, monkeypatch, references):
    """The same library with no fault active, on every case the fault tests above run: the
    failures above are the faults'. (Every feature case passes on the shipped library in
    `make check`; test_kernels_features holds each defect to its feature.)"""
    sampled = {c.id: c for fault in testonly.FEATURE_FAULTS
               for c in fault_sample(fault, feature_cases)}
    assert len(sampled) < len(feature_cases)
    results = _run(list(sampled.values()), None, monkeypatch, references)
    failing = [(c.id, r.outcome, r.message[:80]) for c, r in results if not r.passed]
    assert not failing, failing[:5]


def test_a_check_child_with_the_fault_in_its_environment_fails_only_that_feature(
        tmp_path, monkeypatch, capfd, feature_cases):
    """The worker path: `harness check` children pick the fault up from the environment.

    The fault's reach on every case is the in-process test's above; here the path through
    the environment is the subject, so the child runs every custom-mask case of one route
    and two of each other set of features there (a cases file), not all of them."""
    import json
    from harness import cli
    from kernels.testonly import KERNEL_FAULT_ENV
    route = [c for c in feature_cases if c.route == "fa2.paged_prefill"]
    chosen = ([c for c in route if "custom_mask" in c.requires]
              + _sample_per_route([c for c in route if "custom_mask" not in c.requires]))
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([c.to_json() for c in chosen]))
    rows_path = tmp_path / "rows.jsonl"
    monkeypatch.delenv("KERNELS_DISABLE_GUARDS", raising=False)
    for k, v in {"KERNELS_TESTONLY": "1", KERNEL_FAULT_ENV: "custom_mask_transposed",
                 "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    capfd.readouterr()
    rc = cli.main(["check", "--cases-file", str(cases_file),
                   "--results", str(rows_path), "-n", "0", "--reruns", "0"])
    tail = "".join(capfd.readouterr())[-2000:]
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    failing = {r["case_id"] for r in rows if not r["pass"]}
    # a case carries a custom mask when its params hold one (the covering set's ids say
    # mask_random / mask_tree, not custom_mask)
    masked = {r["case_id"] for r in rows if r["expect"] == "match" and (
        json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
    ).get("custom_mask")}
    assert rc == 1, tail
    assert failing == masked and masked, (sorted(failing - masked)[:3], sorted(masked - failing)[:3])
    assert sorted(r["case_id"] for r in rows) == sorted(c.id for c in chosen)
    assert len(rows) > len(masked)      # cases without a mask ran and passed beside them
