"""The case model: one (route, inputs, expectation) record, pure data.

A case never holds tensors or imports a library. Its id is stable and
readable, and (id, seed) rebuild its tensors bit-for-bit.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from harness.model.params import check as check_params

EXPECTS = ("match", "refuse", "match_or_refuse")

# Which outcomes each expectation accepts.
ALLOWED = {
    "match": frozenset({"match"}),
    "refuse": frozenset({"refused"}),
    "match_or_refuse": frozenset({"match", "refused"}),
}


def _freeze(value: Any) -> Any:
    """Params must be plain JSON values; tuples become lists so ids are stable."""
    return json.loads(json.dumps(value, sort_keys=True))


@dataclass(frozen=True)
class Case:
    route: str                 # "<backend>.<op>", e.g. "fa2.paged_prefill"
    family: str                # case family module name, e.g. "strided"
    variant: str               # what this case varies, e.g. "q_stride2"
    params: Mapping[str, Any]  # plain JSON-able values; every key is in harness/model/params.py
    expect: str = "match"
    # Words a refusal message must contain (the field name, usually).
    refuse_words: tuple[str, ...] = ()
    seed: int | None = None
    tag: str = ""              # short params summary for the id, e.g. "bf16-d128-p16"
    # Behaviours the case needs of a target beyond its op (harness/model/capabilities.py
    # FEATURES: "plan_run", "graphs", ...); a target without one skips the case.
    requires: tuple[str, ...] = ()

    def __post_init__(self):
        if self.expect not in EXPECTS:
            raise ValueError(f"Case.expect must be one of {EXPECTS}, got {self.expect!r}")
        if "." not in self.route:
            raise ValueError(f"Case.route must read '<backend>.<op>', got {self.route!r}")
        object.__setattr__(self, "params", _freeze(dict(self.params)))
        check_params(self.params)
        object.__setattr__(self, "refuse_words", tuple(self.refuse_words))
        object.__setattr__(self, "requires", tuple(self.requires))
        if self.seed is None:
            # From the id without the route's backend: every target (and every backend of
            # one op) sees the same tensors for the same case, so their rows compare.
            digest = hashlib.sha256(self.id.split(".", 1)[1].encode()).digest()
            object.__setattr__(self, "seed", int.from_bytes(digest[:4], "little"))

    @property
    def op(self) -> str:
        return self.route.split(".", 1)[1]

    @property
    def backend(self) -> str:
        return self.route.split(".", 1)[0]

    @property
    def id(self) -> str:
        tail = f"/{self.tag}" if self.tag else ""
        return f"{self.route}/{self.family}.{self.variant}{tail}"

    def allowed(self) -> frozenset[str]:
        return ALLOWED[self.expect]

    def to_json(self) -> dict:
        return {
            "route": self.route, "family": self.family, "variant": self.variant,
            "params": self.params, "expect": self.expect,
            "refuse_words": list(self.refuse_words), "seed": self.seed, "tag": self.tag,
            "requires": list(self.requires),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Case":
        return cls(**{**data, "refuse_words": tuple(data.get("refuse_words", ())),
                      "requires": tuple(data.get("requires", ()))})


def dtype_tag(params: Mapping[str, Any]) -> str:
    """The common id summary: dtype, head dim, heads; families append their own bits."""
    parts = [str(params.get("dtype", "")), f"d{params['head_dim']}" if "head_dim" in params else ""]
    if "num_qo_heads" in params:
        parts.append(f"h{params['num_qo_heads']}x{params.get('num_kv_heads', params['num_qo_heads'])}")
    return "-".join(p for p in parts if p)
