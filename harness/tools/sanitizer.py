"""Replay results rows under NVIDIA compute-sanitizer and keep its first report on the row.

`harness check --sanitizer memcheck|initcheck|racecheck` runs the cases as usual, then
replays each failing row (every row with --sanitizer-all), one at a time, as

    compute-sanitizer --tool T --print-limit 1 --error-exitcode 99 \\
        python -m harness repro CASE_ID [--target T] [target options] [--cases-file F] \\
        --in-process --json

and stores what the tool reported first in the row's `sanitizer` column: which kernel, what
kind of access, how far from which allocation. `repro --in-process` runs the case in the
process the tool starts, so the tool sees its kernels without following children. The
sanitizer only adds information: it never changes a row's verdict or the run's exit status.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from harness.engine.check_options import SANITIZER_TOOLS
from harness.model.routes import DEFAULT_TARGET
from harness.results import table
from harness.results.sanitizer_report import report_of, where_text  # noqa: F401
from harness.results.repro_command import options_of, repro_args

TOOLS = SANITIZER_TOOLS   # declared with check's options (harness/engine/check_options.py)
EXECUTABLE = "compute-sanitizer"
ERROR_EXITCODE = 99
REPLAY_TIMEOUT_S = 600.0
ROOT = Path(__file__).resolve().parents[2]
# Where find_tool looks, in order, as usage errors name them.
PLACES = ("PATH", "$CUDA_HOME/bin", "/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer")


# ------------------------------------------------------------------ finding the tool

def find_tool() -> str | None:
    """The compute-sanitizer executable: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, then the
    toolkit's own compute-sanitizer folder; None when none of them has it."""
    found = shutil.which(EXECUTABLE)
    if found:
        return found
    folders = [os.path.join(os.environ["CUDA_HOME"], "bin")] if os.environ.get("CUDA_HOME") else []
    folders += ["/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer"]
    for folder in folders:
        candidate = os.path.join(folder, EXECUTABLE)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def gpu_visible() -> bool:
    import torch
    return bool(torch.cuda.is_available())


def preflight(tool: str | None, replay_all: bool) -> tuple[str | None, str | None]:
    """(the tool's path, None), or (None, one line naming the option and what is wrong).
    Asked before any case runs: a run that cannot be replayed would otherwise end with
    nothing to show for the option."""
    if tool is None:
        if replay_all:
            return None, f"--sanitizer-all: needs --sanitizer {'|'.join(TOOLS)} (the tool to replay under)"
        return None, None
    if not gpu_visible():
        return None, f"--sanitizer {tool}: needs a GPU (torch sees none)"
    path = find_tool()
    if path is None:
        return None, f"--sanitizer {tool}: {EXECUTABLE} not found (looked in {', '.join(PLACES)})"
    return path, None


# ------------------------------------------------------------------ one replay

def replay_command(case_id: str, target: str, options: Mapping | None, tool: str,
                   tool_path: str, cases_file: str | None = None) -> list[str]:
    """The tool around `repro --in-process --json` (harness/results/repro_command.py's arguments)."""
    argv = [tool_path, "--tool", tool, "--print-limit", "1",
            "--error-exitcode", str(ERROR_EXITCODE), sys.executable, "-m", "harness",
            *repro_args(case_id, target, options)]
    if cases_file:
        argv += ["--cases-file", str(cases_file)]
    # --in-process: the case runs in the process the tool starts; repro's default child would
    # need --target-processes all and a second torch start-up under the tool.
    return argv + ["--in-process", "--json"]


def replay_env() -> dict:
    from harness.engine.child import child_env
    env = child_env()
    # torch's caching allocator carves tensors out of large cudaMalloc blocks; an access past
    # a tensor's end but inside its block is a valid address to memcheck, so the overrun goes
    # unreported. Without the cache every tensor is its own allocation with its own bounds.
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    # The row's own target options, nothing inherited: repro sets each option's variable
    # from its flag.
    from harness.engine.session import declared_options
    from harness.model import target_options
    for name in [target_options.ENV, *(o.env for o in declared_options() if o.env)]:
        env.pop(name, None)
    return env


