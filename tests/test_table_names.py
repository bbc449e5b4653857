"""Tables are named for the library under test: its declared name and its commit, found
where the library keeps its adapter; the harness's own commit is a column."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.engine import identity
from harness.model import platform_info
from harness.results import table

# A library's adapter with no commit(): the test-only faults target under its own name,
# with one case (so a run of it is a full run, whose table has no selection in its name).
ADAPTER = '''
import sys
from harness.targets import load_target

Faults = type(load_target("faults"))
fault_case = sys.modules[Faults.__module__].fault_case


class MiniLib(Faults):
    name = "minilib"

    def cases(self, families=None, profile="ci"):
        return [fault_case("none"), fault_case("wrong")]


def make_target():
    return MiniLib()
'''


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def library(tmp_path):
    lib = tmp_path / "minilib"
    lib.mkdir()
    git(lib, "init", "-q", "-b", "main")
    for key, value in (("user.email", "ci@example.invalid"), ("user.name", "ci"),
                       ("commit.gpgsign", "false")):
        git(lib, "config", key, value)
    (lib / "harness_adapter.py").write_text(ADAPTER)
    git(lib, "add", "harness_adapter.py")
    git(lib, "commit", "-q", "-m", "adapter")
    return lib, git(lib, "rev-parse", "--short", "HEAD")


def test_a_table_is_named_for_the_library_and_its_commit(library, tmp_path, capfd,
                                                          monkeypatch):
    lib, sha = library
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["check", "--target", "minilib/harness_adapter.py", "-n", "0",
                   "--results-dir", "out"])
    out, err = capfd.readouterr()
    assert rc == 1, out[-2000:] + err[-2000:]     # the wrong case fails, as it should
    arch = table.read_rows(next((tmp_path / "out").glob("*.jsonl")))[0]["arch"]
    made = tmp_path / "out" / f"minilib-{arch}-{sha}.jsonl"
    assert made.exists(), sorted(p.name for p in (tmp_path / "out").iterdir())
    assert (tmp_path / "out" / f"minilib-{arch}.jsonl").exists()   # the latest full run's copy
    rows = table.read_rows(made)
    assert len(rows) == 2
    assert {r["library_commit"] for r in rows} == {sha}
    assert {r["harness_commit"] for r in rows} == {platform_info.repo_commit()}
    assert platform_info.repo_commit().split("+")[0] not in made.name
    assert "library commit: unknown" not in out

    # The same table, now for one case of the two: the run says whose rows it replaces.
    rc = cli.main(["check", "--target", str(lib / "harness_adapter.py"), "-n", "0",
                   "--results", str(made), "--case-id", "none"])
    out, err = capfd.readouterr()
    assert rc == 0, out[-2000:] + err[-2000:]
    (line,) = [l for l in err.splitlines() if "replacing" in l]
    assert line.startswith(f"check: replacing {made}, a table of another selection (2 rows "), line
    assert "1 of its cases are not in this run, e.g. faults.single_prefill/faults.wrong/n0" in line


def test_without_a_repository_the_commit_is_unknown_and_said_once(library, tmp_path, capfd):
    lib, _ = library
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "adapter.py").write_text(ADAPTER)   # no repository holds this copy
    rc = cli.main(["check", "--target", str(loose / "adapter.py"), "-n", "0", "--case-id",
                   "none", "--results-dir", str(tmp_path / "out")])
    out, err = capfd.readouterr()
    assert rc == 0, out[-2000:] + err[-2000:]
    said = [l for l in (out + err).splitlines() if "unknown" in l]
    assert len(said) == 1 and said[0].startswith("library commit: unknown (the adapter has "
                                                 "no commit()"), out + err
    (made,) = (tmp_path / "out").glob("*.jsonl")
    assert made.name.startswith("minilib-") and "-v0.partial-case=none" in made.name, made.name
    assert {r["library_commit"] for r in table.read_rows(made)} == {"unknown"}


def test_the_commit_comes_from_the_adapter_first_then_its_repository(library, tmp_path):
    from harness.targets import load_target
    lib, sha = library
    target = load_target(str(lib / "harness_adapter.py"))
    assert identity.library_commit(target) == (sha, f"the git repository holding "
                                                    f"{lib / 'harness_adapter.py'}")
    type(target).commit = lambda self: "abc123"
    assert identity.library_commit(target)[0] == "abc123"
    # An adapter inside the harness's own checkout: the checkout's commit is the harness's.
    sdpa = load_target("faults")
    assert identity.library_commit(sdpa)[0] == "unknown"
    assert identity.table_key({"library_commit": "unknown", "target_version": "2.1 rc/1"}) \
        == "v2.1_rc_1"


@pytest.mark.system   # a plain `pytest` process over the pytest root is the subject
def test_a_plain_pytest_run_names_its_table_for_the_library_too(library, tmp_path):
    """`pytest harness/engine/pytest_root --target ...` without --results: the same name
    `harness check` gives, and the latest copy under the library's declared name."""
    from harness.engine import pytest_root
    lib, sha = library
    done = subprocess.run([sys.executable, "-m", "pytest", str(pytest_root.PATH), "-q",
                           "-p", "no:cacheprovider", "--target",
                           str(lib / "harness_adapter.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]   # wrong fails
    names = sorted(p.name for p in (tmp_path / "results").glob("*.jsonl"))
    arch = table.read_rows(tmp_path / "results" / names[0])[0]["arch"]
    assert names == [f"minilib-{arch}-{sha}.jsonl", f"minilib-{arch}.jsonl"], names
