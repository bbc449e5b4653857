"""`--shard I/N`: a deterministic, cost-balanced share of a selection, and the check that
the tables of a sharded run put back together cover it exactly once.

Every machine computes the same assignment from the selection alone: each case's cost is
estimated from its params (a fixed start-up cost plus its q.k work, harness/model/sizes.py;
no clock, no machine), cases are taken longest first (ties by id), and each goes to the
shard with the least cost so far (ties to the lowest shard): greedy longest-processing-time
first, within 4/3 of the best split. A shard then runs its cases in generation order.

No scheduler: the CI system (a matrix job per shard) distributes, xdist spreads a shard
over one machine's workers. Each shard writes its own table whose rows say their shard
(`shard` column, "I/N"); `report` and `compare` merge the tables of one run and refuse an
overlap (a case in two shards) or a gap (a shard missing), naming it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from harness.model.sizes import case_work

# The environment variable that carries a shard from `harness check` to its pytest child and
# every worker (a plain `pytest` run may set it too); rows record it in their `shard` column.
SHARD_ENV = "HARNESS_SHARD"
# A case's fixed cost (set-up, inputs, reference, row) in units of q.k work: about what a
# case of 2^20 products costs on the host, so small cases are not free.
CASE_BASE_COST = 1 << 20
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(ValueError):
    """A bad --shard, or tables that do not make one sharded run: one line."""


@dataclass(frozen=True)
class Shard:
    index: int   # 1-based
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: str) -> Shard:
    """`I/N` with 1 <= I <= N, or ShardError naming the value."""
    match = _SPEC.match(str(text))
    if not match:
        raise ShardError(f"--shard {text!r}: must be I/N (this machine's shard of N, e.g. 2/4)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard {text}: I must be between 1 and N, and N at least 1")
    return Shard(index, count)


def cost(case) -> int:
    return CASE_BASE_COST + case_work(dict(case.params))


def assign(cases: list, count: int) -> dict[str, int]:
    """case id -> its shard (1..count): greedy longest first over ids in a fixed order."""
    loads = [0] * count
    out: dict[str, int] = {}
    for case in sorted(cases, key=lambda c: (-cost(c), c.id)):
        if case.id in out:
            continue
        best = min(range(count), key=lambda i: (loads[i], i))
        loads[best] += cost(case)
        out[case.id] = best + 1
    return out


def select(cases: list, shard: Shard | str | None) -> list:
    """The shard's cases, in the selection's own order; every case without a shard."""
    if shard is None or shard == "":
        return cases
    shard = parse(shard) if isinstance(shard, str) else shard
    owner = assign(cases, shard.count)
    return [c for c in cases if owner[c.id] == shard.index]


def check_merge(tables: Mapping[str, Iterable[Mapping]]) -> str | None:
    """Tables (path -> rows) to be read as one run: ShardError when they are shards of a run
    that overlap or leave a gap. Returns a note ("3 shards of 3") when they are shards,
    None when no row carries a shard."""
    shards: dict[str, set] = {}
    seen: dict[str, tuple[str, str]] = {}
    for path, rows in tables.items():
        labels = set()
        for row in rows:
            label = row.get("shard") or ""
            if not label:
                continue
            labels.add(label)
            case_id = row["case_id"]
            if case_id in seen and seen[case_id][0] != path:
                other, other_label = seen[case_id]
                raise ShardError(f"case {case_id!r} is in shard {other_label} ({other}) and in "
                                 f"shard {label} ({path}): the shards overlap; pass each shard's "
                                 f"table of one run once")
            seen.setdefault(case_id, (path, label))
        shards[path] = labels
    found = set().union(*shards.values()) if shards else set()
    if not found:
        return None
    unsharded = [p for p, labels in shards.items() if not labels]
    if unsharded:
        raise ShardError(f"{unsharded[0]} is not a shard, but the other tables are; merge the "
                         f"shards of one run alone")
    try:
        parsed = {parse(label) for label in found}
    except ShardError:
        raise ShardError(f"a row's shard is not I/N: {sorted(found)}") from None
    counts = {s.count for s in parsed}
    if len(counts) > 1:
        raise ShardError(f"the tables are shards of runs of {sorted(counts)} shards; merge the "
                         f"shards of one run")
    (count,) = counts
    missing = sorted(set(range(1, count + 1)) - {s.index for s in parsed})
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing)
        raise ShardError(f"shard{'s' if len(missing) > 1 else ''} {names} of {count} "
                         f"{'are' if len(missing) > 1 else 'is'} missing; pass every shard's "
                         f"table (harness check --shard I/{count} writes one)")
    return f"{count} shards of {count}"
