"""The bundled library through an adapter that never looks at one kind of param (tests
only): what a user's adapter written before that param existed does."""
from __future__ import annotations

import os

from harness.model.case import Case
from harness.targets.bundled import BundledTarget

IGNORED = tuple(filter(None, os.environ.get("IGNORED_PARAMS", "scenario,mismatch").split(",")))


class Ignoring(BundledTarget):
    name = "ignoring"
    # One route of the library, the paged prefill, which both kinds of param reach: what the
    # adapter does wrong is the same on every route, and check-target's selection (a case per
    # family and route) runs a sixth of the cases.
    routes = ("fa2.paged_prefill",)

    def run(self, case, problem, buffers):
        # Iterating the keys reads no value; only the keys it knows are looked up.
        kept = {k: case.params[k] for k in case.params if k not in IGNORED}
        plain = Case(route=case.route, family=case.family, variant=case.variant, params=kept,
                     expect=case.expect, refuse_words=case.refuse_words, seed=case.seed,
                     tag=case.tag, requires=case.requires)
        return super().run(plain, problem, buffers)


def make_target():
    return Ignoring()
