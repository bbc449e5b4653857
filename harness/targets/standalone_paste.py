"""What an adapter's standalone_source writes a script's call() with (harness/tools/standalone.py
writes the rest): its own code pasted as top-level source, and tensors as exact bits.

Here, below the tools, so that a target (harness/targets/bundled.py) can use it.
"""
from __future__ import annotations

import ast
import base64
import math
import zlib


def encode_tensor(t) -> dict:
    """A CPU tensor as {dtype, shape, data}: its raw bytes, zlib-compressed, base64."""
    import torch
    t = t.detach().to("cpu").contiguous()
    raw = t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "data": base64.b64encode(zlib.compress(raw, 9)).decode("ascii")}


# ------------------------------------------------------------------ data as literals
#
# A script is attached to a library's issue tracker and run by its maintainers, and what a
# case, table or id holds is anyone's text: it reaches a script only as a literal, written
# with ascii() (every character past ASCII, every control, line separator and bidi mark
# escaped), so the file itself is plain printable ASCII wherever data goes, and no text of
# a case can end a string, a line or a comment.

def data_literal(value, width: int = 96, indent: int = 0) -> str:
    """Python source evaluating to `value` (JSON-like data: str, int, float, bool, None,
    lists, tuples, dicts), pure printable ASCII. Containers wider than `width` are written
    one item a line. Anything else is written as the ascii() of its str(): data, never code."""
    flat = _flat_literal(value)
    if len(flat) + indent <= width or not isinstance(value, (dict, list, tuple)) or not value:
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{_flat_literal(k)}: "
                 + data_literal(v, width, indent + 1 + len(_flat_literal(k)) + 2).lstrip()
                 for k, v in value.items()]
        return "{" + (",\n" + pad).join(items) + "}"
    open_, close = ("[", "]") if isinstance(value, list) else ("(", ",)")
    if not any(isinstance(v, (dict, list, tuple)) for v in value):
        lines, line = [], ""       # scalars: as many to a line as fit
        for item in map(_flat_literal, value):
            if line and indent + 1 + len(line) + len(item) + 2 > width:
                lines.append(line.rstrip())
                line = ""
            line += item + ", "
        lines.append(line.rstrip(", "))
        return open_ + ("\n" + pad).join(lines) + close
    items = [data_literal(v, width, indent + 1) for v in value]
    return open_ + (",\n" + pad).join(items) + close


