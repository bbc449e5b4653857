"""Case sizes from params alone: the estimate a ceiling is judged by, and absurd sizes refused."""
from __future__ import annotations

import pytest

from harness.model import budget


def _params(**kw):
    base = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 8, "qo_lens": [1], "kv_lens": [1024]}
    base.update(kw)
    return base


def test_the_estimate_grows_with_the_context_and_the_dtype():
    def grows(params):      # past what every case costs (small tensors, the allocator's slack)
        return budget.case_bytes_estimate(params, "single_decode") - budget.FIXED_BYTES
    small = grows(_params())
    assert grows(_params(kv_lens=[2048])) > 1.9 * small
    assert grows(_params(dtype="fp32")) > small
    # At least the inputs in their own dtype: k and v of 1024 tokens x 8 heads x 128.
    assert small >= 2 * 1024 * 8 * 128 * 2


def test_a_case_over_the_ceiling_names_the_estimate_and_the_ceiling():
    params = _params(kv_lens=[1 << 20])
    estimate = budget.case_bytes_estimate(params)
    message = budget.over_ceiling(params, estimate - 1)
    assert f"{estimate:,}" in message and f"{estimate - 1:,}" in message
    assert budget.over_ceiling(params, estimate) is None
    assert budget.over_ceiling(params, None) is None


@pytest.mark.parametrize("params,words", [
    (_params(kv_lens=[-1]), ["kv_lens", "[0]", "0 or more"]),
    (_params(qo_lens=[1 << 31]), ["qo_lens", "2^31"]),
    (_params(kv_lens=[1 << 30, 1 << 30]), ["kv_lens", "sums"]),
    (_params(head_dim=-8), ["head_dim", "0 or more"]),
    (_params(num_qo_heads=2.5), ["num_qo_heads", "whole number"]),
    (_params(kv_lens="1024"), ["kv_lens", "list"]),
    (_params(window_left=float("nan")), ["window_left", "finite"]),
])
def test_absurd_sizes_are_refused_naming_case_and_field(params, words):
    case = {"route": "a.b", "family": "f", "variant": "v", "params": params}
    with pytest.raises(budget.CasesFileError) as err:
        budget.check_cases([case], "c.json")
    assert str(err.value).startswith("c.json: case 0: ")
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_sane_case_passes():
    budget.check_cases([{"route": "a.b", "family": "f", "variant": "v", "params": _params()}],
                       "c.json")


# ---- the estimate counts everything a case allocates ----------------------------------------

