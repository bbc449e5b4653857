"""A gate that lets a heavy case use the device alone, so parallel workers never starve each
other of its memory.

Every worker of a run shares one GPU. A case estimated (harness/model/budget.py
device_bytes_estimate, plus what the adapter declares) at more than its even share of the
device is heavy: it holds the gate exclusively while it runs. Every other case holds it
shared. So a heavy case waits for the light cases in flight to finish, and a case that comes
after waits for the heavy one: it meets no other case's tensors on the device.

Light means at most LIGHT_SHARE x device memory / workers: when every case in flight is
light, all of them together need at most LIGHT_SHARE of the device (the estimate errs high),
and the rest holds each worker's own context and what its allocator keeps. (Measured on an
H200 with 16 workers: `rows_past_2_31_*` at 4.6 GiB plus a device snapshot each, and
`offset_past_2_31*` at 16 GiB, ran at once and ran the device out of memory.)

The locks are flocks on files in the run's state folder (run.state_dir, which every worker
of the run shares; one folder per device, for the workers that share it), so a worker that dies, even killed by the watchdog mid-case, frees the
gate with its file descriptors: the gate can never outlive its holder.

Three files:
  gate.main   the gate: shared for a light case, exclusive for a heavy one;
  gate.turn   a turnstile held only while taking gate.main, so a heavy case waiting for the
              light cases in flight stops new light ones from overtaking it (flock on its own
              lets shared takers starve an exclusive one forever);
  gate.want   held shared by a heavy case from before it queues until it is done: a light
              case that finishes while it is held hands its allocator's cached blocks back,
              so what the heavy case needs is free on the device, not cached by an idle worker.

Deadlock-free: a worker holds gate.main only while a case runs, and a case never takes the
gate again while holding it (the retry below lets go first). The caller holds the gate inside
the device memory shares (harness/engine/device_memory.py), never the other way round: a
worker waiting at the gate may hold shares, but no worker ever waits for shares while
holding the gate. Waiting is no part of a case's time: the caller starts the case's hang
timer after the gate is held.

On a machine without a GPU, or where one worker has the device to itself, the gate does
nothing: there is no one to share the device with.

The retry: an out-of-memory error raised while the harness builds a case's inputs (the
stage before the library's call) is the harness's own, and when other workers share the
device it can be theirs: a light case's estimate was low, or an idle worker still caches
blocks. Such a case is run once more holding the gate exclusively, and its row is that run's
verdict. An out-of-memory error in the library's call is the library's outcome and is never
retried; nothing else is.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

# The share of the device's memory the light cases in flight may use between them (above).
LIGHT_SHARE = 0.75
# Where pytest-xdist tells each worker how many workers the run has.
WORKERS_ENV = "PYTEST_XDIST_WORKER_COUNT"
# Stages that are the harness's own allocation, before the library is called (the stage
# harness/engine/execute.py sets first; an adapter's first stage of its own is the library's).
OURS_STAGES = ("build inputs",)
MAIN, TURN, WANT = "gate.main", "gate.turn", "gate.want"


def run_workers() -> int:
    """How many workers the run has (1 outside xdist, or where the value is no count)."""
    try:
        return max(1, int(os.environ.get(WORKERS_ENV, "1")))
    except ValueError:
        return 1


def is_heavy(need_bytes: int, total_bytes: int, workers: int) -> bool:
    """Whether a case needing need_bytes must run alone: more than its even share of
    LIGHT_SHARE of the device's memory."""
    return total_bytes > 0 and need_bytes * max(1, workers) > LIGHT_SHARE * total_bytes


def is_out_of_memory(error: BaseException) -> bool:
    """An allocator's out-of-memory error (torch.OutOfMemoryError, older torch's
    torch.cuda.OutOfMemoryError)."""
    import torch
    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None),
                              getattr(torch.cuda, "OutOfMemoryError", None)) if k is not None)
    return bool(kinds) and isinstance(error, kinds)


def _release_cached() -> None:
    from harness.engine.device_memory import release_cached
    release_cached()


