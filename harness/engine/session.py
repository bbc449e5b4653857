"""A run's state and its selection of cases, shared by the plugin and the controller.

Kept apart from both so that neither imports the other: the plugin's hooks
(harness/engine/plugin.py) and the controller's (harness/engine/controller.py) read and
write the same Run, kept on config.stash (no globals).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.engine import isolation

from harness.model.routes import DEFAULT_TARGET  # noqa: E402

ROW_KEY = "harness_row"


def csv_list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def check_target_options(options, target: str = DEFAULT_TARGET) -> None:
    """Options are for the target to judge (harness/targets/base.py validate_options):
    ValueError naming the option when it cannot honour them."""
    from harness.model.target_options import given
    if not given(options):
        return
    from harness.targets import load_target
    load_target(target).validate_options(options)


def load_runner(spec: str, options=None):
    """The target a spec names, with this run's options in effect in this process: the
    ones given, else those handed down through the environment (target_options.ENV)."""
    from harness.model.target_options import from_env
    from harness.targets import load_target
    target = load_target(spec)
    target.apply_options(from_env() if options is None else options)
    return target


def declared_options() -> tuple:
    """The in-tree targets' options: the flags every command that runs cases offers."""
    from harness.targets.descriptors import declared_options as declared
    return declared()


def given_options(get) -> dict:
    """The target options a run was given ({name: value}, the set ones); get(name) reads an
    option's value (pytest's config.getoption, or an attribute of check's parsed args)."""
    from harness.model.target_options import given
    return given({o.name: get(o.name) for o in declared_options()})


def default_profile() -> str:
    """"full" with a GPU (thousands of cases in minutes), "ci" without (asked without
    importing torch: platform_info.gpu_visible)."""
    from harness.model.platform_info import gpu_visible
    return "full" if gpu_visible() else "ci"


def select_cases(target_name: str, families=None, routes=None, case_id=None,
                 cases_file=None, profile: str | None = None, shard: str | None = None) -> list:
    """The cases a run covers, in generation order (deterministic everywhere); with `shard`
    (I/N), this machine's share of them (harness/model/shard.py)."""
    from harness.targets import load_target
    from harness.targets.descriptors import described

    def selector():   # an in-tree descriptor where it selects alone: no runner, no torch
        return described(target_name) or load_target(target_name)

    if cases_file:
        from harness.model import budget, cases_file as checked
        data = budget.load_cases_data(Path(cases_file).read_text(), str(cases_file))
        # Each case against the target's routes and the known features, before the first
        # runs: a misspelt route would be a skipped row, and a run of them a PASS.
        target = selector()
        cases = checked.check_records(data, f"--cases-file {cases_file}", target.routes,
                                      f"target {target.name!r}")
    else:
        cases = list(selector().cases(families, profile or default_profile()))
    if routes:
        available = {c.route for c in cases}
        unknown = set(routes) - available
        if unknown:
            raise pytest.UsageError(f"--route: no cases on {sorted(unknown)}; "
                                    f"routes with cases: {sorted(available) or 'none'}")
        cases = [c for c in cases if c.route in routes]
    if case_id:
        cases = [c for c in cases if case_id in c.id]
    if shard:
        from harness.model import shard as shards
        cases = shards.select(cases, shard)
    return cases


# Per process: a repro, shrink or standalone session looks ids up again and again (every
# profile's cases of the bundled target take ~1.5 s to make).
_ALL_CASES: dict = {}


def all_cases(target) -> list:
    """Every case the target has in any profile, each id once: where an id from any table,
    or from a person, is looked up (the full profile does not hold every ci case). Made once
    per process for a target of one class, name, routes and capabilities (what its cases are
    made from)."""
    import cases as families
    try:
        # repr: a declaration may hold dicts (Capabilities.metadata), which do not hash.
        key = (type(target), getattr(target, "name", None), tuple(target.routes),
               repr(target.capabilities), families.generate)
        hash(key)
    except Exception:  # noqa: BLE001 - an adapter's odd declaration: made afresh each time
        key = None
    if key is not None and key in _ALL_CASES:
        return list(_ALL_CASES[key])
    seen: dict = {}
    for profile in families.PROFILES:
        for case in target.cases(None, profile):
            seen.setdefault(case.id, case)
    made = tuple(seen.values())
    if key is not None:
        _ALL_CASES[key] = made
    return list(made)


def run_shard() -> str | None:
    """The run's shard (I/N), which `harness check --shard` hands its pytest child and the
    workers through the environment (harness/model/shard.py SHARD_ENV); None for all."""
    import os
    from harness.model.shard import SHARD_ENV
    return os.environ.get(SHARD_ENV) or None


def case_id_of(nodeid: str) -> str:
    """The case id inside a test node id: `...::test_case[<case id>]`."""
    name = nodeid.rsplit("::", 1)[-1]
    return name[name.index("[") + 1:-1] if "[" in name and name.endswith("]") else name


@dataclass
class Run:
    """Per-session state, kept on config.stash (no globals)."""
    config: Any
    is_worker: bool
    worker: str = "main"
    run_id: str = ""
    results: Path | None = None
    default_results: bool = False
    state_dir: str = ""
    done_ids: frozenset = frozenset()
    _cases: list | None = None
    _target: Any = None
    context: dict | None = None
    state: isolation.WorkerState | None = None
    retire_reason: str | None = None
    # controller
    written: set = field(default_factory=set)
    retire_bumps: dict = field(default_factory=dict)
    prior_attempts: dict = field(default_factory=dict)   # nodeid -> earlier attempts' rows
    lock: threading.Lock = field(default_factory=threading.Lock)
    replays: Any = None        # controller.ReplayQueue
    failed_rows: int = 0

    def opt(self, name):
        return self.config.getoption(name)

    def cases(self) -> list:
        if self._cases is None:
            self._cases = select_cases(self.opt("target"), csv_list(self.opt("family")),
                                       csv_list(self.opt("route")), self.opt("case_id"),
                                       self.opt("cases_file"), self.opt("profile"),
                                       run_shard())
        return self._cases

    def cases_by_id(self) -> dict:
        return {c.id: c for c in self.cases()}

    def options(self) -> dict:
        """The target options this run was given ({name: value}, the set ones)."""
        return given_options(self.opt)

    def target(self):
        if self._target is None:
            self._target = load_runner(self.opt("target"), self.options())
        return self._target

    def identity(self) -> dict:
        """The library under test as the table's name says it (engine/identity.py)."""
        from harness.engine import identity
        return identity.describe(self.target(), self.opt("target"))

    def default_table(self, selection: str = "") -> Path:
        """The table a run without --results writes (a plain `pytest` run; `harness check`
        names it the same way in its parent): named for the library and its commit, with
        the selection (its shard too) of a partial run."""
        from harness.engine.identity import table_key
        from harness.results import table
        described = self.identity()
        return table.default_results_path(described["target_name"], selection,
                                          commit=table_key(described))

    def timeout_for(self, case) -> float:
        return isolation.case_timeout(dict(case.params), self.opt("case_timeout")) * self.repeat()

    def repeat(self) -> int:
        return resolve_repeat(self.opt("repeat"))


def resolve_repeat(value: int | None) -> int:
    """--repeat, defaulting by platform: a GPU's races show between repeats; the host's
    kernels are deterministic loops, so one run is the default there."""
    if value is not None:
        if value < 1:
            raise pytest.UsageError(f"--repeat: must be 1 or more, got {value}")
        return value
    import torch
    return 2 if torch.cuda.is_available() else 1


RUN = pytest.StashKey[Run]()


def get_run(config) -> Run:
    return config.stash[RUN]


