"""Adversarial tensor layouts and guarded buffers, as small composable functions.

Every builder returns a view *equal* to its input whose hidden storage holds
poison: NaN for floats, a huge negative for ints. A kernel that honours the
strides reads exactly the input; one that ignores them reads poison, so the
result is NaN or an out-of-range index instead of plausible numbers.

Buffers puts every output the library writes inside one allocation with
canary bands before and after, poisons the output itself, and fingerprints
every input, so writes out of bounds and writes into inputs are caught even
when the answer looks right.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable

import torch

INT_POISON = -(2 ** 30)

# Same-width integer dtypes: canaries and fingerprints work on raw bits.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Per float dtype: (exponent top bit to clear, exponent low bit to set). Clearing
# the top bit keeps the exponent off all-ones (no inf, no NaN); setting the
# low bit keeps it off zero (no zero, no denormal).
_FLOAT_CANARY_BITS = {
    torch.float16: (14, 10),
    torch.bfloat16: (14, 7),
    torch.float32: (30, 23),
    torch.float64: (62, 52),
}


def poison_value(dtype: torch.dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return max(INT_POISON, torch.iinfo(dtype).min)


def _poisoned(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.full(shape, poison_value(like.dtype), dtype=like.dtype, device=like.device)


def strided_last_dim(t: torch.Tensor, step: int = 2) -> torch.Tensor:
    """A view equal to t with stride(-1) == step; the skipped slots hold poison."""
    if t.dim() == 0 or step < 1:
        raise ValueError(f"strided_last_dim: needs a tensor with dims and step >= 1, "
                         f"got shape {tuple(t.shape)}, step {step}")
    base = _poisoned((*t.shape[:-1], t.shape[-1] * step), t)
    view = base[..., ::step]
    view.copy_(t)
    return view


def every_other(t: torch.Tensor) -> torch.Tensor:
    """A view equal to t, non-contiguous along dim 0 (interleaved with poison rows)."""
    if t.dim() == 0:
        raise ValueError("every_other: needs a tensor with at least one dim")
    base = _poisoned((t.shape[0] * 2, *t.shape[1:]), t)
    view = base[::2]
    view.copy_(t)
    return view


def head_sliced(t: torch.Tensor, extra_heads: int = 1) -> torch.Tensor:
    """A view equal to t [N, H, D] cut from a poisoned [N, H + extra, D]: rows strided, D packed."""
    if t.dim() != 3 or extra_heads < 1:
        raise ValueError(f"head_sliced: needs [N, H, D] and extra_heads >= 1, "
                         f"got shape {tuple(t.shape)}, extra_heads {extra_heads}")
    n, h, d = t.shape
    base = _poisoned((n, h + extra_heads, d), t)
    view = base[:, :h]
    view.copy_(t)
    return view


def storage_span(t: torch.Tensor) -> torch.Tensor:
    """A flat view of every storage element the view t can reach (its gaps included)."""
    if t.numel() == 0:
        return t.reshape(0)
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    lowest = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    return t.as_strided((span,), (1,), lowest)


def _span_bits(t: torch.Tensor) -> torch.Tensor:
    """The storage t can reach, as integers of its element size (bit-exact, NaN-safe)."""
    flat = storage_span(t).detach()
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    return flat.contiguous().view(_BITS[flat.element_size()])


# Above this many elements an input is snapshotted where it lives and compared there:
# hashing a 2^31-element cache pool meant copying it to the CPU and SHA-256ing it twice
# (~45 s a case on the H200); a device copy and torch.equal take milliseconds.
SNAPSHOT_ELEMS = 1 << 22
# Above this many bytes a host input is snapshotted sparsely: a page pool past 2^31 elements
# (harness/targets/layout.py _pool) is allocated lazily, its untouched pages never resident,
# and a whole copy makes all of it resident (4.2 GB and 7 s for one 16-bit pool). Where the
# kernel says which pages of an anonymous mapping are resident (/proc/self/pagemap), only those
# are copied, and a page that was not resident (so read as zero) must be absent or all zero
# after the run: milliseconds, nothing made resident. Elsewhere each chunk holding a non-zero
# bit is copied and the others kept as a mark (seconds, still nothing made resident).
SPARSE_SNAPSHOT_BYTES = 1 << 30
_SPARSE_CHUNK = 1 << 24


def _anonymous(lo: int, hi: int) -> bool:
    """[lo, hi) lies in one private anonymous mapping of this process (reads zero unwritten)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                a, b = (int(x, 16) for x in parts[0].split("-"))
                if a <= lo < b:
                    return hi <= b and parts[1].endswith("p") and len(parts) < 6
    except (OSError, ValueError, IndexError):
        pass
    return False


