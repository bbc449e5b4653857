"""Standalone scripts of hostile cases and tables: whatever a case, a table row or an id holds
reaches the script as a string literal, never as code, a comment or a docstring.

Each script is compared with the script of the same case whose every string is plain: with
their string constants masked the two ASTs are the same tree, and their comments are the
same lines, so no text of the case became a statement, a name or a comment. Executed, the
hostile script's top level calls nothing it was handed."""
from __future__ import annotations

import ast
import functools
import io
import json
import os
import re
import sys
import tokenize
import types
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from harness.engine.session import all_cases as generate_all_cases
from harness.model.case import Case
from harness.model.classify import OUTCOMES
from harness.targets.base import Target
from harness.targets.standalone_paste import data_literal
from harness.tools import standalone
from harness.tools.standalone import file_slug, script_text, shown

# What ends a literal, a line or a comment somewhere, or hides text from a reader.
PIECES = ["'", '"', "'''", '"""', "\\", "\n", "\r", "\r\n", "\x00", "\x0b", "\x0c", "\x1c",
          "\x85", "\u2028", "\u2029", "\u202e", "\u2066", "\u2069", "\u200f", "\ufeff",
          "\x1b[2J", "#", "{", "}", "%s", "{0}", "é", "\U0001f600"]
# Statements that call PWNED if they ever run.
INJECTIONS = ["\nPWNED()\n", "\n'''\nPWNED()\n'''\n", '\n"""\nPWNED()\n"""\n',
              "'); PWNED(); ('", '"); PWNED(); ("', "{PWNED()}", "\\\nPWNED()",
              "\u2028PWNED()\u2028", "\rPWNED()\r", "\x00\nPWNED()"]

hostile = st.lists(st.one_of(st.sampled_from(PIECES + INJECTIONS), st.text(max_size=4)),
                   max_size=6).map("".join)


class _Stand(Target):
    """A target whose call is small and embeds the case as the registry's adapters do (its
    fields through a literal), so a Hypothesis run of hundreds of scripts stays fast; the
    registry's own adapters get their own, shorter, run below."""
    capabilities = None

    def __init__(self, name: str, version: str):
        self.name, self._version = name, version

    def version(self) -> str:
        return self._version

    def standalone_source(self, case) -> str:
        cfg = {"id": case.id, "route": case.route, "family": case.family,
               "variant": case.variant, "refuse_words": list(case.refuse_words)}
        return (f"CFG = {data_literal(cfg)}\n\n\n"
                "def call(inputs):\n    \"\"\"The stand-in's call: o as the inputs' q.\"\"\"\n"
                "    return {'o': inputs['q'][0]}\n")


BASE = Case(route="fa2.single_prefill", family="edge_rows", variant="tiny",
            params={"qo_lens": [2], "kv_lens": [2], "num_qo_heads": 1, "num_kv_heads": 1,
                    "head_dim": 8, "dtype": "fp32", "causal": False},
            seed=7, tag="fp32-d8")


