"""An adapter's own error (an AttributeError in its run()) is a harness_error row naming
where it was raised, in every process that runs cases: never the library's crash or
refusal (check-target and repro run their cases in a child)."""
from __future__ import annotations

import json

from harness import cli

ADAPTER = '''
from harness.targets.bundled import BundledTarget


class Broken(BundledTarget):
    name = "broken"

    def run(self, case, problem, buffers):
        return [1, 2].tolist()          # the adapter's own bug


def make_target():
    return Broken()
'''

def test_an_adapters_attribute_error_is_ours_in_a_repro_child(tmp_path, capsys, forked_children):
    # The child is forked from a warm interpreter (tests/warm_children.py) and loads the
    # adapter from its file itself, as a spawned one does.
    adapter = tmp_path / "broken_adapter.py"
    adapter.write_text(ADAPTER)
    from harness.targets import load_target
    case = load_target(str(adapter)).cases(["valid"], "ci")[0]
    # The case handed to the child (--case-json), as check hands its workers theirs: looking
    # an id up among every profile's cases (repro's other way in) is no part of the subject,
    # and would generate all of them again in the child.
    (tmp_path / "case.json").write_text(json.dumps([case.to_json()]))
    capsys.readouterr()
    cli.main(["repro", case.id, "--target", str(adapter), "--json",
              "--case-json", str(tmp_path / "case.json")])
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["outcome"] == "harness_error" and row["severity"] == "harness", row
    assert "AttributeError" in row["message"] and "broken_adapter.py:9" in row["message"]
    assert "not the library's refusal" in row["message"]
