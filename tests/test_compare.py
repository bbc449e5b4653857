"""compare: per-dtype tolerances, NaN handling, first bad index."""
import math

import pytest
import torch

from harness.compare import TOLERANCES, compare, summarize

TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _exp(n=4096, scale=1.0):
    return (torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * scale)


@pytest.mark.parametrize("name", sorted(TOLERANCES))
@pytest.mark.parametrize("scale", [0.01, 1.0, 100.0], ids=lambda s: f"x{s:g}")
def test_one_ulp_rounding_is_accepted(name, scale):
    exp = _exp(scale=scale)
    got = exp.to(TORCH[name])
    assert compare(got, exp, name).ok                  # correctly rounded: half an ulp
    # One ulp off a representable expectation, both directions.
    for toward in (math.inf, -math.inf):
        off = torch.nextafter(got, torch.full_like(got, toward))
        c = compare(off, got.double(), name)
        assert c.ok, c


def test_two_percent_error_in_bf16_is_rejected():
    exp = _exp(scale=4.0)
    got = (exp * 1.02).to(torch.bfloat16)
    big = exp.abs() > 1.2      # where 2% exceeds atol + rtol|x|
    c = compare(got, exp, "bf16")
    assert not c.ok and c.n_wrong >= int(big.sum()) * 0.9
    assert c.max_abs_diff == pytest.approx(float((got.double() - exp).abs().max()))


def test_nan_counts_wrong_and_max_diff_is_inf():
    exp = torch.zeros(3, 4, 5, dtype=torch.float64)
    got = exp.clone().float()
    got[1, 2, 3] = math.nan
    got[2, 0, 0] = 5.0
    c = compare(got, exp, "fp32")
    assert (c.ok, c.n_wrong, c.n_total, c.first_bad_index) == (False, 2, 60, (1, 2, 3))
    assert c.max_abs_diff == math.inf


def test_first_bad_index_is_row_major_first():
    exp = torch.ones(4, 3, 2, dtype=torch.float64)
    got = exp.clone()
    got[3, 0, 1] += 1
    got[2, 2, 0] += 1
    c = compare(got, exp, "fp16")
    assert c.first_bad_index == (2, 2, 0) and c.n_wrong == 2 and c.max_abs_diff == 1.0


def test_minus_inf_lse_must_be_met():
    exp = torch.tensor([[-math.inf, 0.5]], dtype=torch.float64)
    assert compare(torch.tensor([[-math.inf, 0.5]]), exp, "fp32").ok
    c = compare(torch.tensor([[-1e30, 0.5]]), exp, "fp32")
    assert (c.ok, c.first_bad_index, c.max_abs_diff) == (False, (0, 0), math.inf)
    assert not compare(torch.tensor([[math.nan, 0.5]]), exp, "fp32").ok
    assert not compare(torch.tensor([[-math.inf, 0.5]]), torch.tensor([[0.0, 0.5]]), "fp32").ok


def test_shape_mismatch_is_all_wrong():
    c = compare(torch.zeros(2, 3), torch.zeros(3, 2), "bf16")
    assert (c.ok, c.n_wrong, c.n_total) == (False, 6, 6) and "shape" in c.message


def test_summarize_names_the_first_failing_output():
    exp = torch.zeros(2, 2, dtype=torch.float64)
    bad = exp.clone()
    bad[1, 0] = 0.5
    s = summarize([("o", compare(exp, exp, "bf16")), ("lse", compare(bad, exp, "bf16"))])
    assert (s.ok, s.n_wrong, s.n_total, s.first_bad_index) == (False, 1, 8, ("lse", 1, 0))
    assert s.message == "max|diff| 0.5, 1/8 wrong, first at lse(1, 0)"
