"""One generator per op: how a family that writes `_<op>(...)` for each op it covers finds
the one for a route, and what that route declares (harness/model/routes.py traits), so no
family keeps its own op table or reads a backend out of a route's name."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from harness.model.routes import OPS, RouteTraits, op_of, traits


def makers(namespace: dict) -> dict[str, Callable]:
    """The family's per-op generators: `_<op>` in its module namespace, for each known op."""
    return {op: namespace[f"_{op}"] for op in OPS if callable(namespace.get(f"_{op}"))}


def per_route(routes: Iterable[str], namespace: dict
              ) -> Iterator[tuple[str, str, Callable, RouteTraits]]:
    """(route, op, generator, traits) for each route whose op the family writes, in the
    routes' order."""
    found = makers(namespace)
    for route in routes:
        op = op_of(route)
        if op in found:
            yield route, op, found[op], traits(route)