def _resident_pages(lo: int, hi: int):
    """A numpy bool per OS page of [lo, hi): present or swapped; None where unknown."""
    try:
        import numpy as np
        size = os.sysconf("SC_PAGE_SIZE")
        first, last = lo // size, (hi - 1) // size
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
        try:
            raw = os.pread(fd, 8 * (last - first + 1), 8 * first)
        finally:
            os.close(fd)
        entries = np.frombuffer(raw, dtype=np.uint64)
        if entries.size != last - first + 1:
            return None
        return ((entries >> np.uint64(62)) & np.uint64(3)) != 0, size, first
    except (OSError, ValueError, ImportError):
        return None


def _runs(mask):
    """(start, stop) of each run of True in a numpy bool array."""
    import numpy as np
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


class _SparseSnapshot:
    """The bytes of a large host tensor, kept only where they can be non-zero."""

    def __init__(self, bits: torch.Tensor):
        self.raw = bits.view(torch.uint8)
        ptr, n = self.raw.data_ptr(), self.raw.numel()
        self.paged = _resident_pages(ptr, ptr + n) if _anonymous(ptr, ptr + n) else None
        if self.paged is not None:
            mask, size, first = self.paged
            self.kept = [(a, b, self.raw[a:b].clone())
                         for a, b in (self._bytes(r, size, first) for r in _runs(mask))]
        else:
            self.kept = [(a, b, c.clone()) for a, b, c in self._chunks() if bool(c.any())]

    def _bytes(self, run, size, first):
        ptr, n = self.raw.data_ptr(), self.raw.numel()
        a = max(0, (first + run[0]) * size - ptr)
        b = min(n, (first + run[1]) * size - ptr)
        return a, b

    def _chunks(self):
        for a in range(0, self.raw.numel(), _SPARSE_CHUNK):
            b = min(a + _SPARSE_CHUNK, self.raw.numel())
            yield a, b, self.raw[a:b]

    def same(self) -> bool:
        if any(not torch.equal(self.raw[a:b], kept) for a, b, kept in self.kept):
            return False
        if self.paged is not None:
            mask, size, first = self.paged
            now = _resident_pages(self.raw.data_ptr(), self.raw.data_ptr() + self.raw.numel())
            if now is None:
                return False
            fresh = now[0] & ~mask          # pages made resident since: read as zero before
            return not any(bool(self.raw[a:b].any()) for a, b in
                           (self._bytes(r, size, first) for r in _runs(fresh)))
        kept = {a for a, _, _ in self.kept}
        return not any(bool(c.any()) for a, _, c in self._chunks() if a not in kept)


def fingerprint(t: torch.Tensor) -> str:
    """Bitwise hash of the storage t can reach, plus its layout."""
    return _digest(t, _span_bits(t).cpu().numpy().tobytes())


def _digest(t: torch.Tensor, raw: bytes) -> str:
    layout = f"{t.dtype}{tuple(t.shape)}{t.stride()}{t.storage_offset()}".encode()
    return hashlib.sha256(layout + raw).hexdigest()[:24]


def fingerprints(tensors: list[torch.Tensor]) -> list[str]:
    """fingerprint() of each, from one read back per device of all their spans (on a GPU,
    one synchronizing copy instead of one per tensor; a plan's CPU tensors are read apart)."""
    spans = [_span_bits(t).reshape(-1).view(torch.uint8) for t in tensors]
    out: list[str | None] = [None] * len(tensors)
    for device in {t.device for t in tensors}:
        mine = [i for i, t in enumerate(tensors) if t.device == device]
        raw = torch.cat([spans[i] for i in mine]).cpu().numpy().tobytes()
        at = 0
        for i in mine:
            out[i] = _digest(tensors[i], raw[at:at + spans[i].numel()])
            at += spans[i].numel()
    return out