def _run_group(argv: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
    """Run argv in its own process group; (exit status or None on timeout, stdout + stderr).
    The group goes whole on a timeout or Ctrl-C: the tool's python child must not outlive it."""
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + "\n" + err
    except BaseException as stop:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = proc.communicate()
        if isinstance(stop, subprocess.TimeoutExpired):
            return None, (out or "") + "\n" + (err or "")
        raise


def replay(row_or_case_id: Mapping[str, Any] | str, target: str | None = None,
           options: Mapping | None = None, tool: str = "memcheck",
           timeout: float = REPLAY_TIMEOUT_S, *, tool_path: str | None = None,
           cases_file: str | None = None) -> dict | None:
    """Re-run one case under the tool: its first report (parse()), None when it reported
    nothing, or a report saying why there is no answer (the tool missing, the replay timed out).

    A row gives its case id, target and options ({name: value}); explicit arguments win."""
    if isinstance(row_or_case_id, Mapping):
        row = row_or_case_id
        case_id = str(row["case_id"])
        target = target or row.get("target") or None
        if options is None:
            options = options_of(row)
    else:
        case_id = str(row_or_case_id)
    tool_path = tool_path or find_tool()
    if tool_path is None:
        return no_report(tool, f"{EXECUTABLE} not found")
    argv = replay_command(case_id, target or DEFAULT_TARGET, options, tool, tool_path, cases_file)
    try:
        status, text = _run_group(argv, replay_env(), timeout)
    except OSError as e:
        return no_report(tool, f"{EXECUTABLE} did not start ({e.strerror or e})")
    report = parse(text, tool)
    if report is not None:
        return report
    if status is None:
        return no_report(tool, f"replay timed out after {timeout:g} s")
    if status not in (0, 1):   # repro's pass and fail; anything else: the case never ran through
        said = [l for l in text.splitlines() if l.strip() and not _PREFIXED.match(l)]
        return no_report(tool, f"the replay exited {status}" + (f": {said[-1].strip()}" if said else ""))
    return None


def no_report(tool: str, why: str) -> dict:
    """A report standing for "the tool gave no answer": never null, which means a clean run."""
    return {"tool": tool, "kind": "no report", "kernel": "", "access": None, "size": None,
            "address": None, "where": why, "source": "", "summary": f"{tool}: no report ({why})"}


# ------------------------------------------------------------------ parsing the tool's output

# Every line the tool writes starts with its prefix; the program's own output does not.
_PREFIXED = re.compile(r"^={5,} ?(.*)$")
# The first line of a report about a kernel (memcheck, initcheck, hardware exceptions).
_DEVICE_HEADER = re.compile(
    r"^(?:Invalid|Uninitialized|Misaligned|Malformed|Illegal|Out-of-range|Barrier error"
    r"|Warp |Lane |Device Hardware|Hardware|Stack overflow)\b")
_RACE_HEADER = re.compile(
    r"^(?:(?P<severity>Error|Warning|WARN|WARNING|ERROR|Info|INFO):\s*)?Race reported between\b")
_RACE_PAIR = re.compile(
    r"Race reported between (?P<first>\w+) access at\s*(?P<first_at>.*?)\s+and (?P<second>\w+) "
    r"access at\s*(?P<second_at>.*?)(?:\s*\[(?P<hazards>[\d,]+) hazards?\]|\s+and \w+ access|$)")
# A host API call that failed (usually the kernel's fault seen again by the next call).
_HOST_HEADER = re.compile(r"^Program hit\b")
# The tool's own failure ("Error: Device not supported", "Error: Target application terminated
# before first instrumented API call"): nothing was checked, so no answer, never a clean one.
_TOOL_ERROR = re.compile(r"^(?:Error|ERROR):\s*(?!Race reported)(?P<why>.+)$")
_SUMMARY = re.compile(r"^(?:ERROR SUMMARY: (?P<errors>[\d,]+) errors?"
                      r"|RACECHECK SUMMARY: (?P<hazards>[\d,]+) hazards?)")
_ACCESS = re.compile(r"__\w+__\s+(?:memory\s+)?(?P<access>read|write|atomic)\w*\s+of size\s+"
                     r"(?P<size>[\d,]+)", re.I)
_ADDRESS = re.compile(r"^(?:Address|Access to)\s+(?P<address>0x[0-9a-fA-F]+)")
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")
_SOURCE = re.compile(r"^\S+:\d+$")                             # file.cu:42
_OLD_LOCATION = re.compile(r"^0x[0-9a-fA-F]+ in (?P<rest>.+)$")  # PC offset first (CUDA 11)
_FILE_THEN_KERNEL = re.compile(r"^(?P<source>\S+?\.\w+:\d+):(?P<kernel>.+)$")


def _tool_lines(text: str) -> list[str]:
    """The tool's own lines, prefix removed and stripped (blank ones kept as '')."""
    out = []
    for line in text.splitlines():
        m = _PREFIXED.match(line.rstrip())
        if m:
            out.append(m.group(1).strip())
    return out


def _is_header(line: str) -> bool:
    return bool(_DEVICE_HEADER.match(line) or _RACE_HEADER.match(line) or _HOST_HEADER.match(line))


def _blocks(lines: list[str]) -> list[list[str]]:
    """Each report: its first line and the lines under it, up to a blank line, the next report
    or a summary."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if _is_header(line):
            current = [line]
            blocks.append(current)
        elif not line or _SUMMARY.match(line):
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def short_name(signature: str) -> str:
    """`void ns::kernel<(bool)0>(const float *, int)+0x1b0` -> `ns::kernel`."""
    s = _OFFSET.sub("", signature.strip())
    if s.endswith(")"):   # the argument list: the balanced group that ends the name
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    kept, depth = [], 0
    for i, ch in enumerate(s):   # template arguments: a '<' right after a name ('<unnamed>' stays)
        if ch == "<" and (depth or (i and (s[i - 1].isalnum() or s[i - 1] == "_"))):
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif not depth:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1] if words else signature.strip()


def _location(text: str) -> tuple[str, str]:
    """(kernel, file:line) from what follows `at`, in any of the tool's versions' forms:
    `kernel(...)+0x1b0 in file.cu:42`, `0x1b0 in file.cu:42:kernel(...)`, `0x1b0 in kernel`."""
    text = " ".join(text.split())
    old = _OLD_LOCATION.match(text)
    if old:
        rest = old.group("rest")
        both = _FILE_THEN_KERNEL.match(rest)
        return (short_name(both.group("kernel")), both.group("source")) if both else (short_name(rest), "")
    head, sep, tail = text.rpartition(" in ")
    if sep and _SOURCE.match(tail):
        return short_name(head), tail
    if sep and _SOURCE.match(head):
        return short_name(tail), head
    return short_name(text), ""


def _at_text(lines: list[str]) -> str:
    """The `at ...` line of a report, with its `in file:line` when the tool wrapped it."""
    for i, line in enumerate(lines):
        if line.startswith("at "):
            more = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("in ") else ""
            return (line[3:] + " " + more).strip()
    return ""


def _device_report(block: list[str]) -> dict:
    header, body = block[0], block[1:]
    access = _ACCESS.search(header)
    kernel, source = _location(_at_text(body)) if _at_text(body) else ("", "")
    address, where = None, ""
    for i, line in enumerate(body):
        found = _ADDRESS.match(line)
        if found:
            address = found.group("address")
            after = body[i + 1] if i + 1 < len(body) else ""
            # "and is 12 bytes after the nearest allocation at ..." says more than the address.
            where = after[4:] if after.startswith("and ") else line
            break
    return {"kind": header, "kernel": kernel, "source": source,
            "access": access.group("access").lower() if access else None,
            "size": int(access.group("size").replace(",", "")) if access else None,
            "address": address, "where": where}


def _race_report(block: list[str]) -> dict:
    severity = _RACE_HEADER.match(block[0]).group("severity")
    # Either access's location may be wrapped onto lines of its own: read the block as one line.
    race = _RACE_PAIR.search(" ".join(block))
    if race is None:   # a form this reader does not know: the header alone still says a race
        return {"kind": block[0], "kernel": "", "source": "", "access": None, "size": None,
                "address": None, "where": " ".join(block[1:])}
    kernel, source = _location(race.group("first_at"))
    where = f"and {race.group('second')} access at {race.group('second_at').strip()}"
    if race.group("hazards"):
        where += f" [{race.group('hazards')} hazards]"
    kind = (f"{severity}: " if severity else "") + (
        f"Race reported between {race.group('first')} access and {race.group('second')} access")
    return {"kind": kind, "kernel": kernel, "source": source,
            "access": race.group("first").lower(), "size": None, "address": None, "where": where}


def _host_report(block: list[str]) -> dict:
    text = block[0]
    for line in block[1:]:   # a quoted reason the tool wrapped onto the next line
        if text.count('"') % 2 == 0:
            break
        text += " " + line
    text = text.rstrip(".")
    kind, sep, where = text.partition(" due to ")
    return {"kind": kind, "kernel": "", "source": "", "access": None, "size": None,
            "address": None, "where": ("due to " + where) if sep else ""}


def _error_count(lines: list[str]) -> int:
    for line in lines:
        m = _SUMMARY.match(line)
        if m:
            return int((m.group("errors") or m.group("hazards")).replace(",", ""))
    return 0


def _guess_tool(lines: list[str]) -> str:
    if any(_RACE_HEADER.match(l) or l.startswith("RACECHECK SUMMARY") for l in lines):
        return "racecheck"
    if any(l.startswith("Uninitialized") for l in lines):
        return "initcheck"
    return "memcheck"


def summary_line(report: Mapping[str, Any]) -> str:
    text = f"{report['tool']}: {report['kind']}"
    if report.get("kernel"):
        text += f" in {report['kernel']}"
    if report.get("source"):
        text += f" ({report['source']})"
    where = where_text(report)
    return text + (f": {where}" if where else "")


def parse(text: str, tool: str | None = None) -> dict | None:
    """compute-sanitizer's first report in `text` as {tool, kind, kernel, access, size, address,
    where, source, summary}; None when it reported no error.

    A report about a kernel wins over a failed host API call: the call usually fails because
    of the kernel's fault, and the kernel is what the row needs named."""
    lines = _tool_lines(text)
    tool = tool or _guess_tool(lines)
    blocks = _blocks(lines)
    kernel_blocks = [b for b in blocks if not _HOST_HEADER.match(b[0])]
    tool_error = next((m.group("why") for m in map(_TOOL_ERROR.match, lines) if m), None)
    if kernel_blocks:
        block = kernel_blocks[0]
        fields = _race_report(block) if _RACE_HEADER.match(block[0]) else _device_report(block)
    elif tool_error:   # a failed API call after it is the tool's doing, not the case's
        return no_report(tool, f"{EXECUTABLE}: {tool_error}")
    elif blocks:
        fields = _host_report(blocks[0])
    else:
        errors = _error_count(lines)
        if not errors:
            return None
        fields = {"kind": f"{errors} error{'s' * (errors != 1)} in a report this harness does not "
                          f"read", "kernel": "", "source": "", "access": None, "size": None,
                  "address": None, "where": ""}
    report = {"tool": tool, **fields}
    report["summary"] = summary_line(report)
    return report


