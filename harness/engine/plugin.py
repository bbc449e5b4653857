"""The pytest plugin: one test item per case, one results row per case.

Workers run cases and attach each case's row to its report; the controller
(or the lone process without xdist) writes rows as reports arrive, so a row
exists for every case whose final report arrived, including the report xdist
makes up for a worker that died mid-case. Hook order on the controller
(controller.py):

  pytest_handlecrashitem  -> read the dead worker's breadcrumbs (isolation.py)
  pytest_runtest_logreport -> the final attempt's report becomes one row;
                              "rerun" reports only count towards `reruns`.
"""
from __future__ import annotations

import os
import signal
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harness.engine import device_memory, fast_exit, forkserver, held_start, isolation
from harness.results import table
from harness.targets import label as target_label
from harness.model import budget, sizes
from harness.engine.perform import execute_repeated, failure_text, is_sticky, row_context
from harness.engine.row import case_row
from harness.engine.session import check_guard_names as session_check_guard_names
from harness.engine.session import ROW_KEY, RUN, Run, default_profile, get_run

from harness.model.routes import DEFAULT_TARGET  # noqa: E402


def pytest_addoption(parser):
    g = parser.getgroup("harness", "attention harness")
    g.addoption("--target", default=DEFAULT_TARGET, help="library under test [bundled]")
    g.addoption("--family", default=None, help="case families, comma-separated [all]")
    g.addoption("--route", default=None, help="routes, comma-separated [all the target's]")
    g.addoption("--case-id", default=None, help="only cases whose id contains this substring")
    g.addoption("--cases-file", default=None,
                help="run the cases in this JSON file (Case.to_json list) instead of families")
    g.addoption("--disable-guards", default=None,
                help="all|name,name: run the library without these guards (test use)")
    g.addoption("--results", default=None,
                help="results table path [results/<arch>-<commit>.jsonl]")
    g.addoption("--resume", action="store_true",
                help="skip cases that already have a row in --results; keep its run id")
    g.addoption("--case-timeout", type=float, default=None,
                help="seconds per case before it is a hang (plus a per-element allowance)")
    g.addoption("--run-id", default=None, help="run id recorded on every row")
    g.addoption("--no-replay", action="store_true",
                help="skip culprit replay of crashes (rows get isolation '' unless alone)")
    g.addoption("--profile", default=None, choices=("ci", "full"),
                help="how many cases: ci (minutes on 2 cores) or full [full with a GPU, else ci]")
    g.addoption("--repeat", type=int, default=None,
                help="run each case N times in its worker and compare the answers bitwise "
                     "[1 on the host, 2 with a GPU]")
    g.addoption("--max-case-bytes", type=int, default=None,
                help="a case whose inputs and reference are estimated past this many bytes is "
                     "a skipped row [half of MemAvailable]")


# ------------------------------------------------------------------ selection

def _new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def selection_of(config) -> str:
    return table.selection_slug(*(config.getoption(o) for o in
                                  ("family", "route", "case_id", "cases_file", "profile")))


def check_guard_names(value: str | None, target: str = DEFAULT_TARGET) -> None:
    """session.check_guard_names, as pytest's usage error."""
    try:
        session_check_guard_names(value, target)
    except ValueError as why:
        raise pytest.UsageError(str(why)) from None


def run_report(config, run: Run) -> dict:
    """What a held child tells `harness check` before it may go (harness/engine/held_start.py):
    the selected case ids, the arch that names a default table and whether the target owns
    its contract; or, when the options cannot make a run, {"error": one line}."""
    from harness.model import platform_info
    try:
        check_guard_names(config.getoption("disable_guards"), config.getoption("target"))
        setup_error = setup_errors(config)
        if setup_error:
            return {"error": setup_error}
        ids = [c.id for c in run.cases()]
        owns = bool(getattr(run.target(), "owns_contract", False))
        if not config.getoption("disable_guards") and os.environ.get(GUARDS_ENV):
            # Set by the user, not by --disable-guards: judged as the option would be, so an
            # unknown name is one line now instead of every case's harness_error row.
            try:
                session_check_guard_names(os.environ[GUARDS_ENV], config.getoption("target"))
            except ValueError as why:
                return {"error": f"{GUARDS_ENV}={os.environ[GUARDS_ENV]}: "
                                 + _one_line(why).replace("--disable-guards: ", "")}
    # An unknown name or file, or a target whose library is missing or cannot run here
    # (its message says what to install): one line, and nothing runs.
    except (pytest.UsageError, ValueError, OSError, RuntimeError, ImportError) as why:
        return {"error": _one_line(why)}
    return {"ids": ids, "arch": platform_info.arch(), "owns_contract": owns}


