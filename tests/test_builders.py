"""Builders: views equal to their input, poison where a stride-blind kernel reads."""
import pytest
import torch

from harness.model.builders import (INT_POISON, Buffers, canary_pattern, every_other, fingerprint,
                              fingerprints, head_sliced, strided_last_dim)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _t(dtype=torch.float32, shape=(5, 3, 8)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("step", [2, 3])
def test_strided_last_dim_equals_t_and_hides_nan(dtype, step):
    t = _t(dtype)
    s = strided_last_dim(t, step)
    assert torch.equal(s, t) and s.stride(-1) == step
    # What a kernel reading the storage as packed would see: every skipped slot is NaN.
    packed = s.as_strided((t.numel() * step,), (1,), s.storage_offset())
    seen = packed.view(*t.shape[:-1], t.shape[-1] * step)
    assert torch.isnan(seen[..., 1::step]).all() if step == 2 else torch.isnan(seen[..., 1]).all()
    assert torch.isnan(packed).sum() == t.numel() * (step - 1)


def test_every_other_rows_interleave_poison():
    t = _t()
    e = every_other(t)
    assert torch.equal(e, t) and not e.is_contiguous() and e.stride(0) == 2 * t.stride(0)
    assert torch.isnan(e.as_strided(t.shape, e.stride(), e.storage_offset() + t.stride(0))).all()
    idx = torch.arange(6, dtype=torch.int32)
    ei = every_other(idx)
    assert torch.equal(ei, idx)
    assert (ei.as_strided((6,), (2,), 1) == INT_POISON).all()


def test_head_sliced_keeps_last_dim_packed():
    t = _t()
    h = head_sliced(t, extra_heads=2)
    assert torch.equal(h, t)
    assert h.stride() == ((3 + 2) * 8, 8, 1)
    assert torch.isnan(h.as_strided((5, 2, 8), h.stride(), 3 * 8)).all()


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=str)
def test_canary_pattern_is_never_nan_inf_or_zero(dtype):
    p = canary_pattern(4096, dtype)
    assert torch.isfinite(p).all() and (p != 0).all()
    assert len(set(p.view(torch.int16 if p.element_size() == 2 else torch.int32
                          if p.element_size() == 4 else torch.int64).tolist())) > 1000


def test_output_is_nan_poisoned_and_clean_buffers_check_clean():
    b = Buffers("cpu")
    o = b.output((4, 2, 8), torch.bfloat16, "out")
    assert o.shape == (4, 2, 8) and o.is_contiguous() and torch.isnan(o).all()
    i = b.output((7,), torch.int32, "idx")
    assert (i == INT_POISON).all()
    o.fill_(1.0)
    i.fill_(0)
    assert b.check() == []


def _base(view):
    return view.as_strided((view.numel() + 2 * 512,), (1,), view.storage_offset() - 512)


@pytest.mark.parametrize("dtype", DTYPES + [torch.int32], ids=str)
def test_canary_catches_one_element_past_the_end(dtype):
    b = Buffers("cpu")
    o = b.output((3, 5), dtype, "out")
    _base(o)[512 + o.numel()] = 0       # the element just after the last one
    assert b.check() == ["canary after out: 1 elements changed, first at +0"]


def test_canary_catches_one_element_before_the_start():
    b = Buffers("cpu")
    o = b.output((3, 5), torch.float16, "lse")
    _base(o)[511] = 0
    assert b.check() == ["canary before lse: 1 elements changed, first at -1"]


def test_whole_band_overwrite_is_counted():
    b = Buffers("cpu")
    o = b.output((4,), torch.float32, "out", canary_elems=64)
    o.as_strided((64,), (1,), o.storage_offset() + 4).fill_(float("nan"))
    assert b.check() == ["canary after out: 64 elements changed, first at +0"]


