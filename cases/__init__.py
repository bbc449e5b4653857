"""Case families: one module each, discovered by name.

A family module defines `OPS` (the ops it covers) and `cases(routes)`, a
generator of Case records for the given routes. Families hold data only: no
test logic, no tensors, no library imports, no backend names (where a route's
kernel takes another path, a family asks the route's declared traits,
harness/model/routes.py).

What families share, once each: _per_op.py (a family's `_<op>` generator for a
route, with the route's traits), _tags.py (the id tag's bits), _expect.py (the
contract: expect(op, params)), _call_forms.py and _dtypes.py.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Iterable

from harness.model.case import Case
from harness.model.routes import BUNDLED_ROUTES, op_of


def family_names() -> list[str]:
    """Every module here but the shared helpers (`_*.py`): the pytest root that ran the cases
    lives in harness/engine/pytest_root/, so nothing else sits beside the families
    (tests/test_cases_families_only.py)."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        names.append(info.name)
    return sorted(names)


def load_family(name: str):
    known = family_names()
    if name not in known:
        raise ValueError(f"--family: unknown family {name!r}; known: {known}")
    module = importlib.import_module(f"cases.{name}")
    if not hasattr(module, "cases"):
        raise ValueError(f"cases/{name}.py defines no cases(routes) generator")
    return module


# "ci": every family x route and every axis, minutes on 2 cores (offsets past 2^31 in
# lazily allocated pools included). "full": what a GPU runs in minutes: long contexts,
# offsets past 2^31 at 8 kv heads, every dtype in the sweeps, the
# value and edge-row families in every call form. A family whose cases(routes,
# profile=...) takes the profile gets it; the others are the same in both.
PROFILES = ("ci", "full")


def generate(families: Iterable[str] | None = None,
             routes: Iterable[str] = BUNDLED_ROUTES, profile: str = "ci",
             dtypes: Iterable[str] | None = None) -> list[Case]:
    """Every case of the named families (all when None) on the given routes.

    `dtypes`: the target's declared dtypes (None: every one); a family whose cases()
    takes `dtypes` writes cases whose dtype is not their point in one of them
    (cases/_dtypes.py).
    Ids must be unique: two cases with one id would share a row and a seed.
    """
    if profile not in PROFILES:
        raise ValueError(f"--profile: {profile!r} is not one of {list(PROFILES)}")
    routes = tuple(routes)
    for route in routes:
        op_of(route)
    out: list[Case] = []
    seen: dict[str, Case] = {}
    for name in (family_names() if families is None else list(families)):
        module = load_family(name)
        takes = inspect.signature(module.cases).parameters
        kwargs = {}
        if "profile" in takes:
            kwargs["profile"] = profile
        if "dtypes" in takes:
            kwargs["dtypes"] = None if dtypes is None else frozenset(dtypes)
        for case in module.cases(routes, **kwargs):
            if case.id in seen:
                raise ValueError(f"duplicate case id {case.id!r} in family {name!r}: "
                                 f"params {dict(case.params)} vs {dict(seen[case.id].params)}")
            seen[case.id] = case
            out.append(case)
    return out