GUARDS_ENV = "KERNELS_DISABLE_GUARDS"
# The bundled library's platforms (kernels/build.py PLATFORMS), named here so the check
# needs no import of the library.
KERNEL_PLATFORMS = ("host", "nvidia", "amd")


def _one_line(why) -> str:
    text = " ".join(str(why).split())
    return text if len(text) <= 500 else text[:497] + "..."


def setup_errors(config) -> str | None:
    """Why this machine's set-up cannot make a run, in one line; None when it can.

    Each is ours (an environment variable, a cases file, an option), found before the first
    case, so no row blames the library for it."""
    plat = os.environ.get("KERNELS_PLATFORM", "").strip()
    if plat and plat not in KERNEL_PLATFORMS:
        return f"KERNELS_PLATFORM is {plat!r}; expected one of {', '.join(KERNEL_PLATFORMS)} (or unset)"
    cache = os.environ.get("KERNELS_CACHE_DIR")
    if cache:
        why = _unwritable(Path(cache))
        if why:
            return f"KERNELS_CACHE_DIR {cache} cannot hold the kernels' build cache ({why})"
    timeout = config.getoption("case_timeout")
    if timeout is not None and not 0 < timeout <= isolation_ceiling():
        return (f"--case-timeout {timeout:g}: must be above 0 and at most "
                f"{isolation_ceiling():g} s (the per-case ceiling)")
    limit = config.getoption("max_case_bytes")
    if limit is not None and limit <= 0:
        return f"--max-case-bytes {limit}: must be above 0"
    path = config.getoption("cases_file")
    if path:
        try:
            budget.load_cases_data(Path(path).read_text(encoding="utf-8"), str(path))
        except OSError as e:
            return f"--cases-file {path}: {e.strerror or e}"
        except UnicodeDecodeError:
            return f"--cases-file {path}: not UTF-8 text"
        except budget.CasesFileError as e:
            return f"--cases-file {e}"
    return None


def isolation_ceiling() -> float:
    return isolation.CASE_TIMEOUT_CEILING_S


def _unwritable(folder: Path) -> str | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return e.strerror or str(e)
    if not folder.is_dir():
        return "not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    return None


def _disable_guards_env(value: str | None, target: str) -> None:
    check_guard_names(value, target)
    if value:
        os.environ["KERNELS_DISABLE_GUARDS"] = value


# ------------------------------------------------------------------ configure

@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None:
        info = worker_input["harness"]
        # A worker whose controller is gone has no one to send its rows to.
        die_with_parent(signal.SIGKILL, info.get("controller_pid"))
        run = Run(config, True, worker=worker_input.get("workerid", "gw?"), run_id=info["run_id"],
                  state_dir=info["state_dir"], done_ids=frozenset(info["done_ids"]))
        config.stash[RUN] = run
        _prepare_device(run.worker)
        return
    bad = held_env_error()
    if bad:
        stop_now(config, None, bad)
    if held_start.is_held():
        # SIGTERM (the plugin's handler makes it Ctrl-C): the rows in flight are written and
        # the workers end, whether `harness check` exited or was killed with -9.
        die_with_parent(signal.SIGTERM, _int_or_none(os.environ.get(PARENT_PID_ENV)))
    run = Run(config, False)
    config.stash[RUN] = run
    if _workers_start_first(config):
        # Under `harness check`, with xdist workers and nothing to resume: the workers start
        # (each importing torch, seconds on a GPU box) while this process works out the run
        # and its parent decides. Nothing is written before the go either way.
        _prepare_workers(config, run, validated=False)
        config.pluginmanager.register(_SettleBeforeCollection(run), "harness-settle")
        return
    _hold(config)
    if config.getoption("collectonly"):
        return
    _prepare_workers(config, run, validated=True)
    _settle(config, run)


