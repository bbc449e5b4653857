"""The adapter contract every target implements."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from harness.model.capabilities import Capabilities
from harness.model.target_options import flag_of, given

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from harness.model.case import Case
    from harness.model.problem import Problem
    from harness.model.builders import Buffers


def device_platform(device) -> str:
    """'cpu', or the GPU vendor's platform a device belongs to: 'nvidia' or 'amd' (ROCm)."""
    import torch
    if device.type != "cuda":
        return "cpu"
    return "amd" if getattr(torch.version, "hip", None) else "nvidia"


class Skip(Exception):
    """Raised by an adapter when a case's params cannot be expressed on this route.

    The row's outcome becomes `skipped` with this message as the reason.
    """


class Target:
    """A library under test: one adapter module plus one line in targets/__init__.py.

    It declares its routes ("<backend>.<op>") and capabilities; the families'
    cases reach it by op, and a case needing what it lacks is skipped with the
    capability named (harness/model/capabilities.py).
    """
    name: str = "?"
    routes: tuple[str, ...] = ()
    capabilities: Capabilities = Capabilities(ops=frozenset())
    # A target whose own contract the cases are (the bundled library): a valid
    # input it refuses, or a refusal that does not name the field, fails the
    # run. For any other library those are findings that fail only with --strict.
    owns_contract: bool = False
    # Contracts ("refuse", "match_or_refuse") whose cases this library may answer by
    # writing past its buffers: each such case then runs in a child forked from its worker
    # (on the CPU), so a heap it corrupts cannot crash the innocent cases run after it.
    fork_each: frozenset = frozenset()
    # A regex matched at the start of the library's error messages: the prefix they carry
    # (a status code such as `[...Error] : 1 : FAIL`, a source path) that is not part of
    # the reason. A refusal is judged on the text after it (harness/model/classify.py).
    message_prefix: str | None = None

    def cases(self, families=None, profile: str = "ci") -> list:
        """The families' cases on this target's routes (a target may add its own)."""
        import cases as families_pkg
        return families_pkg.generate(families, routes=self.routes, profile=profile,
                                     dtypes=self.capabilities.dtypes)

    # The options this target takes (its descriptor's OPTIONS; harness/model/target_options.py).
    options: tuple = ()

    def check_option(self, name: str, value: str) -> None:
        """Refuse a value of a declared option this target cannot honour: ValueError whose
        message starts with the option's flag. Every value passes unless the target says."""

    def validate_options(self, options: Mapping[str, str] | None) -> None:
        """Refuse options this target does not take, or values it cannot honour (ValueError
        naming the option's flag and the value)."""
        declared = {o.name for o in self.options}
        for name, value in given(options).items():
            if name not in declared:
                raise ValueError(f"{flag_of(name)}: target {self.name!r} does not take it "
                                 f"(got {value!r}); its options: "
                                 f"{', '.join(o.flag for o in self.options) or 'none'}")
            self.check_option(name, value)

    def environment_error(self, options: Mapping[str, str] | None) -> str | None:
        """A declared option's variable set in this process's environment by hand (not by
        the option), judged as the option would be: one line, or None."""
        import os
        for opt in self.options:
            value = os.environ.get(opt.env) if opt.env else None
            if not value or given(options).get(opt.name):
                continue
            try:
                self.check_option(opt.name, value)
            except ValueError as why:
                return f"{opt.env}={value}: " + str(why).replace(f"{opt.flag}: ", "", 1)
        return None

    def apply_options(self, options: Mapping[str, str] | None) -> None:
        """Put the options into effect in this process: each one's variable set for the
        library to read (a target whose options work otherwise overrides this)."""
        import os
        for opt in self.options:
            value = given(options).get(opt.name)
            if value and opt.env:
                os.environ[opt.env] = value
        self._applied = given(options)

    def options_in_effect(self) -> dict[str, str]:
        """Each declared option as this process runs with it, for the row: its variable
        (set by the option or by hand), else the value applied."""
        import os
        applied = getattr(self, "_applied", {})
        return {o.name: (os.environ.get(o.env, "") if o.env else applied.get(o.name, ""))
                for o in self.options}

    def version(self) -> str:
        """Version string recorded on every row."""
        raise NotImplementedError

    def build_id(self) -> str:
        """Build hash (or '') recorded on every row."""
        return ""

    def commit(self) -> str:
        """Library commit (or '') recorded on every row."""
        return ""

    def platform(self) -> str:
        """'host', 'nvidia', 'amd', or 'cpu' for pure-CPU external libraries."""
        raise NotImplementedError

    def run(self, case: "Case", problem: "Problem", buffers: "Buffers") -> Mapping[str, "torch.Tensor"]:
        """Perform the case's calls and return logical outputs.

        Returns {"o": [total_q_rows, num_qo_heads, head_dim_vo]} plus
        {"lse": [total_q_rows, num_qo_heads]} (natural log) when the case asks
        for it; rows concatenated in request order, whatever the library's
        layout. Raise Skip when the route cannot express the params; let the
        library's own exceptions (refusals) propagate untouched. Every output
        buffer handed to the library comes from `buffers` (canary-guarded,
        NaN-poisoned) and every input is registered with it for fingerprinting.
        Call buffers.stage("plan"/"run") as the calls progress.
        """
        raise NotImplementedError

    def skip_reason(self, case: "Case") -> str | None:
        """Why run() would raise Skip for the case, decided from the case alone (no tensor,
        no library call), or None. Asked before a case is forked or built, so a skip costs
        no child and no allocation; run() may still raise Skip for what only it can see."""
        return None

    def estimate_bytes(self, case: "Case") -> int:
        """Bytes this adapter allocates for the case beyond the harness's own inputs and
        reference (a library-owned cache, a workspace it makes), from the case alone; counted
        in the case's size budget (--max-case-bytes). A pool allocated lazily counts what it
        will touch, not its virtual size. 0: nothing of its own worth counting."""
        return 0

    def standalone_source(self, case: "Case") -> str | None:
        """Python source defining `def call(inputs: dict) -> dict` for a standalone script.

        `inputs` holds the case's logical tensors ("q", "k", "v": one [rows, heads, dim]
        tensor per request, on the device the case ran on); call() makes this target's
        calls from them the way run() does, using only torch and the library, and returns
        {"o": [rows, heads, dim]} plus {"lse": [rows, heads]} (natural log) when the case
        asks for it. None: this target cannot write one; raise Skip(reason) when it can
        for other cases but not this one.
        """
        return None