class Gate:
    """One case's place at the gate. `active` is False where there is nothing to share
    (no folder, no device, one worker): then every method is a no-op."""

    def __init__(self, folder: str | os.PathLike | None, need_bytes: int, total_bytes: int,
                 workers: int, release: Callable[[], None] = _release_cached):
        self.folder = Path(folder) if folder else None
        self.workers = workers
        self.active = self.folder is not None and total_bytes > 0 and workers > 1
        self.heavy = self.active and is_heavy(need_bytes, total_bytes, workers)
        self.exclusive = False
        self.retried = False
        self._release = release
        self._files: list = []

    # ---- taking and letting go

    def take(self, exclusive: bool) -> None:
        """Blocks until the gate is held (exclusively or shared)."""
        if not self.active:
            return
        if exclusive:
            want = self._open(WANT)
            fcntl.flock(want, fcntl.LOCK_SH)
            self._files.append(want)
        main = self._open(MAIN)
        turn = self._open(TURN)
        try:
            if not _try(turn, fcntl.LOCK_EX):
                # Another taker's turn: only a heavy case's is worth this worker's cache.
                if exclusive or self._heavy_waiting():
                    self._idle()
                fcntl.flock(turn, fcntl.LOCK_EX)
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            if not _try(main, mode):
                self._idle()
                fcntl.flock(main, mode)
        except BaseException:
            main.close()
            self.let_go()   # gate.want too: a taker that never got in holds nothing
            raise
        finally:
            turn.close()   # closing a file lets go of its lock
        self._files.append(main)
        self.exclusive = exclusive

    def let_go(self) -> None:
        for f in reversed(self._files):
            f.close()
        self._files = []
        self.exclusive = False

    def release_cache(self) -> bool:
        """Whether the case's worker should hand its cached blocks back before letting go
        (harness/engine/after_call.release does it, judging any device error as the
        library's): after a heavy case, and whenever a heavy case is waiting."""
        if not self.active:
            return False
        return self.heavy or self.exclusive or self._heavy_waiting()

    def _heavy_waiting(self) -> bool:
        """Whether a heavy case waits for the gate or holds it (it holds gate.want shared)."""
        try:
            with self._open(WANT) as want:
                return not _try(want, fcntl.LOCK_EX)
        except OSError:
            return True   # cannot tell: handing the cache back is never wrong, only slower

    def _idle(self) -> None:
        """About to wait: hand back what this worker's allocator caches, which the case
        being waited for may need. Between cases: the last case's own device errors were
        judged with its row, and a new one surfaces again at the next case's first call."""
        try:
            self._release()
        except Exception:  # noqa: BLE001 - see above: judged where it surfaces next
            pass

    def _open(self, name: str):
        return open(self.folder / name, "a")

    # ---- the retry of the harness's own out-of-memory error

    def wants_retry(self, result=None, error: BaseException | None = None,
                    stage: str = "") -> bool:
        """Whether a case that ended so is run once more with the gate held exclusively:
        an out-of-memory error in one of OURS_STAGES, raised (`error`, at `stage`) or
        booked by execute as a harness_error (`result`), in an active gate not yet retried."""
        if not self.active or self.retried:
            return False
        if error is not None:
            return stage in OURS_STAGES and is_out_of_memory(error)
        return (result is not None and getattr(result, "outcome", None) == "harness_error"
                and getattr(result, "stage", None) in OURS_STAGES
                and getattr(result, "error_type", None) in ("OutOfMemoryError",)
                and "out of memory" in (getattr(result, "message", "") or ""))

    def run(self, attempt: Callable, on_stage: Callable[[str], None] | None = None,
            pause: Callable[[], None] | None = None, resume: Callable[[], None] | None = None):
        """attempt(on_stage): the case's (result, attempts); once more, alone on the device,
        when wants_retry says so. pause/resume stop and restart the case's hang timer around
        the wait for the exclusive gate (the wait is no part of the case's time)."""
        stages: list[str] = []

        def watch(name: str) -> None:
            stages.append(name)
            if on_stage is not None:
                on_stage(name)

        try:
            outcome = attempt(watch)
        except Exception as error:
            if not self.wants_retry(error=error, stage=stages[-1] if stages else ""):
                raise
        else:
            if not self.wants_retry(result=outcome[0]):
                return outcome
        self.retried = True
        if pause is not None:
            pause()
        self.let_go()
        self._idle()   # this worker's own cached blocks first
        self.take(exclusive=True)
        if resume is not None:
            resume()
        result, *rest = attempt(on_stage)
        return (_noted(result), *rest)


RETRY_NOTE = ("run again alone on the device after the harness's own out-of-memory error "
              "while building its inputs (that run never reached the library)")


def _noted(result):
    from dataclasses import is_dataclass, replace
    if not is_dataclass(result) or not hasattr(result, "message"):
        return result
    return replace(result, message=f"{result.message}; {RETRY_NOTE}" if result.message
                   else RETRY_NOTE)


def _try(f, mode: int) -> bool:
    """Takes the lock if it is free now; False when another holder keeps it."""
    try:
        fcntl.flock(f, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def held(gate: Gate):
    """The gate held (shared, or exclusively for a heavy case) while the body runs."""
    gate.take(exclusive=gate.heavy)
    try:
        yield gate
    finally:
        gate.let_go()


def sharing_workers(workers: int, devices: int) -> int:
    """How many of a run's workers share one device at most: workers go round the host's
    devices (harness/engine/plugins/worker.py prepare_device: gwN on device N mod count)."""
    return -(-max(1, workers) // max(1, devices))


def for_case(folder, case, extra_bytes: int = 0) -> Gate:
    """The gate for a case in this worker: its device estimate, the adapter's declared bytes
    (Target.estimate_bytes), the device's memory and how many workers share the device. One
    gate per device (a folder of its own under the run's): workers on another GPU of the host
    are not in the way."""
    from harness.engine.device_memory import total_device_bytes
    total = total_device_bytes()
    if not total or not folder:
        return Gate(None, 0, 0, 1)
    import torch
    from harness.model.budget import device_bytes_estimate
    from harness.model.routes import op_of
    index = torch.cuda.current_device()
    place = Path(folder) / f"gate-device{index}"
    place.mkdir(exist_ok=True)
    need = device_bytes_estimate(dict(case.params), op_of(case.route)) + extra_bytes
    return Gate(place, need, total, sharing_workers(run_workers(), torch.cuda.device_count()))
