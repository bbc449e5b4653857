"""After the library's call, the worker's own steps meet a device the library may have left
poisoned: handing the cached blocks of a big case back (device_memory.release_cached), the
health probe. A device error in any of them is the library's: the case's row becomes its
`crash`, at the step where the error surfaced, and the worker retires before its next case
(which would otherwise inherit the dead context and its crash). None of these steps raises
past the row: a non-device error in one of ours is a note on the row (a `harness_error`
when the case had passed), never the library's."""
from __future__ import annotations

from dataclasses import dataclass

from harness.engine import device_memory, isolation

RELEASE_STAGE = "release cache"
PROBE_STAGE = "health probe"


@dataclass
class Late:
    stage: str      # where it surfaced
    text: str       # "<type>: <first line>"
    device: bool    # a device error (the library's), or an error of ours


def release(shares: int) -> Late | None:
    """Hand a big case's cached blocks back; what went wrong, never raised."""
    if not shares:
        return None
    try:
        device_memory.release_cached()
    except Exception as error:  # noqa: BLE001 - judged here, never past the row
        return Late(RELEASE_STAGE, _text(error), _is_device_fault(error))
    return None


def probe() -> Late | None:
    sick = isolation.health_probe()   # catches the device's error itself
    return Late(PROBE_STAGE, sick, True) if sick is not None else None


def judge(row: dict, late: Late | None, forked: bool) -> str | None:
    """Fold what surfaced after the call into the row; the reason to retire the worker, or
    None when its device is fine. `late` is the cache release's finding; the probe runs here."""
    if late is not None and not late.device:
        _note_ours(row, late)
        late = None
    late = late or probe()
    if late is None and not forked and _sticky(row):
        # The case's own crash or device error: the worker's context is gone with it. A crash
        # in a forked child poisoned that child, not this worker.
        late = Late(row.get("stage") or "", row.get("message") or str(row.get("outcome")), True)
    if late is None:
        return None
    if row.get("outcome") not in ("crash", "hang"):
        was = f" (case outcome was {row['outcome']}: {row['message']})" if row.get("message") \
            else f" (case outcome was {row.get('outcome')})"
        where = f", surfaced at {late.stage}" if late.stage else ""
        row.update(outcome="crash", **{"pass": False}, error_type="device error",
                   stage=late.stage or row.get("stage", ""),
                   message=f"sticky device error after the case{where}: {late.text}{was}")
    return late.text


def _note_ours(row: dict, late: Late) -> None:
    note = (f"harness error after the case: {late.stage} raised {late.text} "
            f"(not a device error)")
    if row.get("pass"):
        row.update(outcome="harness_error", **{"pass": False}, error_type=late.stage,
                   message=f"{note}; the case itself was {row.get('outcome')}")
    else:
        row["message"] = f"{row.get('message') or ''}; {note}".lstrip("; ")


def _sticky(row: dict) -> bool:
    return row.get("outcome") == "crash" or \
        isolation.is_sticky_device_error(row.get("message", "") or "")


def _is_device_fault(error: BaseException) -> bool:
    from harness.engine.execute import is_device_fault   # torch, only once something failed
    return is_device_fault(error) or isolation.is_sticky_device_error(str(error))


def _text(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