def canary_pattern(n: int, dtype: torch.dtype) -> torch.Tensor:
    """n elements of a fixed random-ish pattern: never NaN, inf, zero or the int poison."""
    if dtype == torch.bool:
        return torch.ones(n, dtype=torch.bool)
    bits = _BITS[torch.empty((), dtype=dtype).element_size()]
    gen = torch.Generator().manual_seed(0x5EED)
    if bits == torch.uint8:
        return torch.randint(1, 256, (n,), generator=gen, dtype=torch.int64).to(torch.uint8).view(dtype)
    info = torch.iinfo(bits)
    raw = torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64)
    if dtype in _FLOAT_CANARY_BITS:
        clear, keep = _FLOAT_CANARY_BITS[dtype]
        raw = (raw & ~(1 << clear)) | (1 << keep)
    else:
        raw = raw | 1          # odd: never zero, never the (even) int poison
    return raw.to(bits).view(dtype)


def _unravel(flat: int, shape: tuple) -> tuple:
    """The row-major index of element `flat` in `shape` (torch.unravel_index imports sympy,
    ~0.8 CPU-s, in every process it first runs in)."""
    index = []
    for size in reversed(shape):
        flat, at = divmod(flat, size)
        index.append(at)
    return tuple(reversed(index))


def _bits_of(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.view(_BITS[t.element_size()])


# Elements of each canary band around an output: wide enough that a write a few rows past
# the end lands in it, not in the next allocation.
CANARY_ELEMS = 512


@dataclass
class _Guarded:
    name: str
    alloc: torch.Tensor         # the whole allocation, flat
    canary_elems: int
    numel: int
    pattern: torch.Tensor       # CPU canary bits


@dataclass
class _Gaps:
    name: str
    wide: torch.Tensor          # the packed allocation the strided view was cut from
    step: int                   # the view takes every step-th slot of its last dim
    poison: torch.Tensor        # the poison's bits, one element


@dataclass
class _Watched:
    name: str
    tensor: torch.Tensor
    fp: str
    snapshot: torch.Tensor | None = None   # the bits, on the tensor's device (large inputs)
    sparse: _SparseSnapshot | None = None  # the same for a host input past SPARSE_SNAPSHOT_BYTES


class Buffers:
    """Canary-banded outputs, fingerprinted inputs and the stage log of one case."""

    def __init__(self, device: torch.device | str = "cpu",
                 on_stage: Callable[[str], None] | None = None):
        self.device = torch.device(device)
        self.on_stage = on_stage
        self.stages: list[str] = []
        self.notes: list[str] = []      # how the case was run, where the platform decides
        self._guarded: list[_Guarded] = []
        self._watched: list[_Watched] = []
        self._gaps: list[_Gaps] = []

    @property
    def current_stage(self) -> str:
        return self.stages[-1] if self.stages else ""

    def stage(self, name: str) -> None:
        self.stages.append(name)
        if self.on_stage is not None:
            self.on_stage(name)

    def _banded(self, numel: int, dtype: torch.dtype, name: str, canary_elems: int) -> _Guarded:
        pattern = canary_pattern(canary_elems, dtype)
        alloc = torch.empty(2 * canary_elems + numel, dtype=dtype, device=self.device)
        on_device = pattern.to(self.device)   # one copy to a GPU for both bands
        alloc[:canary_elems] = on_device
        alloc[canary_elems + numel:] = on_device
        alloc[canary_elems:canary_elems + numel] = poison_value(dtype)
        guarded = _Guarded(name, alloc, canary_elems, numel, _bits_of(pattern))
        self._guarded.append(guarded)
        return guarded

    def output(self, shape, dtype: torch.dtype, name: str,
               canary_elems: int = CANARY_ELEMS) -> torch.Tensor:
        """A poisoned, contiguous tensor of `shape` between two canary bands."""
        shape = tuple(int(n) for n in shape)
        numel = 1
        for n in shape:
            numel *= n
        g = self._banded(numel, dtype, name, canary_elems)
        return g.alloc[canary_elems:canary_elems + numel].view(shape)

    def strided_output(self, shape, dtype: torch.dtype, name: str, step: int = 2,
                       canary_elems: int = CANARY_ELEMS) -> torch.Tensor:
        """A poisoned output of `shape` whose last dim has stride `step`, cut from one
        canary-banded allocation. The skipped slots (the gaps) are no part of the output:
        check() reports any the library wrote (one that ignores the stride writes them)."""
        shape = tuple(int(n) for n in shape)
        wide = self.output((*shape[:-1], step * shape[-1]), dtype, name, canary_elems)
        poison = _bits_of(torch.full((1,), poison_value(dtype), dtype=dtype))
        self._gaps.append(_Gaps(name, wide, step, poison))
        return wide[..., ::step]

    def place(self, tensor: torch.Tensor, name: str,
              canary_elems: int = CANARY_ELEMS) -> torch.Tensor:
        """A contiguous copy of `tensor` between two canary bands (caller-owned buffers)."""
        out = self.output(tensor.shape, tensor.dtype, name, canary_elems)
        out.copy_(tensor)
        return out

    def watch(self, tensor: torch.Tensor, name: str) -> str:
        """Fingerprint an input now; check() reports it if it has changed since."""
        span = storage_span(tensor)
        if span.numel() > SNAPSHOT_ELEMS:
            if tensor.device.type == "cpu" and \
                    span.numel() * span.element_size() > SPARSE_SNAPSHOT_BYTES:
                self._watched.append(_Watched(name, tensor, "snapshot",
                                              sparse=_SparseSnapshot(_span_bits(tensor))))
                return "snapshot"
            self._watched.append(_Watched(name, tensor, "snapshot", _span_bits(tensor).clone()))
            return "snapshot"
        fp = fingerprint(tensor)
        self._watched.append(_Watched(name, tensor, fp))
        return fp

    def names(self) -> set[str]:
        """Every tensor name handed through these buffers (outputs and watched inputs)."""
        return {g.name for g in self._guarded} | {w.name for w in self._watched}

    def check(self) -> list[str]:
        """One message per violation: a canary band or a watched input changed."""
        problems = []
        for g in self._guarded:
            c = g.canary_elems
            # Both bands in one read back (on a GPU, one synchronizing copy, not two).
            bands = _bits_of(torch.cat((g.alloc[:c], g.alloc[c + g.numel:]))).cpu()
            before, after = bands[:c], bands[c:]
            bad = (before != g.pattern).nonzero().flatten()
            if bad.numel():
                nearest = int(bad[-1]) - c    # -1 is the element just before the output
                problems.append(f"canary before {g.name}: {bad.numel()} elements changed, "
                                f"first at {nearest}")
            bad = (after != g.pattern).nonzero().flatten()
            if bad.numel():
                problems.append(f"canary after {g.name}: {bad.numel()} elements changed, "
                                f"first at +{int(bad[0])}")
        problems += [p for g in self._gaps for p in _gap_writes(g)]
        hashed = [w for w in self._watched if w.snapshot is None and w.sparse is None]
        now = dict(zip(map(id, hashed), fingerprints([w.tensor for w in hashed])))
        for w in self._watched:
            if w.sparse is not None:
                changed = not w.sparse.same()
            elif w.snapshot is not None:
                changed = not torch.equal(_span_bits(w.tensor), w.snapshot)
            else:
                changed = now[id(w)] != w.fp
            if changed:
                problems.append(f"input {w.name} changed")
        return problems


def _gap_writes(g: _Gaps) -> list[str]:
    """The gaps of a strided output that no longer hold poison: written by the library."""
    if g.step < 2 or g.wide.numel() == 0:
        return []
    slots = _bits_of(g.wide).reshape(-1, g.step)[:, 1:].cpu()
    written = (slots != g.poison).nonzero()
    if not written.numel():
        return []
    row, col = (int(x) for x in written[0])
    first = _unravel(row * g.step + col + 1, tuple(g.wide.shape))
    return [f"gaps of strided {g.name}: {written.shape[0]} of {slots.numel()} skipped slots "
            f"written (the library ignored its stride {g.step}), first at {list(first)} of "
            f"the [..., {g.wide.shape[-1]}] buffer it was cut from"]
