"""The call forms a caller uses, to cross with every adversarial perturbation.

A defect can hide behind one form: a run() whose q has fewer heads than
planned is refused by accident when an lse of the planned shape is handed
over, and runs silently when the caller asks for no LSE and lets the library
allocate. Each family's default form (the caller's out= and lse=, the LSE
requested as the family says) keeps its case id; every other form is a new
case whose tag says which. A must-refuse input must be refused in every form.
"""
from __future__ import annotations

# (tag suffix, params the form sets). "nolse": no LSE asked for (return_lse=False,
# which is also every batch wrapper's run(return_lse=False)); "lib": the library
# allocates and returns out (and lse).
FORMS = (
    ("nolse", {"return_lse": False}),
    ("lib", {"out_form": "library"}),
    ("lib-nolse", {"out_form": "library", "return_lse": False}),
)


def forms(params: dict, tag: str, crossed: bool = True):
    """(params, tag) for the case as written, then (when crossed) for every other call
    form that changes something (a form equal to the written one is not repeated).

    Caller-owned buffers by design (CUDA-graph mode, a partial state to merge into)
    keep their one form."""
    yield params, tag
    if not crossed or params.get("use_cuda_graph") or params.get("partial_state"):
        return
    seen = [params]
    for suffix, sets in FORMS:
        other = {**params, **sets}
        if other not in seen:
            seen.append(other)
            yield other, f"{tag}-{suffix}" if tag else suffix
