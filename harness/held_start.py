"""A child process started before its parent has decided to run it, and held until then.

`harness check` starts its pytest child first, so that the two start-ups (an interpreter,
pytest, torch: about a second each) overlap, and validates the run meanwhile. The child
waits at its first hook, before it writes anything, for one message on a pipe: "go" and
the results table's path, or the pipe closed without it (the run is called off, and the
child exits having written nothing).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

GO_FD_ENV = "HARNESS_GO_FD"
# The exit status of a child whose run was called off (its parent has said why).
EXIT_CALLED_OFF = 2


class HeldChild:
    """A held child: go(results) releases it, call_off() ends it."""

    def __init__(self, cmd: list[str], cwd, env: dict, quiet: bool):
        # quiet: pytest's console goes to a log file (shown only when pytest itself fails).
        self.log = tempfile.NamedTemporaryFile(prefix="harness-check-", suffix=".log",
                                               delete=False) if quiet else None
        read_end, self._go = os.pipe()
        env = dict(env, **{GO_FD_ENV: str(read_end)})
        try:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log,
                                         stderr=None if self.log is None else subprocess.STDOUT,
                                         pass_fds=(read_end,))
        finally:
            os.close(read_end)

    def go(self, results: Path) -> None:
        os.write(self._go, b"go\t" + os.fsencode(results))
        os.close(self._go)

    def call_off(self) -> None:
        os.close(self._go)
        # It has written nothing (it writes only once released): no need to wait for its
        # start-up to end only to read the closed pipe.
        self.proc.kill()
        self.proc.wait()
        if self.log is not None:
            self.log.close()
            os.unlink(self.log.name)


def wait_for_go() -> str | None:
    """In the child: the results table's path once released; None when not held; exits
    (EXIT_CALLED_OFF) when called off. The variable is popped so xdist workers never wait."""
    fd = os.environ.pop(GO_FD_ENV, None)
    if fd is None:
        return None
    with os.fdopen(int(fd), "rb") as pipe:
        word = pipe.read()
    if not word.startswith(b"go\t"):
        raise SystemExit(EXIT_CALLED_OFF)
    return os.fsdecode(word[3:])