def _resident(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def peak_bytes(run) -> int:
    """Resident bytes `run()` added at its peak: the kernel's high-water mark, reset first
    (Linux: /proc/self/clear_refs), over what was resident before."""
    import ctypes
    import gc
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _resident("VmRSS")
    run()
    return _resident("VmHWM") - before


def _bundled_row(case, monkeypatch, ceiling: int):
    from harness.engine.perform import perform, row_context
    from harness.targets import load_target
    monkeypatch.setenv(budget.CEILING_ENV, str(ceiling))
    target = load_target("bundled")
    return perform(case, target, 1, row_context(target))


PREFILL_16K = dict(dtype="bf16", head_dim=8, num_qo_heads=1, num_kv_heads=1,
                   qo_lens=[16384], kv_lens=[16384], causal=True)


def test_a_16k_by_16k_prefill_counts_its_masks_and_logits():
    """Its q, k and v are ~1 MB; the reference's [qo, kv] masks and logits blocks ~1 GB."""
    parts = budget.case_bytes_parts(PREFILL_16K)
    assert parts["inputs"] < 4 << 20
    assert parts["masks"] >= 2 * 16384 * 16384 and parts["logits"] >= 6 * (1 << 24) * 8
    assert budget.case_bytes_estimate(PREFILL_16K, "single_prefill") > 1 << 30


def test_a_16k_by_16k_prefill_under_a_100_mb_ceiling_is_skipped_before_allocation(monkeypatch):
    from harness.engine import execute
    from harness.model.case import Case
    case = Case(route="fa2.single_prefill", family="scale", variant="prefill_16k",
                params=PREFILL_16K, tag="bf16-d8-h1x1-q16k-k16k")

    def never(*a, **k):
        raise AssertionError("the problem was built: the ceiling came after an allocation")
    monkeypatch.setattr(execute, "build_problem", never)
    rows = []
    peak = peak_bytes(lambda: rows.append(_bundled_row(case, monkeypatch, 100_000_000)))
    row = rows[0]
    assert row["outcome"] == "skipped" and row["pass"], row
    assert "100,000,000" in row["message"] and "--max-case-bytes" in row["message"]
    assert peak < 64 << 20, f"skipping it made {peak:,} bytes resident"


def test_a_huge_page_is_estimated_above_its_real_need(monkeypatch):
    """page_size 2^23: a pool of one page, ~256 MB a pool past FULL_POISON_ELEMS, touched
    whole (it is the page the request owns), and its snapshot. Run for real: the estimate is
    at least the measured peak, and within a sane factor of it."""
    from harness.model.case import Case
    params = dict(dtype="bf16", head_dim=16, num_qo_heads=1, num_kv_heads=1, qo_lens=[1],
                  kv_lens=[13], page_size=1 << 23)
    case = Case(route="fa2.batch_decode", family="scale", variant="page_2_23", params=params,
                tag="bf16-d16-h1x1-k13-p8m")
    estimate = budget.case_bytes_estimate(params, "batch_decode")
    rows = []
    peak = peak_bytes(lambda: rows.append(_bundled_row(case, monkeypatch, 1 << 40)))
    assert rows[0]["outcome"] == "match", rows[0]["message"]
    assert peak > 2 * (1 << 23) * 16 * 2, f"the pools were not resident ({peak:,} bytes)"
    assert peak <= estimate <= 4 * peak, (peak, estimate)


LARGEST_CI = [
    "fa2.single_decode/scale.long_kv/fp16-d128-h8x1-b1-k8k-lse",
    "fa2.batch_decode/valid.page_ids_past_64k/fp32-d128-h4x1-p1-b2",
    "fa2.ragged_prefill/scale.long_kv/bf16-d64-h4x4-b2-k5k-lse",
]


@pytest.fixture(scope="module")
def largest_ci_cases():
    """The cases above by id, from the bundled target's ci profile: only their families are
    generated (an id is route/family.variant/tag), once for the module, not every profile's
    cases once per id (session.all_cases: a second each)."""
    from harness.targets import load_target
    families = sorted({i.split("/")[1].split(".")[0] for i in LARGEST_CI})
    return {c.id: c for c in load_target("bundled").cases(families, "ci") if c.id in LARGEST_CI}


@pytest.mark.parametrize("case_id", LARGEST_CI)
def test_the_largest_ci_cases_peak_below_their_estimate(monkeypatch, case_id, largest_ci_cases):
    case = largest_ci_cases[case_id]
    estimate = budget.case_bytes_estimate(dict(case.params), case.op)
    rows = []
    peak = peak_bytes(lambda: rows.append(_bundled_row(case, monkeypatch, 1 << 40)))
    assert rows[0]["outcome"] == "match", rows[0]["message"]
    assert peak <= estimate <= 8 * max(peak, 16 << 20), (peak, estimate)


def test_without_an_op_the_estimate_counts_a_paged_cache_and_a_workspace():
    params = _params(page_size=1 << 12, kv_lens=[5000])
    assert budget.case_bytes_estimate(params) >= budget.case_bytes_estimate(params, "batch_decode")
    assert budget.case_bytes_estimate(params, "batch_decode") > \
        budget.case_bytes_estimate(params, "single_decode")
    assert budget.op_bytes("ragged_prefill", params)["pages"] == 0
    assert budget.op_bytes("ragged_prefill", params)["workspace"] == budget.WORKSPACE_BYTES


def test_page_id_offset_counts_the_pages_below_it_while_they_are_filled():
    """Pages below page_id_offset are NaN-filled, and so resident, while the pool is at most
    FULL_POISON_ELEMS; past it only the pages around the owned ones are touched."""
    small = budget.page_pool_bytes(_params(page_size=16, kv_lens=[40]))
    far = budget.page_pool_bytes(_params(page_size=16, kv_lens=[40], page_id_offset=1 << 8))
    assert far >= small + 2 * 2 * (1 << 8) * 16 * 8 * 128 * 2       # k and v, snapshots
    past = budget.page_pool_bytes(_params(page_size=16, kv_lens=[40], page_id_offset=1 << 16))
    assert past < far