# Set by `harness check` for its pytest child: the pid whose death ends the run.
PARENT_PID_ENV = "HARNESS_PARENT_PID"
# The start of the one line a run that cannot go on leaves on stderr; `harness check`
# shows these lines alone instead of the end of pytest's log.
STOP_PREFIX = "harness: error: "


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux's
    PR_SET_PDEATHSIG); elsewhere a thread that watches the parent pid. `parent` is the pid
    the parent had: a parent that died before this call is caught too."""
    parent = parent or os.getppid()
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, int(sig), 0, 0, 0) == 0   # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
        return
    if armed:
        return
    import threading

    def watch():
        import time
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), sig)
    threading.Thread(target=watch, name="harness-parent-watch", daemon=True).start()


def held_env_error() -> str | None:
    """One line when the held-start variables name no pipe (set by hand, or left over in
    an environment): else the wait for the go dies in a traceback."""
    for name in (held_start.GO_FD_ENV, held_start.REPORT_FD_ENV):
        value = os.environ.get(name)
        if value is None:
            continue
        fd = _int_or_none(value)
        if fd is None or fd < 0:
            return (f"{name}={value!r}: not a file descriptor; it is set by `harness check` "
                    f"for its own pytest child (unset it to run pytest directly)")
        try:
            os.fstat(fd)
        except OSError:
            return (f"{name}={value}: no such open file descriptor; it is set by `harness check` "
                    f"for its own pytest child (unset it to run pytest directly)")
    return None


def stop_now(config, run: Run | None, line: str) -> None:
    """End the run before it writes a row: the one line on stderr, the workers (when xdist
    started them already) and the breadcrumbs gone, exit status 2."""
    print(STOP_PREFIX + line, file=sys.stderr, flush=True)
    dsession = config.pluginmanager.getplugin("dsession")
    manager = getattr(dsession, "nodemanager", None)
    if manager is not None:
        manager.group.terminate(0.5)
    if run is not None and run.state_dir:
        import shutil
        shutil.rmtree(run.state_dir, ignore_errors=True)
    fast_exit.exit_now(2)


def _workers_start_first(config) -> bool:
    return (held_start.is_held() and not config.getoption("resume")
            and not config.getoption("collectonly")
            and config.pluginmanager.hasplugin("xdist")
            and config.getoption("dist", "no") != "no")


def _hold(config) -> None:
    """A held child reports the run and waits for the go (harness/engine/held_start.py)."""
    run = config.stash[RUN]
    if held_start.is_held():
        held_start.send_report(run_report(config, run))
    results = held_start.wait_for_go()   # before anything is written
    if results is not None:
        config.option.results = results


def _prepare_workers(config, run: Run, validated: bool) -> None:
    """What xdist's workers inherit or are sent when they are spawned."""
    if validated:
        _disable_guards_env(config.getoption("disable_guards"), config.getoption("target"))
    elif config.getoption("disable_guards"):
        # Checked in the report (run_report): a bad name calls the run off before the go.
        os.environ["KERNELS_DISABLE_GUARDS"] = config.getoption("disable_guards")
    if config.pluginmanager.hasplugin("xdist") and config.getoption("maxworkerrestart", None) is None:
        # Every crash costs a worker; xdist's default (4 per worker) would end the run.
        config.option.maxworkerrestart = "1000000"
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        # Host kernels and the CPU reference each use every core by default;
        # N workers doing that oversubscribe the machine N-fold.
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    if config.getoption("max_case_bytes"):
        os.environ[budget.CEILING_ENV] = str(config.getoption("max_case_bytes"))
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # SIGTERM ends the run like Ctrl-C: finished rows are on disk already,
        # and sessionfinish still records what is pending.
        signal.signal(signal.SIGTERM, _sigterm)
    if not config.getoption("resume"):   # else the run id comes from the table: _settle
        _name_run(config, run, config.getoption("run_id") or _new_run_id())


def _name_run(config, run: Run, run_id: str) -> None:
    """The run id and the breadcrumb folder, which xdist sends each worker at its spawn."""
    run.run_id = run_id
    run.state_dir = isolation.state_tempdir()
    if config.pluginmanager.hasplugin("xdist"):
        from harness.engine.controller import XdistHooks
        config.pluginmanager.register(XdistHooks(run), "harness-xdist")