def test_place_copies_into_a_banded_allocation():
    b = Buffers("cpu")
    src = _t()
    p = b.place(src, "partial_state")
    assert torch.equal(p, src) and p.data_ptr() != src.data_ptr()
    p.mul_(2)                            # the library may write its own buffer
    assert b.check() == []
    _base(p)[512 + p.numel() + 3] = 1.0
    assert b.check() == ["canary after partial_state: 1 elements changed, first at +3"]


def test_fingerprint_catches_one_bit_and_poison_changes():
    b = Buffers("cpu")
    k = strided_last_dim(_t(torch.bfloat16))
    fp = b.watch(k, "k")
    assert fp == fingerprint(k)
    k[2, 1, 3] = (k[2, 1, 3].view(torch.int16) ^ 1).view(torch.bfloat16)   # one bit
    assert b.check() == ["input k changed"]

    b2 = Buffers("cpu")
    k2 = strided_last_dim(_t())
    b2.watch(k2, "k")
    k2.as_strided((1,), (1,), k2.storage_offset() + 1).fill_(0.0)   # a hidden slot
    assert b2.check() == ["input k changed"]


def test_stage_log_calls_back():
    seen = []
    b = Buffers("cpu", on_stage=seen.append)
    b.stage("plan")
    b.stage("run")
    assert seen == ["plan", "run"] and b.current_stage == "run"


def test_a_large_input_is_snapshotted_and_a_one_bit_change_is_caught(monkeypatch):
    import harness.model.builders as b
    monkeypatch.setattr(b, "SNAPSHOT_ELEMS", 16)
    bufs = b.Buffers(torch.device("cpu"))
    big = torch.full((8, 4), float("nan"), dtype=torch.bfloat16)
    assert bufs.watch(big, "k_cache") == "snapshot"
    assert bufs.check() == []            # NaN compares by its bits: unchanged is unchanged
    big.view(torch.int16)[5, 2] ^= 1     # one bit of one element
    assert bufs.check() == ["input k_cache changed"]


def test_a_huge_page_pool_is_poisoned_around_the_owned_pages(monkeypatch):
    import harness.targets.layout as layout
    from harness.model.problem import build_problem
    monkeypatch.setattr(layout, "FULL_POISON_ELEMS", 1)
    p = build_problem({"dtype": "fp16", "head_dim": 8, "num_qo_heads": 1, "qo_lens": [1],
                       "kv_lens": [20]}, 1)
    paged = layout.build_paged(p, 16, "NHD", "sequential", offset=50)
    k = paged.k_pages
    owned = paged.indices
    assert owned == [50, 51]
    # The owned pages hold the request's keys (the tail slots NaN); their neighbours are NaN.
    assert torch.equal(k[50].float(), p.k[0][:16].float())
    assert torch.isnan(k[51, 4:].float()).all()
    for page in (0, 1, 48, 49):
        assert torch.isnan(k[page].float()).all(), page


def test_one_read_back_fingerprints_each_tensor_as_alone():
    tensors = [torch.randn(5, 3), strided_last_dim(torch.randn(4, 6).to(torch.bfloat16)),
               every_other(torch.arange(10, dtype=torch.int32)), torch.ones(3, dtype=torch.bool),
               torch.randn(2, 3)[:, 1], torch.empty(0, 4), head_sliced(torch.randn(3, 2, 4))]
    assert fingerprints(tensors) == [fingerprint(t) for t in tensors]
    # Each is told apart: one changed element (in a gap a strided view can reach too) changes
    # only its own fingerprint.
    before = fingerprints(tensors)
    tensors[1]._base.view(torch.int16)[0, 1] += 1     # a poison slot between two elements
    after = fingerprints(tensors)
    assert [a != b for a, b in zip(before, after)] == [False, True, False, False, False, False,
                                                       False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fingerprints_of_cpu_and_gpu_tensors_together():
    # A batch route watches its plan's CPU index tensors beside the device inputs.
    tensors = [torch.randn(5, 3, device="cuda"), torch.arange(7, dtype=torch.int32),
               every_other(torch.arange(10, dtype=torch.int32, device="cuda")), torch.randn(2)]
    assert fingerprints(tensors) == [fingerprint(t) for t in tensors]
