"""harness/ is layered: data flows one way, and no set of modules imports itself round.

Layers, top to bottom: cli (and __main__) -> tools -> engine -> targets | results -> model.
A module may import its own layer and any layer below; every import counts, the ones inside
functions included, since a lazy import is still a dependency a reader must follow.
"""
from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
RANK = {"model": 0, "targets": 1, "results": 1, "engine": 2, "tools": 3, "cli": 4, "__main__": 4}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(HARNESS.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in HARNESS.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every harness module `path` imports; `from pkg import sub` names the submodule."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "harness")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "harness":
                continue
            # `from pkg import sub` runs pkg's __init__ too: an edge to both, as a strict
            # reader of the import graph counts it.
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            found.update([mod] + subs)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {n: imports_of(n, p, known) for n, p in mods.items()}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative enough for a few hundred modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_of_any_length():
    circles = [sorted(c) for c in strongly_connected(graph()) if len(c) > 1]
    assert circles == []


def test_no_module_imports_a_layer_above_its_own():
    bad = []
    for mod, deps in graph().items():
        here = layer(mod)
        if here not in RANK:
            continue
        for dep in deps:
            there = layer(dep)
            if there in RANK and RANK[there] > RANK[here]:
                bad.append(f"{mod} -> {dep}")
            if {here, there} == {"targets", "results"}:
                bad.append(f"{mod} -> {dep} (side by side: neither imports the other)")
    assert bad == []


def test_reports_read_results_and_model_only():
    reports = HARNESS.parent / "reports"
    known = set(modules())
    bad = []
    for path in reports.rglob("*.py"):
        name = "reports." + ".".join(path.relative_to(reports).with_suffix("").parts)
        for dep in imports_of(name.removesuffix(".__init__"), path, known):
            if layer(dep) not in ("results", "model"):
                bad.append(f"{name} -> {dep}")
    assert bad == []


def test_every_module_sits_in_a_layer():
    loose = [m for m in modules() if m != "harness" and layer(m) not in RANK]
    assert loose == []


def test_the_checker_sees_a_circle_and_an_upward_import():
    g = {"harness.model.a": {"harness.model.b"}, "harness.model.b": {"harness.model.c"},
         "harness.model.c": {"harness.model.a"}, "harness.tools.t": set()}
    assert [sorted(c) for c in strongly_connected(g) if len(c) > 1] == [
        ["harness.model.a", "harness.model.b", "harness.model.c"]]
    assert RANK[layer("harness.tools.t")] > RANK[layer("harness.model.a")]
