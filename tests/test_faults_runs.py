"""Real `harness check` processes and real signals: one writer per table, children that die
with their parent, a watchdog outside the worker, whole rows on a full disk."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from fault_target import fault_case
from process_watch import marked, poll, worker_in_a_case
from harness.results import table

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")]


class Run:
    """One `harness check --target faults` over a cases file, its processes marked."""

    def __init__(self, tmp_path: Path, cases, slow_s: float = 0.0, name: str = "cases.json"):
        self.dir = tmp_path
        self.cases_file = tmp_path / name
        self.cases_file.write_text(json.dumps([c.to_json() for c in cases]))
        self.ids = {c.id for c in cases}
        self.results_dir = tmp_path / "results"
        self.mark = f"FAULTS_RUN_MARK={uuid.uuid4().hex}"
        key, value = self.mark.split("=")
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), FAULTS_SLOW_S=str(slow_s),
                        **{key: value})

    def argv(self, *extra) -> list[str]:
        # A table path of its own, not the default name: that name carries the checkout's
        # commit, and a commit made while the test runs would send a later run (the second
        # run on a held table, a resume) to another table.
        return [sys.executable, "-m", "harness", "check", "--target", "faults", "--cases-file",
                str(self.cases_file), "--results", str(self.results_dir / "faults.jsonl"),
                *extra]

    def start(self, *extra, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*extra), cwd=ROOT, env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def run(self, *extra, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        kw.setdefault("env", self.env)
        return subprocess.run(self.argv(*extra), cwd=ROOT, text=True, capture_output=True,
                              timeout=timeout, **kw)

    def table(self) -> Path | None:
        """The run's table: named by its lock as soon as a run holds it, before any row."""
        if not self.results_dir.exists():
            return None
        found = sorted(self.results_dir.glob("*.jsonl")) or [
            p.with_name(p.name[:-len(".lock")]) for p in self.results_dir.glob("*.jsonl.lock")]
        return found[0] if found else None

    def rows(self) -> list[dict]:
        path = self.table()
        return table.read_rows(path) if path is not None and path.exists() else []


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_second_run_on_a_held_table_exits_2_naming_it_and_the_holder(tmp_path):
    # The first run holds the table until the test ends it: its case outlasts any start-up
    # of the second run on a loaded machine (a 60 s case hit its timeout, the first run
    # ended, and the second found the table free and ran).
    run = Run(tmp_path, [fault_case("slow", i) for i in range(2)], slow_s=1200)
    first = run.start("-n", "0", "--case-timeout", "1500")
    try:
        path = poll(lambda: run.table() if run.table() and table.holder_of(run.table())
                    else None)
        holder = table.holder_of(path)
        assert holder == str(first.pid)
        for extra in ((), ("--resume",)):   # a fresh run, and a resume, during the run
            second = run.run("-n", "0", *extra)
            assert first.poll() is None, "the first run ended before the second was refused"
            assert second.returncode == 2, second.stderr[-2000:]
            lines = _error_lines(second.stderr)
            assert len(lines) == 1, second.stderr
            assert str(path) in lines[0] and f"pid {first.pid}" in lines[0]
        assert first.poll() is None                   # the holder runs on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    # SIGTERM is Ctrl-C: rows kept, the resume command printed, exit non-zero.
    assert first.returncode != 0
    assert "--resume" in err and "interrupted" in err, err
    poll(lambda: not marked(run.mark), timeout=60)
    done = run.run("-n", "0", "--resume", env=dict(run.env, FAULTS_SLOW_S="0"))
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["case_id"] for r in run.rows()]
    assert sorted(ids) == sorted(run.ids)


def test_kill_9_of_the_parent_leaves_no_process_and_resume_has_no_duplicates(tmp_path):
    run = Run(tmp_path, [fault_case("slow", i) for i in range(6)], slow_s=3)
    parent = run.start("-n", "2")
    poll(lambda: len(run.rows()) >= 1)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    # The pytest child and its xdist workers go with it (PR_SET_PDEATHSIG), none orphaned.
    poll(lambda: not marked(run.mark), timeout=60)
    kept = [r["case_id"] for r in run.rows()]
    assert kept and len(kept) == len(set(kept))
    done = run.run("-n", "2", "--resume", env=dict(run.env, FAULTS_SLOW_S="0"))
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["case_id"] for r in run.rows()]
    assert len(ids) == len(set(ids)) and set(ids) == run.ids
    assert set(kept) <= set(ids)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="the state folder is on /dev/shm")
def test_a_stopped_worker_is_ended_by_the_watchdog_and_its_case_is_a_hang_row(tmp_path):
    run = Run(tmp_path, [fault_case("slow", i) for i in range(3)], slow_s=4)
    parent = run.start("-n", "2", "--case-timeout", "8")
    try:
        # Inside the library's call, so the hang row's stage is "run" (a worker stopped
        # while it builds inputs is a hang at "build inputs").
        pid, case_id = poll(lambda: worker_in_a_case(run.mark, stage="run"))
        os.kill(pid, signal.SIGSTOP)   # its own timer thread stops with it
        out, err = parent.communicate(timeout=240)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 1, err[-3000:]
    rows = {r["case_id"]: r for r in run.rows()}
    assert set(rows) == run.ids
    hung = rows[case_id]
    assert hung["outcome"] == "hang" and hung["pass"] is False
    assert hung["stage"] == "run" and "watchdog" in hung["error_type"]
    assert [r["outcome"] for i, r in rows.items() if i != case_id] == ["match", "match"]
    assert pid not in marked(run.mark)