# ------------------------------------------------------------------ a run's table

def rows_to_replay(rows: list[dict], replay_all: bool) -> list[int]:
    """Indices of the rows to replay: failing ones, or every one that ran something (a skipped
    row never called the library: there is nothing to replay)."""
    return [i for i, row in enumerate(rows)
            if (replay_all and row.get("outcome") != "skipped") or not row.get("pass")]


def attach(path: str | os.PathLike, reports: Mapping[int, dict | None]) -> None:
    """Rewrite the table at `path` with reports[i] in row i's `sanitizer` column, every row
    kept in order. Written beside it and renamed over it: a failure leaves the old table."""
    path = Path(path)
    rows = table.read_rows(path)
    tmp = path.with_name(f".{path.name}.sanitizer-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        for i, row in enumerate(rows):
            if i in reports:
                row = dict(row, sanitizer=reports[i])
            table.append_row(tmp, row)
        table.sync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def replayed_line(case_id: str, tool: str, report: Mapping[str, Any] | None) -> str:
    """One console line per replayed row: case id, tool, kernel, and what the access was."""
    if report is None:
        return f"sanitizer: {case_id}: {tool}: no error reported"
    what = report["kind"] + (f"; {where_text(report)}" if report.get("where") else "")
    return f"sanitizer: {case_id}: {tool}: {report.get('kernel') or '-'}: {what}"


def replay_table(path: str | os.PathLike, tool: str, tool_path: str, target: str,
                 replay_all: bool = False, cases_file: str | None = None,
                 timeout: float = REPLAY_TIMEOUT_S,
                 say: Callable[[str], None] = print) -> int:
    """Replay the table's failing rows (every row with replay_all) one at a time, each case
    once, and write the reports into the table. Returns how many cases were replayed.

    Ctrl-C stops the replays; the reports so far are still written before it goes on."""
    rows = table.read_rows(path)
    wanted = rows_to_replay(rows, replay_all)
    by_case: dict[str, list[int]] = {}
    for i in wanted:
        by_case.setdefault(str(rows[i]["case_id"]), []).append(i)
    if not by_case:
        return 0
    print(f"check: replaying {len(by_case)} row(s) under {EXECUTABLE} {tool}", file=sys.stderr,
          flush=True)
    reports: dict[int, dict | None] = {}
    try:
        for case_id, indices in by_case.items():
            last = rows[indices[-1]]
            report = replay(last, target, options_of(last), tool, timeout,
                            tool_path=tool_path, cases_file=cases_file)
            reports.update({i: report for i in indices})
            say(replayed_line(case_id, tool, report))
    finally:
        if reports:
            attach(path, reports)
    return len(by_case)
