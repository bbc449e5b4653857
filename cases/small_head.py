"""small_head: head sizes below the ll4mi kernel's minimum, and sliding windows (seed 000).

The ll4mi-style decode kernel walks VHELOOP = head_size / 16 / NWARPS slices
of 16 value dims per warp; with 4 warps that is 0 for head_size 32 and 48, so
the softmax x V loop never runs and the output is whatever the buffer held.
It also has no sliding window. Its route selector must send both to the fa2
fallback. Head sizes 32, 64 and 128 are ones every decode library serves:
they must match. 48 is not a power of two, and a library may legitimately
not support it (match_or_refuse); computing it wrongly fails either way. The
harness poisons every output
buffer with NaN, so an unwritten output is `wrong` even where the memory
would have held zeros.

return_lse is off: the ll4mi kernel writes no LSE, so an LSE run never
reaches it. fa2.batch_decode runs the same cases as a control: it has no
selector and must match everywhere.

The dtype is not the point: the cases are bf16 where the target has it, else the first
dtype it declares (cases/_dtypes.py); the full profile runs every declared dtype.
"""
from __future__ import annotations

from typing import Iterator

from cases._dtypes import each_declared
from cases._expect import expect
from cases._tags import tag as id_tag
from harness.model.case import Case
from harness.model.routes import op_of

FAMILY = "small_head"
OPS = ("batch_decode",)

HEAD_SIZES = (32, 48, 64, 128)
# None: no window. 15: the last 16 tokens, shorter than every request below.
WINDOWS = (None, 15)

# Three decode requests, lengths not a multiple of the page size, all longer
# than the window; GQA 8 over 2 so the head mapping is exercised too.
_BASE = {"dtype": "bf16", "num_qo_heads": 8, "num_kv_heads": 2, "qo_lens": [1, 1, 1],
         "kv_lens": [37, 70, 23], "causal": False, "return_lse": False,
         "page_size": 16, "layout": "NHD", "cache_form": "tuple"}


def cases(routes, profile: str = "ci", dtypes=None) -> Iterator[Case]:
    # The full profile adds fp16 and fp32: a value loop's width is per dtype in some kernels.
    dtypes = each_declared(("bf16", "fp16", "fp32") if profile == "full" else ("bf16",),
                           dtypes)
    for route in routes:
        if op_of(route) not in OPS:
            continue
        for dtype in dtypes:
            for head_size in HEAD_SIZES:
                for window in WINDOWS:
                    params = {**_BASE, "dtype": dtype, "head_dim": head_size,
                              "window_left": -1 if window is None else window}
                    variant = f"d{head_size}" + ("" if window is None else f"_window{window}")
                    tag = id_tag(params, "dims", "page")
                    must, words = expect(op_of(route), params)
                    yield Case(route=route, family=FAMILY, variant=variant, params=params,
                               expect=must, refuse_words=words, tag=tag)
