"""draws.normal_draws (device-independent draws) and build_problem's two paths: randn on
the CPU up to DEVICE_DRAW_ELEMENTS, normal_draws on the problem's device above it."""
from __future__ import annotations

import math

import pytest
import torch

from harness.model import draws, problem
from harness.model.draws import normal_draws
from harness.model.problem import EMIN, build_problem, large_logit_offset

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

# q 16 x 8 x 128 + k, v 8192 x 2 x 128 each: 2^22 + 2^14 elements, just over the threshold.
LARGE = {"dtype": "bf16", "head_dim": 128, "num_qo_heads": 8, "num_kv_heads": 2,
         "qo_lens": [16], "kv_lens": [8192], "values": "large_logits"}
SMALL = {"dtype": "fp32", "head_dim": 8, "num_qo_heads": 4, "num_kv_heads": 2,
         "qo_lens": [3, 1], "kv_lens": [5, 7]}


def _elements(p: dict) -> int:
    d, dv = p["head_dim"], p.get("head_dim_vo") or p["head_dim"]
    return sum(lq * p["num_qo_heads"] * d + lk * p["num_kv_heads"] * (d + dv)
               for lq, lk in zip(p["qo_lens"], p["kv_lens"]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.float32: torch.int32}.get(t.dtype, torch.int16))


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(_bits(x.cpu()), _bits(y.cpu()))
                                    for x, y in zip(a, b))


def _same_problem(a, b) -> bool:
    return _same(a.q, b.q) and _same(a.k, b.k) and _same(a.v, b.v)


# ---------------------------------------------------------------- normal_draws

def test_same_arguments_give_the_same_bits():
    a, b = normal_draws(5, 1, 10_000), normal_draws(5, 1, 10_000)
    assert a.dtype == torch.float32 and a.shape == (10_000,)
    assert torch.equal(_bits(a), _bits(b))
    assert normal_draws(5, 1, 0).shape == (0,)


def test_chunking_and_length_never_change_a_value(monkeypatch):
    whole = normal_draws(9, 4, 5003)
    monkeypatch.setattr(draws, "CHUNK", 1000)
    monkeypatch.setattr(draws, "CPU_CHUNK", 1000)
    assert torch.equal(_bits(normal_draws(9, 4, 5003)), _bits(whole))
    for m in (1, 999, 1000, 1001, 2500):      # prefixes across chunk boundaries
        assert torch.equal(_bits(normal_draws(9, 4, m)), _bits(whole[:m]))


@pytest.mark.parametrize("a, b", [((0, 0), (0, 1)), ((0, 0), (1, 0)), ((7, 3), (3, 7)),
                                  ((2**31 - 1, 5), (2**31 - 2, 5)), ((1, 2), (1, 5))])
def test_different_seeds_and_streams_are_unrelated(a, b):
    n = 1 << 16
    x, y = normal_draws(*a, n).double(), normal_draws(*b, n).double()
    assert float((x == y).double().mean()) < 0.002              # ~1e-4 by chance
    assert abs(float((x * y).mean())) < 0.02                     # 5 sigma of 1/256
    # Not the same sequence shifted: no run of 3 consecutive values in common.
    runs = set(zip(x[:-2].tolist(), x[1:-1].tolist(), x[2:].tolist()))
    assert not runs & set(zip(y[:-2].tolist(), y[1:-1].tolist(), y[2:].tolist()))


def _irwin_hall_cdf(z: float, n: int = 4) -> float:
    """P(standardized sum of n U(0, 1) <= z), from the textbook formula."""
    x = n / 2 + z * math.sqrt(n / 12)
    return sum((-1) ** k * math.comb(n, k) * (x - k) ** n for k in range(int(x) + 1)) / math.factorial(n)


def test_moments_bound_and_shape():
    x = normal_draws(123, 0, 1 << 20).double()
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
    assert abs(float((x ** 3).mean())) < 0.02                    # symmetric
    # Excess kurtosis of a sum of 4 uniforms is -1.2 / 4: a sum of 4, not 1 or many.
    assert abs(float((x ** 4).mean()) - 2.7) < 0.05
    assert 3.0 < float(x.abs().max()) <= 3.47
    for z in (-3.0, -2.0, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, 2.5):
        frac = float((x <= z).double().mean())
        assert abs(frac - _irwin_hall_cdf(z)) < 0.003, z
        assert abs(frac - 0.5 * math.erfc(-z / math.sqrt(2))) < 0.02, z   # and normal-ish
    # Neighbours, and elements a head apart, are uncorrelated.
    for lag in (1, 2, 128):
        assert abs(float((x[lag:] * x[:-lag]).mean())) < 0.005, lag


def test_values_are_not_on_a_coarse_lattice():
    x = normal_draws(3, 9, 1 << 16)
    assert torch.unique(x).numel() > 8000


def test_bad_lengths_are_refused():
    for n in (-1, 1.5, True, (1 << 32) + 1):
        with pytest.raises(ValueError):
            normal_draws(0, 0, n)


# ---------------------------------------------------------------- build_problem's paths

def _stream(seed: int, stream: int, t: torch.Tensor) -> torch.Tensor:
    return normal_draws(seed, stream, t.numel()).view(t.shape)