def _settle(config, run: Run) -> None:
    """The rest, once released: the scheduling, the table, the controller's hooks."""
    _one_case_at_a_time(config, _selected(run))
    given = config.getoption("results")
    selection = selection_of(config)
    run.results = Path(given) if given else table.default_results_path(
        target_label(config.getoption("target")), selection)
    run.default_results = not given and not selection
    try:
        # For the run's whole life (the descriptor closes with this process): one writer.
        run.table_lock = table.TableLock.acquire(run.results, adopt_parent=held_start_parent())
    except table.TableBusy as busy:
        stop_now(config, run, str(busy))
    except OSError as e:
        stop_now(config, run, f"cannot lock the results table {run.results} "
                              f"({e.strerror or e}); choose another --results or --results-dir")
    try:
        if config.getoption("resume"):
            if table.drop_torn_tail(run.results):
                print(f"results: {run.results}: its torn last line was cut off; that case "
                      f"runs again", file=sys.stderr)
            run.done_ids = frozenset(table.done_case_ids(run.results))
            _name_run(config, run, config.getoption("run_id") or table.last_run_id(run.results)
                      or _new_run_id())
        elif run.results.exists():
            # A new file renamed over the old: never a moment without a table, and a reader
            # that has the old one open reads it whole.
            table.replace_with(run.results)
    except table.TableError as bad:
        stop_now(config, run, f"{bad}; fix or move the table, or run without --resume")
    except OSError as e:
        stop_now(config, run, f"cannot write the results table {run.results} "
                              f"({e.strerror or e}); choose another --results or --results-dir")
    from harness.engine.controller import Controller, ReplayQueue
    run.replays = ReplayQueue(run)
    controller = Controller(run)
    config.pluginmanager.register(controller, "harness-controller")
    controller.start_watchdog(config)


def held_start_parent() -> bool:
    """Whether `harness check` started this process (and so locked the table first)."""
    return os.environ.get(PARENT_PID_ENV) is not None and \
        _int_or_none(os.environ.get(PARENT_PID_ENV)) == os.getppid()


class _SettleBeforeCollection:
    """Early workers' controller: the report, the go and the rest come after xdist has
    spawned the workers (its sessionstart) and before the run's loop (collection)."""

    def __init__(self, run: Run):
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session):
        config = session.config
        try:
            _hold(config)
        except SystemExit:
            # Called off: the workers (still starting) go with this process, at once.
            dsession = config.pluginmanager.getplugin("dsession")
            manager = getattr(dsession, "nodemanager", None)
            if manager is not None:
                manager.group.terminate(0.5)
            import shutil
            shutil.rmtree(self.run.state_dir, ignore_errors=True)
            fast_exit.exit_now(held_start.EXIT_CALLED_OFF)
        _settle(config, self.run)


# ------------------------------------------------------------------ exit

