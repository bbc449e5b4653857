"""A cases file may carry every case the families generate: their `requires` name metadata
fields ("metadata.kv_lens") beside features (found on the H200: a cases file of misplanned
cases was refused before its first case)."""
import pytest

from cases import generate
from harness.model.cases_file import CasesFileError, check_records


def test_every_generated_case_passes_the_cases_file_check():
    records = [c.to_json() for c in generate(("misplanned", "restaged_indptr"))]
    assert any(r.get("requires") and any(x.startswith("metadata.") for x in r["requires"])
               for r in records)
    check_records(records, "cases.json")


def test_an_unknown_metadata_field_is_still_refused():
    records = [c.to_json() for c in generate(("misplanned",))][:1]
    records[0]["requires"] = ["metadata.kv_lenz"]
    with pytest.raises(CasesFileError, match="metadata.kv_lenz"):
        check_records(records, "cases.json")