def _flat_literal(value) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value)) if math.isfinite(value) else f"float({str(float(value))!r})"
    if isinstance(value, str):
        return ascii(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flat_literal(k)}: {_flat_literal(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat_literal(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + "".join(f"{_flat_literal(v)}, " for v in value).rstrip(" ") + ")"
    return ascii(str(value))


# ------------------------------------------------------------------ pasting an adapter's code
#
# A script's call() is the adapter's own code, not a retyped copy: paste_source writes out
# whole modules (or named parts of them) of the harness as top-level source, in dependency
# order, verbatim except for what a single file cannot hold: the harness imports between the
# pasted modules (dropped: the names are defined above them in the same file, or bound by an
# alias line where the importer calls them otherwise) and the names two modules both define
# (each given in `renames`, and asserted to be referenced by no pasted code under the old name
# except through an import the paste resolves).

def _statement_chunks(source: str, tree):
    """(statement, its text with the comments and blank lines above it) per top-level one."""
    lines = source.splitlines(keepends=True)
    prev_end = 0
    for node in tree.body:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        # the comment block right above the statement (not the blank lines before it)
        top = start - 1
        while top > prev_end and lines[top - 1].lstrip().startswith("#"):
            top -= 1
        yield node, "".join(lines[top:node.end_lineno]).rstrip()
        prev_end = node.end_lineno


def _defined(node) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for t in targets if isinstance(t, ast.Name)]
    return []


def _is_harness(module: str | None) -> bool:
    return bool(module) and (module == "harness" or module.startswith("harness."))


def paste_source(parts, renames: dict | None = None, extra_imports=(),
                 provided: dict | None = None) -> tuple[str, str]:
    """(import lines, code) of `parts`, each a module or (module, [names]), pasted in order.

    renames: {(module name, name): new name} for a name another pasted module also defines.
    provided: {(module name, name): its name in the script} for what the script defines
    elsewhere (its reference functions). The imports are the pasted code's own non-harness
    ones, deduplicated. The same request is pasted once a process: it depends on the
    modules' source alone, and every script of a `report --repros` asks for it."""
    key = (tuple((p.__name__, None) if not isinstance(p, tuple)
                 else (p[0].__name__, tuple(p[1])) for p in parts),
           frozenset((renames or {}).items()), tuple(extra_imports),
           frozenset((provided or {}).items()))
    if key not in _PASTED:
        _PASTED[key] = _paste(parts, dict(renames or {}), extra_imports, dict(provided or {}))
    return _PASTED[key]


_PASTED: dict = {}


def _paste(parts, renames: dict, extra_imports, provided: dict) -> tuple[str, str]:
    import inspect
    import re
    renames = dict(renames or {})
    where: dict[tuple, str] = dict(provided or {})   # (module, name) -> its name in the script
    owner: dict[str, str] = {}            # script name -> the module that defined it
    imports: list[str] = list(extra_imports)
    chunks: list[str] = []
    for part in parts:
        module, names = (part, None) if not isinstance(part, tuple) else part
        source = inspect.getsource(module)
        mod = module.__name__
        picked = []
        for node, text in _statement_chunks(source, ast.parse(source)):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue                                        # the module docstring
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if isinstance(node, ast.ImportFrom) and (_is_harness(node.module) or node.level):
                if names is None:    # what the module takes from the harness: pasted above
                    picked += _bound(node, where, mod)
                continue
            if isinstance(node, ast.Import) and any(_is_harness(a.name) for a in node.names):
                raise AssertionError(f"{mod}: `{ast.get_source_segment(source, node)}` "
                                     "cannot be pasted")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                line = ast.get_source_segment(source, node)
                if line not in imports:
                    imports.append(line)
                continue
            defined = _defined(node)
            if names is not None and not (set(defined) & set(names)):
                continue
            for name in defined:
                new = renames.get((mod, name), name)
                if new != name:
                    kind = "def |class " if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ""
                    text, n = re.subn(rf"^((?:{kind}){re.escape(name)})\b",
                                      lambda m: m.group(1)[:-len(name)] + new, text,
                                      count=1, flags=re.MULTILINE)
                    assert n == 1, (mod, name)
                if new in owner and owner[new] != mod:
                    raise AssertionError(f"{new} is defined by both {owner[new]} and {mod}: "
                                         f"name one of them in renames")
                owner[new] = mod
                where[(mod, name)] = new
            picked.append(text)
        chunks.append(f"# -- {mod} --\n\n" + "\n\n\n".join(picked))
    return "\n".join(imports), _resolve_local_imports("\n\n\n".join(chunks), where)


def _bound(node, where: dict, importer: str) -> list[str]:
    """A module-level harness import of pasted code: nothing where each name is already
    what the importer calls it, else `alias = name` lines. A name not pasted is an error."""
    lines = []
    for a in node.names:
        key = (node.module, a.name)
        if key not in where:
            raise AssertionError(f"{importer} imports {node.module}.{a.name}, which is not "
                                 "pasted above it")
        if where[key] != (a.asname or a.name):
            lines.append(f"{a.asname or a.name} = {where[key]}")
    return lines


def _resolve_local_imports(code: str, where: dict) -> str:
    """Function-level `from harness.x import a as b` lines: kept as a comment where the
    script calls x's `a` b already, else replaced by `b = <a's name in the script>`; a name
    that was not pasted is an error (the script would not run)."""
    import re
    out = []
    pattern = re.compile(r"^(\s+)from (harness[\w.]*) import ([^(]+)$")
    for line in code.splitlines():
        m = pattern.match(line)
        if not m:
            if re.match(r"^\s+(from|import) harness", line):
                raise AssertionError(f"cannot paste the import {line.strip()!r}")
            out.append(line)
            continue
        indent, mod, names = m.groups()
        assigns = []
        for item in names.split(","):
            name, _, alias = item.strip().partition(" as ")
            name, alias = name.strip(), (alias.strip() or name.strip())
            if (mod, name) not in where:
                raise AssertionError(f"{mod}.{name} is imported by pasted code but not pasted")
            if where[(mod, name)] != alias:
                assigns.append(f"{indent}{alias} = {where[(mod, name)]}")
        out.extend(assigns or [f"{indent}# {line.strip()}: defined in this file"])
    return "\n".join(out)