_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    # After every other sessionfinish: the rows are synced and xdist's workerfinished is sent.
    session.config.stash[_EXIT_STATUS] = int(session.exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # The last thing pytest does before it returns its exit status: under `harness check`,
    # leave now instead of paying the interpreter's teardown (harness/engine/fast_exit.py).
    if fast_exit.wanted() and _EXIT_STATUS in config.stash:
        fast_exit.exit_now(config.stash[_EXIT_STATUS])


def _prepare_device(worker: str) -> None:
    """Spread workers over the host's GPUs (worker gwN runs on device N mod count), and make
    the device context in the background.

    One worker group per device, so `-n 16` on a host of 8 GPUs puts two workers
    on each. Nothing to do on a CPU-only machine (torch.cuda.is_available() does
    not initialize a device context, so the check is free there).
    """
    import torch
    if not worker.startswith("gw") or not torch.cuda.is_available():
        return
    count = torch.cuda.device_count()
    index = int(worker[2:]) % count if count > 1 else 0
    if count > 1:
        torch.cuda.set_device(index)
    # The device context (0.3 s alone, ~2 s when 16 workers start at once) is made while this
    # worker collects its cases. torch initializes under a lock, so a case that reaches the
    # device first waits for it; one that fails is raised again by the case's first call.
    import threading
    threading.Thread(target=_make_context, args=(index,), name="harness-device-context",
                     daemon=True).start()


def _make_context(index: int) -> None:
    import torch
    try:
        torch.empty(1, device=f"cuda:{index}")   # the first allocation makes the context
    except Exception:  # noqa: BLE001 - the first case's own device call raises it again
        pass


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# ------------------------------------------------------------------ collection

def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    run = get_run(metafunc.config)
    cases = heaviest_first([c for c in run.cases() if c.id not in run.done_ids])
    metafunc.parametrize("case", cases, ids=[c.id for c in cases])


# A case at or above this much work (q.k products x heads x head_dim) starts before the rest.
HEAVY_WORK = 1 << 28


def heaviest_first(cases: list) -> list:
    """The heavy cases first, heaviest first, each followed by one light case; the rest in
    generation order.

    Workers pick cases up in this order (xdist hands each worker two cases, then one at a
    time: see _one_case_at_a_time), so no long-context case starts last and holds one worker
    long after the others are done, and no two of them start on the same worker: on the
    H200 the full profile's eight long_kv_full cases, handed out in xdist's default chunks
    (a quarter of each worker's share, contiguous), all went to one worker, which ran them
    one after the other for 130 s after the other 2,990 rows were done. Every process
    sorts alike, as xdist needs."""
    work = {c.id: sizes.case_work(c.params) for c in cases}
    heavy = sorted((c for c in cases if work[c.id] >= HEAVY_WORK), key=lambda c: -work[c.id])
    light = [c for c in cases if work[c.id] < HEAVY_WORK]
    ordered = []
    for i, case in enumerate(heavy):
        ordered += [case, *light[i:i + 1]]
    return ordered + light[len(heavy):]


def _one_case_at_a_time(config, cases: list) -> None:
    """With a heavy case selected, xdist's load scheduling in its smallest chunks: two cases
    to each worker at first, then one to whichever worker is free. Its default first
    hand-out (a contiguous quarter of each worker's share) would give one worker every
    heavy case heaviest_first put first. Without one the default chunks stay: one
    scheduling message per case cost the 1,845-case ci profile 0.9 s on 2 cores."""
    option = config.option
    if getattr(option, "dist", None) == "load" and getattr(option, "maxschedchunk", 0) is None \
            and any(sizes.case_work(c.params) >= HEAVY_WORK for c in cases):
        option.maxschedchunk = 1


def _selected(run: Run) -> list:
    """The run's cases, or none when the selection is bad: collection then says why."""
    try:
        return run.cases()
    except Exception:  # noqa: BLE001 - reported by pytest_generate_tests, with its message
        return []


# ------------------------------------------------------------------ worker side

def _worker_state(run: Run) -> isolation.WorkerState:
    if run.state is None:
        state_dir = run.state_dir or isolation.state_tempdir()
        run.state_dir = state_dir
        run.state = isolation.WorkerState(state_dir, run.worker)
    return run.state


def run_case(request, case) -> dict:
    """The test body: execute the case, attach its row, fail when it fails."""
    run = get_run(request.config)
    item = request.node
    state = _worker_state(run)
    target = run.target()
    if run.context is None:
        run.context = row_context(target)
    if state.data.get("context") is None:
        state.set_context(run.context)
    # A rerun must never report the previous attempt's row if this attempt raises.
    item.user_properties[:] = [p for p in item.user_properties if p[0] != ROW_KEY]
    shares = device_memory.shares_for(case.params, device_memory.total_device_bytes())
    with device_memory.held(run.state_dir, shares):   # before the hang timer starts
        state.begin(case.id, run.timeout_for(case))
        row = None
        forked = forkserver.forks_each(target, case)
        try:
            if forked:
                row = forkserver.forked_row(case, run.opt("target"), target, run.repeat(),
                                       run.timeout_for(case), run.context)
            else:
                result, attempts = execute_repeated(case, target, run.repeat(),
                                                    on_stage=state.stage)
        finally:
            state.end(case.id)
        if shares:
            device_memory.release_cached()
    if row is None:
        row = case_row(case, result, attempts=attempts, repeat=run.repeat(),
                       profile=run.opt("profile") or default_profile(), **run.context)
    else:
        row["profile"] = run.opt("profile") or default_profile()
    sick = isolation.health_probe()
    if sick is None and is_sticky(row) and not forked:
        # A crash in a forked child poisoned that child, not this worker.
        sick = row["message"]
    if sick is not None:
        run.retire_reason = sick
        if row["outcome"] not in ("crash", "hang"):
            row.update(outcome="crash", **{"pass": False}, error_type="device error",
                       message=f"sticky device error after the case: {sick}"
                               + (f" (case outcome was {row['outcome']}: {row['message']})"
                                  if row["message"] else ""))
    item.user_properties[:] = [p for p in item.user_properties if p[0] != ROW_KEY]
    item.user_properties.append((ROW_KEY, row))
    if not row["pass"]:
        pytest.fail(failure_text(row), pytrace=False)
    return row


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    run = item.config.stash.get(RUN, None)
    if run is not None and run.retire_reason and run.state is not None and run.is_worker:
        # The device is unusable: leave before this case starts; the
        # controller reschedules it on a fresh worker.
        run.state.retire(run.retire_reason)
