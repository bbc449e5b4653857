"""compare: a given tolerance applied elementwise, NaN handling, first bad index, relative error."""
import math

import pytest
import torch

from harness.model.compare import compare, summarize


def test_tolerance_is_inclusive_and_counts_each_element():
    exp = torch.zeros(10, dtype=torch.float64)
    got = exp.clone()
    got[3], got[7] = 0.01, 0.0100001
    c = compare(got, exp, 0.01)
    assert (c.ok, c.n_wrong, c.first_bad_index) == (False, 1, (7,))
    assert c.tolerance == 0.01 and c.error_ratio == pytest.approx(1.00001)
    assert compare(got, exp, 0.02).ok


def test_nan_counts_wrong_and_max_diff_is_inf():
    exp = torch.zeros(3, 4, 5, dtype=torch.float64)
    got = exp.clone().float()
    got[1, 2, 3] = math.nan
    got[2, 0, 0] = 5.0
    c = compare(got, exp, 1e-3)
    assert (c.ok, c.n_wrong, c.n_total, c.first_bad_index) == (False, 2, 60, (1, 2, 3))
    assert c.max_abs_diff == math.inf
    # NaN never passes, whatever the tolerance.
    assert not compare(got, exp, 1e30).ok


def test_first_bad_index_is_row_major_first():
    exp = torch.ones(4, 3, 2, dtype=torch.float64)
    got = exp.clone()
    got[3, 0, 1] += 1
    got[2, 2, 0] += 1
    c = compare(got, exp, 1e-3)
    assert c.first_bad_index == (2, 2, 0) and c.n_wrong == 2 and c.max_abs_diff == 1.0


def test_minus_inf_lse_must_be_met():
    exp = torch.tensor([[-math.inf, 0.5]], dtype=torch.float64)
    assert compare(torch.tensor([[-math.inf, 0.5]]), exp, 1e-3).ok
    c = compare(torch.tensor([[-1e30, 0.5]]), exp, 1e-3)
    assert (c.ok, c.first_bad_index, c.max_abs_diff) == (False, (0, 0), math.inf)
    assert not compare(torch.tensor([[math.nan, 0.5]]), exp, 1e-3).ok
    assert not compare(torch.tensor([[-math.inf, 0.5]]), torch.tensor([[0.0, 0.5]]), 1e-3).ok


def test_shape_mismatch_is_all_wrong():
    c = compare(torch.zeros(2, 3), torch.zeros(3, 2), 1e-3)
    assert (c.ok, c.n_wrong, c.n_total) == (False, 6, 6) and "shape" in c.message


def test_relative_error_is_the_whole_tensor_norm_ratio():
    exp = torch.tensor([3.0, 4.0], dtype=torch.float64)
    got = torch.tensor([3.0, 4.5])
    assert compare(got, exp, 1.0).rel_error == pytest.approx(0.5 / 5.0)


def test_negative_or_nan_tolerance_is_a_harness_error():
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="tol"):
            compare(torch.zeros(1), torch.zeros(1), bad)


def test_summarize_names_the_first_failing_output():
    exp = torch.zeros(2, 2, dtype=torch.float64)
    bad = exp.clone()
    bad[1, 0] = 0.5
    s = summarize([("o", compare(exp, exp, 0.01)), ("lse", compare(bad, exp, 0.001))])
    assert (s.ok, s.n_wrong, s.n_total, s.first_bad_index) == (False, 1, 8, ("lse", 1, 0))
    assert s.message == "lse max|diff| 0.5 > tol 0.001, 1/8 wrong, first at lse(1, 0)"
    assert s.tolerance == 0.01 and s.error_ratio == pytest.approx(500.0)


def test_summarize_keeps_each_outputs_own_numbers():
    exp = torch.zeros(8, dtype=torch.float64)
    o_got, lse_got = exp.clone(), exp.clone()
    o_got[0], lse_got[1] = 0.01, 6.6
    s = summarize([("o", compare(o_got, exp, 0.05)), ("lse", compare(lse_got, exp, 0.001))])
    assert s.max_abs_diff == pytest.approx(6.6) and s.tolerance == 0.05   # the old columns
    assert (s.o_max_abs_diff, s.o_tolerance) == (pytest.approx(0.01), 0.05)
    assert s.o_error_ratio == pytest.approx(0.2)
    assert (s.lse_max_abs_diff, s.lse_tolerance) == (pytest.approx(6.6), 0.001)
    assert s.lse_error_ratio == pytest.approx(6600)
    only_o = summarize([("o", compare(o_got, exp, 0.05))])
    assert only_o.lse_max_abs_diff is None and only_o.lse_tolerance is None
    assert only_o.lse_error_ratio is None and only_o.o_error_ratio == pytest.approx(0.2)