def test_a_torn_last_line_is_unwritten_and_the_resume_reruns_its_case(tmp_path):
    run = Run(tmp_path, [fault_case("none", i) for i in range(3)])
    first = run.run("-n", "0")
    assert first.returncode == 0, first.stderr[-2000:]
    path = run.table()
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    torn_id = json.loads(data[last_start:])["case_id"]
    path.write_bytes(data[: last_start + (len(data) - last_start) // 2])   # killed mid-write
    report = subprocess.run([sys.executable, "-m", "harness", "report", "--results", str(path),
                             "--out", str(tmp_path / "r.html")], cwd=ROOT, env=run.env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "torn" in report.stderr and "report: 2 rows" in report.stdout
    again = run.run("-n", "0", "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "torn" in again.stderr
    rows = table.read_rows(path)
    assert sorted(r["case_id"] for r in rows) == sorted(run.ids)
    assert path.read_bytes().endswith(b"\n") and rows[-1]["case_id"] == torn_id
    # A corrupt line elsewhere is one line and exit 2, from report and from a resume.
    lines = path.read_bytes().split(b"\n")
    lines[0] = lines[0][:40]
    path.write_bytes(b"\n".join(lines))
    for argv in ([sys.executable, "-m", "harness", "report", "--results", str(path), "--out",
                  str(tmp_path / "r.html")], run.argv("-n", "0", "--resume")):
        bad = subprocess.run(argv, cwd=ROOT, env=run.env, capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode == 2, bad.stderr
        lines_out = _error_lines(bad.stderr)
        assert len(lines_out) == 1 and f"{path}:1:" in lines_out[0], bad.stderr


def _file_size_limit(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a full disk's ENOSPC, as EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_stops_the_run_with_one_line_and_whole_rows(tmp_path):
    run = Run(tmp_path, [fault_case("none", i) for i in range(12)])
    (tmp_path / "probe").mkdir()
    probe = Run(tmp_path / "probe", [fault_case("none", 99)])
    assert probe.run("-n", "0").returncode == 0
    row_bytes = probe.table().stat().st_size
    done = run.run("-n", "0", preexec_fn=_file_size_limit(int(row_bytes * 3.5)))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = _error_lines(done.stderr)
    assert len(lines) == 2 and lines[0].startswith("check: 12 cases"), done.stderr
    assert "file-size limit" in lines[1] and "--resume" in lines[1], done.stderr
    assert "INTERNALERROR" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    path = run.table()
    assert path.read_bytes().endswith(b"\n")
    kept = [r["case_id"] for r in table.read_rows(path)]
    assert len(kept) == 3
    again = run.run("-n", "0", "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    ids = [r["case_id"] for r in run.rows()]
    assert sorted(ids) == sorted(run.ids)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_killed_from_outside_is_not_the_librarys_crash(tmp_path, sig):
    # A signal no library sends itself, dealt to a worker inside a case that is right: the
    # case completes alone in a fresh process, so the row is ours (failing), not a crash.
    run = Run(tmp_path, [fault_case("slow", 0)], slow_s=4)
    proc = run.start("-n", "1")
    try:
        found = poll(lambda: worker_in_a_case(run.mark, stage="run"), timeout=240)
        os.kill(found[0], sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = run.rows()
    assert [r["case_id"] for r in rows] == [found[1]]
    row = rows[0]
    assert row["outcome"] == "harness_error" and not row["pass"], row
    assert sig.name in row["message"] and "from outside" in row["message"], row["message"]
    assert proc.returncode != 0 and "PASS" not in out


def test_a_case_that_dies_of_sigkill_again_alone_is_the_librarys_crash(tmp_path):
    # The same signal raised by the case itself (as an OOM kill of its own allocation would
    # be) dies again in the fresh process: the library's crash.
    run = Run(tmp_path, [fault_case("sigkill", 0)])
    done = run.run("-n", "1")
    rows = run.rows()
    assert len(rows) == 1 and rows[0]["outcome"] == "crash", rows
    assert "SIGKILL" in rows[0]["message"] and "dies alone" in rows[0]["message"]
    assert done.returncode != 0


def test_a_death_while_the_inputs_are_built_is_ours_not_the_librarys(tmp_path):
    # No library code has run at "build inputs": a death there is the harness's or the
    # adapter's (as an exception there is), failing, never the library's crash.
    run = Run(tmp_path, [fault_case("segv_building", 0)])
    done = run.run("-n", "1")
    rows = run.rows()
    assert len(rows) == 1, rows
    assert (rows[0]["outcome"], rows[0]["stage"]) == ("harness_error", "build inputs"), rows
    assert "SIGSEGV" in rows[0]["message"] and "not the library's" in rows[0]["message"]
    assert done.returncode != 0
