"""The id tag: the short params summary at the end of a case id (harness/model/case.py), made
of named bits, each formatted here once. A family names the bits its cases differ in; a bit
whose field is absent (or off) writes nothing. Ids are stable: a bit's text never changes."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from harness.model.case import dtype_tag

Params = Mapping[str, Any]


def _dims_vo(p: Params) -> str:
    d, vo = p["head_dim"], p.get("head_dim_vo", p["head_dim"])
    return "-".join([p["dtype"], f"d{d}" if vo == d else f"d{d}v{vo}",
                     f"h{p['num_qo_heads']}x{p['num_kv_heads']}"])


def _kv_kilo(p: Params) -> str:
    kv = max(p["kv_lens"])
    return f"k{kv // 1024}k" if kv >= 1024 else f"k{kv}"


BITS: dict[str, Callable[[Params], str]] = {
    "dims": dtype_tag,                                   # fp16-d128-h4x2
    "dims_vo": _dims_vo,                                 # fp16-d192v128-h4x2 (vo only if it differs)
    "batch": lambda p: f"b{len(p['qo_lens'])}",
    "q_max": lambda p: f"q{max(p['qo_lens'])}",
    "kv_max": lambda p: f"k{max(p['kv_lens'])}",
    "kv_kilo": _kv_kilo,                                 # k8k, k40
    "causal": lambda p: "causal" if p.get("causal") else "",
    "window": lambda p: f"w{p['window_left']}" if p.get("window_left", -1) >= 0 else "",
    "page": lambda p: f"p{p['page_size']}" if "page_size" in p else "",
    "page_ids": lambda p: f"pid{p['page_id_offset']}" if p.get("page_id_offset") else "",
    "layout": lambda p: p["layout"].lower() if "layout" in p else "",
    "hnd": lambda p: "hnd" if p.get("layout") == "HND" else "",
    "single": lambda p: "single" if p.get("cache_form") == "single" else "",
    "in_place": lambda p: "in_place" if p.get("merge") == "in_place" else "",
    "kv_dtype": lambda p: p["kv_dtype"].replace("fp8_", "") if p.get("kv_dtype") else "",
    # A caller's chunk as written (0 included) / only a non-zero one.
    "chunk": lambda p: f"chunk{p['max_kv_chunk']}" if "max_kv_chunk" in p else "",
    "chunk_set": lambda p: f"chunk{p['max_kv_chunk']}" if p.get("max_kv_chunk") else "",
    "workspace": lambda p: f"ws{p['workspace_bytes']}" if p.get("workspace_bytes") else "",
    "lse": lambda p: "lse" if p.get("return_lse") else "",
}


def tag(params: Params, *bits: str, extra: Iterable[str] = ()) -> str:
    """The named bits of `params`, then `extra` (a family's own words), joined by '-'."""
    unknown = [b for b in bits if b not in BITS]
    if unknown:
        raise KeyError(f"id tag bits {unknown} are not among {sorted(BITS)}")
    return "-".join(t for t in [*(BITS[b](params) for b in bits), *extra] if t)