def test_small_problem_keeps_the_randn_bits():
    seed = 21
    got = build_problem({**SMALL, "dtype": "bf16"}, seed)
    gen = torch.Generator().manual_seed(seed)
    want = ([], [], [])
    for lq, lk in zip(SMALL["qo_lens"], SMALL["kv_lens"]):      # q, k, v of each request in turn
        for kept, shape in zip(want, ((lq, 4, 8), (lk, 2, 8), (lk, 2, 8))):
            kept.append(torch.randn(shape, generator=gen, dtype=torch.float32).to(torch.bfloat16))
    assert _same(got.q, want[0]) and _same(got.k, want[1]) and _same(got.v, want[2])


def test_threshold_is_exclusive(monkeypatch):
    n = _elements(SMALL)
    randn = build_problem(SMALL, 4)
    monkeypatch.setattr(problem, "DEVICE_DRAW_ELEMENTS", n)
    assert _same_problem(build_problem(SMALL, 4), randn)
    monkeypatch.setattr(problem, "DEVICE_DRAW_ELEMENTS", n - 1)
    hashed = build_problem(SMALL, 4)
    assert not _same(hashed.q, randn.q)
    # Request r's q, k, v are streams 3r, 3r + 1, 3r + 2 of the seed.
    for r in range(2):
        for i, t in enumerate((hashed.q[r], hashed.k[r], hashed.v[r])):
            assert torch.equal(_bits(t), _bits(_stream(4, 3 * r + i, t)))


def test_large_problem_is_drawn_by_normal_draws_and_rebuilds_the_same():
    assert _elements(LARGE) > problem.DEVICE_DRAW_ELEMENTS
    a, b = build_problem(LARGE, 8), build_problem(LARGE, 8)
    assert _same_problem(a, b)
    assert not _same(a.q, build_problem(LARGE, 9).q)
    assert a.v[0].dtype == torch.bfloat16 and a.v[0].shape == (8192, 2, 128)
    assert torch.equal(_bits(a.v[0]), _bits(_stream(8, 2, a.v[0]).to(torch.bfloat16)))
    assert float(a.v[0].float().abs().max()) <= 3.47


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_values_transforms_apply_on_the_hashed_path(monkeypatch, dtype):
    monkeypatch.setattr(problem, "DEVICE_DRAW_ELEMENTS", 0)
    base = {**SMALL, "dtype": dtype, "qo_lens": [3, 2], "kv_lens": [6, 40]}
    seed = 17
    big = build_problem({**base, "values": "large_logits"}, seed)
    tiny = build_problem({**base, "values": "tiny"}, seed)
    cast = problem.DTYPES[dtype]
    e = EMIN[dtype] + 2
    for r in range(2):
        q, k = _stream(seed, 3 * r, big.q[r]), _stream(seed, 3 * r + 1, big.k[r])
        # large_logits: q[..., 0] = 1 / sm_scale, k[:, h, 0] shifted by the head's offset.
        want_q = q.clone()
        want_q[..., 0] = 1 / big.sm_scale
        want_k = k.clone()
        for h in range(k.shape[1]):
            want_k[:, h, 0] += float(large_logit_offset(r, h))
        assert torch.equal(_bits(big.q[r]), _bits(want_q.to(cast)))
        assert torch.equal(_bits(big.k[r]), _bits(want_k.to(cast)))
        # tiny: q scaled down to the smallest normals, k up by as much.
        assert torch.equal(_bits(tiny.q[r]), _bits((q * 2.0 ** e).to(cast)))
        assert torch.equal(_bits(tiny.k[r]), _bits((k * 2.0 ** -e).to(cast)))


# ---------------------------------------------------------------- the same bits on a GPU

@gpu
@pytest.mark.parametrize("seed, stream", [(0, 0), (1, 2), (2**31 - 1, 96), (123456, 7)])
def test_cpu_and_cuda_draw_the_same_bits(seed, stream):
    n = (1 << 20) + 3
    cpu, cuda = normal_draws(seed, stream, n, "cpu"), normal_draws(seed, stream, n, "cuda")
    assert cuda.device.type == "cuda"
    assert torch.equal(_bits(cpu), _bits(cuda.cpu()))


@gpu
def test_large_problem_is_the_same_on_cpu_and_cuda():
    cpu, cuda = build_problem(LARGE, 5, "cpu"), build_problem(LARGE, 5, "cuda")
    assert cuda.k[0].device.type == "cuda"
    assert _same_problem(cpu, cuda)


@gpu
@pytest.mark.parametrize("values", list(problem.VALUES))
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_every_value_kind_is_the_same_on_cpu_and_cuda(monkeypatch, values, dtype):
    monkeypatch.setattr(problem, "DEVICE_DRAW_ELEMENTS", 0)
    params = {**SMALL, "dtype": dtype, "values": values}
    cpu, cuda = build_problem(params, 6, "cpu"), build_problem(params, 6, "cuda")
    assert _same_problem(cpu, cuda)
    host = cuda.on_host()          # a small case keeps a CPU copy: the device's bits
    assert host is not None and host.q[0].device.type == "cpu" and _same_problem(host, cpu)
