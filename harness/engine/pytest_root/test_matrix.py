"""One test per case; the plugin parametrizes `case` (ids are case ids) and
writes the case's row to the results table."""
from harness.engine.plugin import run_case


def test_case(case, request):
    run_case(request, case)