def _plain(value):
    """The same data with every string replaced by a plain one (lists keep their length)."""
    if isinstance(value, str):
        return "x"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _masked(tree: ast.AST) -> ast.AST:
    """The tree with every str / None constant masked (in place): its code, not its data."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str)):
            node.value = "S"
    return tree


def _shape(text: str, tree: ast.AST | None = None) -> str:
    """The script's masked AST (`tree`: the text's, when parsed already; masked in place)."""
    return ast.dump(_masked(ast.parse(text) if tree is None else tree))


def _comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT]


HEADLINES = {f"# The harness recorded `{o}` for this case (ABOUT below says why)."
             for o in OUTCOMES} | {
    "# This case passes on the harness (ABOUT below says how).",
    "# The harness recorded a failure for this case (ABOUT below says which)."}


def _make(target, fields: dict) -> str:
    case = replace(BASE, **{k: fields[k] for k in ("route", "family", "variant", "tag")},
                   refuse_words=tuple(fields["refuse_words"]))
    row = {"outcome": fields["outcome"], "pass": False, "message": fields["message"],
           "commit": fields["commit"], "stage": fields["stage"]}
    return script_text(case, target, row, fields["command"], {"disable_guards": fields["guards"]})


@functools.lru_cache(maxsize=64)
def _plain_shape_and_comments(plain_text: str) -> tuple[str, tuple]:
    """The plain script's code and comments, read once per plain script (the Hypothesis
    run compares hundreds of hostile scripts with a few dozen plain ones)."""
    return _shape(plain_text), tuple(_comments(plain_text))


def _assert_inert(text: str, plain_text: str):
    """Asserts the script is the plain one's code and comments; returns its compiled code
    (parsed once: the tree is compiled, then masked)."""
    assert text.isascii(), "data reached the script other than as an ascii() literal"
    tree = ast.parse(text)
    code = compile(tree, "<hostile script>", "exec")
    plain_shape, plain_comments = _plain_shape_and_comments(plain_text)
    assert _shape(text, tree) == plain_shape, "the case's text changed the script's code"
    got, want = _comments(text), list(plain_comments)
    assert got[0] in HEADLINES and got[1:] == want[1:], "the case's text reached a comment"
    return code


def _run_top_level(text: str, code=None) -> list:
    """Executes the script's top level (main() is not called) with PWNED defined; returns
    its calls. The environment and sys.path it sets are put back. `code`: the text's own
    compiled code, when compiled already."""
    calls = []
    module = types.ModuleType("hostile_script")     # dataclasses look their module up
    module.PWNED = lambda *a: calls.append(a)
    env, path = dict(os.environ), list(sys.path)
    sys.modules[module.__name__] = module
    try:
        exec(code or compile(text, "<hostile script>", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
    return calls


fields_strategy = st.fixed_dictionaries({
    "route": hostile.map(lambda s: "fa2." + s), "family": hostile, "variant": hostile,
    "tag": hostile, "refuse_words": st.lists(hostile, max_size=3),
    "outcome": st.one_of(st.sampled_from(OUTCOMES), hostile), "message": hostile,
    "commit": hostile, "stage": st.one_of(st.none(), hostile),
    "guards": st.sampled_from(["all", "merge_bound,gqa_group"]), "command": hostile,
    "target": hostile.map(lambda s: "t" + s), "version": hostile,
})


@functools.lru_cache(maxsize=64)
def _plain_script(plain_json: str) -> str:
    plain = json.loads(plain_json)
    return _make(_Stand(plain["target"], plain["version"]), plain)


def _every_field(text: str) -> dict:
    """Fields that all hold `text` (the route, target and guards as the strategy makes them)."""
    return {"route": "fa2." + text, "family": text, "variant": text, "tag": text,
            "refuse_words": [text, text], "outcome": text, "message": text, "commit": text,
            "stage": text, "guards": "all", "command": text, "target": "t" + text,
            "version": text}


def _with_every_piece(test):
    """The strategy's own alphabet, each time: every piece and injection alone in every field
    (what ends a literal at a field's end: a lone backslash), and all of them joined, forwards
    and backwards (each next to others). The random draws below add their mixes."""
    pieces = PIECES + INJECTIONS
    for text in [*pieces, "".join(pieces), "".join(reversed(pieces))]:
        test = example(_every_field(text))(test)
    return test


# The explicit examples catch each piece's mistakes every run; the draws, the mixes of pieces
# and arbitrary text (each finds a writer that mishandles a piece within tens of draws).
@settings(max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 150)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@_with_every_piece
@given(fields_strategy)
def test_hostile_fields_reach_a_script_only_as_data(fields):
    # The verbatim parts no case can reach (the reference's functions, the verdict code) are
    # cut short: what is left is every line that data_literal writes, parsed fast.
    with mock.patch.object(standalone, "_reference_source", lambda: "REFERENCE = None"), \
            mock.patch.object(standalone, "_SCRIPT_TAIL", "def main():\n    return 0\n"):
        text = _make(_Stand(fields["target"], fields["version"]), fields)
        plain = {k: _plain(v) for k, v in fields.items()}
        plain["route"] = "fa2.x"
        plain_text = _plain_script(json.dumps(plain, sort_keys=True))
    code = _assert_inert(text, plain_text)
    assert _run_top_level(text, code) == []


EXPLOIT_TAG = "x\n'''\nPWNED(); import os; os.system('echo pwned')\n'''"


def test_todays_exploit_is_inert(tmp_path):
    """The tag that ran os.system from the header comment: now a string the script holds."""
    fields = dict(route="fa2.single_prefill", family="edge_rows", variant="tiny",
                  tag=EXPLOIT_TAG, refuse_words=[], outcome="wrong", message=EXPLOIT_TAG,
                  commit=EXPLOIT_TAG, stage=EXPLOIT_TAG, guards="all",
                  command="harness repro " + EXPLOIT_TAG)
    text = _make(_Stand("bundled", "0"), fields)
    assert _run_top_level(text) == []
    ns: dict = {"__name__": "hostile_script", "PWNED": None}
    env, path = dict(os.environ), list(sys.path)
    try:
        exec(compile(text, "<exploit>", "exec"), ns)
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
    assert ns["CASE_ID"] == BASE.id.rsplit("/", 1)[0] + "/" + EXPLOIT_TAG
    assert ns["ABOUT"]["made_by"] == "harness repro " + EXPLOIT_TAG
    assert "os.system" not in "".join(_comments(text))


@pytest.mark.parametrize("target_name", ["bundled", "torch-sdpa"])
def test_the_registry_adapters_embed_hostile_cases_as_data(target_name):
    """The adapters' own call source (bundled pastes ~100 kB of its core) with a hostile
    tag, family, variant and refuse words: the same code and comments as a plain case's."""
    from harness.targets import load_target
    target = load_target(target_name)
    # The edge_rows family alone: the same case every family's list holds, without
    # generating the other families (about 2 CPU-seconds for the bundled target).
    case = next(c for c in target.cases(["edge_rows"], "ci")
                if c.id.endswith("/edge_rows.kv_empty/fp16-d64-h4x2-b1-lse"))
    row = {"outcome": "wrong", "pass": False, "message": "m", "commit": "c", "stage": "run"}

    def script(tag, family, variant, words):
        c = replace(case, tag=tag, family=family, variant=variant, refuse_words=tuple(words))
        return script_text(c, target, row, "harness repro x", {"disable_guards": "g"})

    plain = script("x", "x", "x", ["x", "x"])
    compile(plain, "<plain script>", "exec")

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(hostile, hostile, hostile, st.lists(hostile, min_size=2, max_size=2))
    def check(tag, family, variant, words):
        _assert_same_code_and_comments(script(tag, family, variant, words), plain)
    check()


@functools.lru_cache(maxsize=64)
def _parses_alone(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def _shared_tail(text: str, plain: str) -> str:
    """The longest suffix of both texts that starts a line and parses alone ('' if none)."""
    low, high = 0, min(len(text), len(plain))
    while low < high:      # the longest common suffix (endswith is C; the texts are ~100 kB)
        mid = (low + high + 1) // 2
        if text.endswith(plain[len(plain) - mid:]):
            low = mid
        else:
            high = mid - 1
    at = len(plain) - low
    if at and plain[at - 1] != "\n":
        at = plain.find("\n", at) + 1
    while at and not _parses_alone(plain[at:]):
        at = plain.find("\n", at) + 1
    return plain[at:] if at else ""


@functools.lru_cache(maxsize=8)
def _statements_and_comments(text: str) -> tuple[list[str], list[str]]:
    """Each top-level statement's masked AST (as _shape masks it) and the comments."""
    return [ast.dump(node) for node in _masked(ast.parse(text)).body], _comments(text)


def _assert_same_code_and_comments(text: str, plain: str) -> None:
    """What compile(text), _shape(text) == _shape(plain) and the same comments assert, for
    scripts that share a long tail (a registry adapter's pasted core, ~100 kB): the tail is
    read once, each script's head (what comes before it) alone.

    Why it is the same: the tail is a suffix of both that starts a line and parses alone; a
    head that parses alone ends outside any bracket, string or continuation, so head + tail
    tokenizes as the two token streams one after the other: the script's statements are the
    head's and then the tail's, and its comments the head's and then the tail's. The plain
    script compiles whole (the caller's), so both compile where the heads do. A head that
    does not parse alone is checked whole, as before."""
    tail = _shared_tail(text, plain)
    head, plain_head = text[:len(text) - len(tail)], plain[:len(plain) - len(tail)]
    try:
        tree = ast.parse(head)
    except SyntaxError:
        compile(text, "<hostile script>", "exec")
        assert _shape(text) == _shape(plain)
        assert _comments(text) == _comments(plain)
        return
    compile(tree, "<hostile script>", "exec")
    want_statements, want_comments = _statements_and_comments(plain_head)
    assert [ast.dump(node) for node in _masked(tree).body] == want_statements
    assert _comments(head) == want_comments


@given(hostile)
@settings(max_examples=50, deadline=None)
def test_guards_that_are_not_guard_names_are_refused_in_one_line(text):
    from harness.tools.standalone import Unavailable
    if re.fullmatch(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*", text) or not text:
        return
    fields = dict(route="fa2.single_prefill", family="f", variant="v", tag="t",
                  refuse_words=[], outcome="wrong", message="m", commit="c", stage=None,
                  guards=text, command="c")
    with pytest.raises(Unavailable, match="disable_guards") as why:
        _make(_Stand("bundled", "0"), fields)
    assert "\n" not in str(why.value) and str(why.value).isascii() or \
        all(c.isprintable() for c in str(why.value))


def test_the_literal_is_printable_ascii_and_reads_back():
    value = {"a\n'''": ["\x00\u2028\u202e", 1, 2.5, float("inf"), None, True],
             "t": ("x" * 120, "y"), "n": -(10 ** 30)}
    text = data_literal(value, width=40)
    assert text.isascii() and all(c.isprintable() or c == "\n" for c in text)
    assert eval(text) == value      # noqa: S307 - our own literal, the point of the test


def test_a_class_slug_that_is_not_a_plain_name_becomes_a_digest():
    assert file_slug("wrong-gqa.q12_over_kv8-0a1b2c3d") == "wrong-gqa.q12_over_kv8-0a1b2c3d"
    for bad in ("../x", "a/b", ".hidden", "a..b", "x\n", "\u202ex", "", "y" * 81):
        name = file_slug(bad)
        assert re.fullmatch(r"class-[0-9a-f]{12}", name), (bad, name)
    assert shown("id\x1b[2J\u202e\n") == "id\\x1b[2J\\u202e\\n"


@functools.lru_cache(maxsize=None)
def _all_cases(target_name: str) -> tuple:
    from harness.targets import load_target
    return tuple(generate_all_cases(load_target(target_name)))


def test_report_repros_of_a_hostile_table_write_inert_scripts(tmp_path, monkeypatch):
    """`report --repros`: a row whose message and commit hold the exploit and NUL bytes
    gives a script that compiles and whose top level calls nothing it was handed; guards
    that are no guard names give one line, not a script."""
    from harness.engine import session
    from harness.tools.standalone import write_class_repros
    # Each write_class_repros looks the class's case up among every case of the target: here
    # generated once for both tables, not again for the second.
    monkeypatch.setattr(session, "all_cases", lambda target: list(_all_cases(target.name)))
    case_id = "fa2.single_prefill/edge_rows.kv_empty/fp16-d64-h4x2-b1-lse"
    row = {"case_id": case_id, "route": "fa2.single_prefill", "family": "edge_rows",
           "outcome": "wrong", "pass": False, "severity": "correctness", "stage": "run",
           "message": "bad\x00" + EXPLOIT_TAG, "target": "bundled", "disable_guards": "all",
           "commit": EXPLOIT_TAG, "max_abs_diff": 1.0, "n_wrong": 1, "n_total": 4}
    done = write_class_repros([row], tmp_path / "repros")
    assert len(done) == 1, done
    slug, shown_id, where = done[0]
    assert shown_id == case_id and where == str(tmp_path / "repros" / f"{slug}.py"), done
    text = (tmp_path / "repros" / f"{slug}.py").read_text()
    compile(text, where, "exec")
    assert _run_top_level(text) == []
    assert "pwned" not in "".join(_comments(text)).lower()

    bad = dict(row, disable_guards=json.dumps(["merge_bound\n" + EXPLOIT_TAG, "x\x00"]))
    [(_, _, said)] = write_class_repros([bad], tmp_path / "bad")
    assert said.startswith("not written: disable_guards ") and said.isprintable(), said
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").iterdir())


@pytest.mark.system
def test_repro_of_a_hostile_case_file_writes_a_script_that_runs_no_injected_code(tmp_path,
                                                                                  capsys):
    """The reported attack, end to end: `repro ID --case-json evil.json --standalone -o x.py`
    and then `python x.py`, as the report tells a maintainer to. The tag's code would touch
    a marker file; the script runs, prints its verdict, and the marker never appears."""
    import argparse
    from harness.engine.session import all_cases
    from harness.targets import load_target
    from harness.tools.repro import cmd_repro
    from harness.tools.standalone import assert_harness_hidden, run_isolated
    marker = tmp_path / "pwned"
    case = next(c for c in all_cases(load_target("bundled"))
                if c.id == "fa2.single_prefill/edge_rows.kv_empty/fp16-d64-h4x2-b1-lse")
    tag = f"x\n'''\nimport pathlib; pathlib.Path({str(marker)!r}).touch()\n'''\u202e\x00"
    evil = replace(case, tag=tag)
    (tmp_path / "evil.json").write_text(json.dumps([evil.to_json()]))
    out = tmp_path / "x.py"
    args = argparse.Namespace(case_id=evil.id, target="bundled", disable_guards=None,
                              case_json=str(tmp_path / "evil.json"), cases_file=None,
                              json=True, verbose=False, in_process=False, case_timeout=None,
                              standalone=True, output=str(out))
    assert cmd_repro(args) == 0, capsys.readouterr().err
    assert_harness_hidden(tmp_path)
    done = run_isolated(out, tmp_path, timeout=300)
    assert done.returncode == 0 and "VERDICT match" in done.stdout, done.stdout + done.stderr
    assert not marker.exists()
    assert ascii(evil.id) in done.stdout          # the id is printed escaped, never raw
