"""A vLLM-shaped target made of its signature and one function per call, no scenario code.

DeclaredTarget performs every case itself from the signature (docs/targets.md "A
vLLM-shaped adapter"): it lays the problem out as a block-table batch (batch.py), bends it
where the case's relation says (mismatch.py), fills the caches (the library's own cache
writer where the signature has a call reading a `slot_mapping`, else the harness writes the
tokens into their slots), hands each call its arguments by role, passes what one call
returns to the next call's `plan_handle` argument, and, for a restaged case, rewrites the
caller's tensors in place after the first call that reads them and before the last call
(restage.py); for the plan_handle relation it makes the metadata call for another batch
(the requests regrouped) and hands its result to the run of this one. The adapter says only
what the library is (core="declared": the block-table core's fields and the plan handle):

    class Mine(DeclaredTarget):
        name = "mine"
        signature = Signature(args=(Arg("seq_lens", "kv_lengths", "plan"), ...),
                              core="declared")
        capabilities = Capabilities(ops=..., layouts=frozenset({"NHD"}),
                                    call_forms=frozenset({"out"}), signature=signature)
        def functions(self): return {"plan": mylib.plan, "run": mylib.run}

Caches are [num_blocks, block_size, kv heads, head_dim] (role k_cache / v_cache), NaN in
every block no request owns; q [rows, q heads, head_dim]; out [rows, q heads, head_dim_vo],
canary-banded; index tensors int32 (role qo_offsets, kv_lengths, block_table; slot_mapping
int64). A role the case gives no value for is left out (the function's default applies);
one the core never gives (kv_offsets, page_indices, lse, ...) whose parameter has no default
is the adapter's error (UnsuppliedArgument: a harness_error row), never the library's
TypeError read as a refusal.
"""
from __future__ import annotations

import inspect
from typing import Callable, Mapping

import torch

from harness.targets.base import Skip, Target
from harness.targets.block_table.batch import block_pool, build, poison_tails
from harness.targets.block_table.mismatch import damaged_handle, handle_damage, perturb
from harness.targets.block_table.restage import Metadata, first_batch
from harness.targets.case_calls import CaseCalls, first_rows

class UnsuppliedArgument(AssertionError):
    """A declared argument this core hands no value and the function has no default for:
    the adapter's error (an AssertionError: engine/execute.py books it as ours)."""


def check_supplied(fn, call: str, sig, kwargs: dict) -> None:
    """Raise UnsuppliedArgument for an argument of `call` that `kwargs` leaves out and the
    function cannot do without (no default), naming it and its role."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):      # a builtin without a signature: the call says
        return
    for a in sig.args:
        p = params.get(a.name)
        if a.call == call and a.name not in kwargs and p is not None \
                and p.default is inspect.Parameter.empty \
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise UnsuppliedArgument(
                f"DeclaredTarget hands {call}() no {a.name!r} (role {a.role!r}: the declared "
                f"core gives no value for it) and {call}() has no default for it: give the "
                f"function a default, or write a Target of your own (docs/targets.md)")


# Params this shape of call has no analogue for, and why.
_NO_ANALOGUE = {
    "scenario": "a metadata call and a run have no plan()/run() wrapper to script",
    "use_cuda_graph": "no CUDA-graph wrapper with caller-owned capacity buffers",
    "partial_state": "the run takes no partial state to merge into",
    "merge": "no merge_state call",
    "max_kv_chunk": "the caller sets no KV split",
    "custom_mask": "no custom mask argument",
}
_INDEX_ROLES = {"qo_offsets": "query_start_loc", "kv_lengths": "seq_lens",
                "block_table": "block_table"}


class DeclaredCall(CaseCalls):
    """One case's calls, argument by argument from the signature's roles."""

    def __init__(self, target, case, problem, buffers):
        super().__init__(case, problem, buffers)
        self.target = target

    def _write_cache(self, batch, pools) -> None:
        """The harness's own writer: each key/value token into its slot."""
        if (self.mismatch or {}).get("only"):
            raise Skip("k and v moved apart reach only a library with its own cache writer")
        slots = torch.tensor(batch.slot_mapping, dtype=torch.long, device=self.device)
        bs = batch.block_size
        for pool, tokens in zip(pools, (batch.key, batch.value)):
            pool[slots // bs, slots % bs] = tokens.to(pool.dtype)

    def check_expressible(self, roles) -> None:
        """Skip, naming the role, a case whose attention variant no argument carries: a
        library handed no window cannot be asked for one."""
        p, params = self.problem, self.params
        needs = (("window", p.window_left >= 0, "a sliding window"),
                 ("causal", p.causal, "a causal mask"),
                 ("soft_cap", bool(params.get("logits_soft_cap")), "a logits soft cap"),
                 ("sinks", params.get("sinks") not in (None, False), "attention sinks"),
                 ("alibi_slopes", params.get("alibi_slopes") not in (None, False), "ALiBi"),
                 ("scale", params.get("sm_scale") is not None, "a softmax scale"),
                 ("head_dim_vo", p.head_dim_vo != p.head_dim, "a v head dim apart from q/k's"))
        for role, wanted, what in needs:
            if wanted and role not in roles:
                raise Skip(f"{what}: the signature has no argument of role {role!r}")

    def other_batch(self, batch):
        """{role: tensor} of another batch (the same requests regrouped: restage.first_batch)
        for the metadata call when the case hands the run another plan's handle; None
        otherwise. Fresh tensors: the caller's own stay the run's."""
        if (self.mismatch or {}).get("field") != "plan_handle":
            return None
        if not self.target.signature.by_role("plan_handle"):
            raise Skip("no argument of role 'plan_handle': the run is handed no plan")
        if handle_damage(self.mismatch):
            return None                     # this plan's handle, damaged: run()
        if not self.target.signature.by_role("plan_handle"):
            raise Skip("no argument of role 'plan_handle': the run is handed no plan")
        first = first_batch(batch)
        return {role: torch.tensor(first[name], dtype=torch.int32, device=self.device)
                for role, name in _INDEX_ROLES.items()}

    def values(self, batch) -> dict:
        """{role: value} for every role this case gives a value to."""
        p, params = self.problem, self.params
        qo = [b - a for a, b in zip(batch.query_start_loc, batch.query_start_loc[1:])]
        return {
            "batch_size": batch.num_reqs, "num_qo_heads": batch.num_qo_heads,
            "num_kv_heads": batch.num_kv_heads, "head_dim_qk": batch.head_dim,
            "head_dim_vo": p.head_dim_vo, "block_size": batch.block_size, "dtype": p.dtype,
            "kv_dtype": p.dtype,
            "scale": self.sm_scale if self.sm_scale is not None else p.head_dim ** -0.5,
            "causal": p.causal, "window": p.window_left,
            "soft_cap": float(params.get("logits_soft_cap") or 0.0),
            "max_seqlen_q": max(qo, default=0), "max_seqlen_k": max(batch.seq_lens, default=0),
        }

    def run(self) -> dict:
        p, params, sig = self.problem, self.params, self.target.signature
        for key, why in _NO_ANALOGUE.items():
            if params.get(key):
                raise Skip(why)
        if p.head_dim_vo != p.head_dim and sig.by_role("kv_cache"):
            raise Skip("one cache holds one head size for K and V")
        if p.fp8_kv:
            raise Skip("no fp8 cache argument in this signature")
        self.check_expressible(sig.roles())
        block_size = int(params.get("page_size", 16))
        batch = build(p, block_size, params.get("page_order", "shuffled"),
                      int(params.get("page_id_offset", 0)), self.case.seed)
        if (self.mismatch or {}).get("field") != "plan_handle":   # that one: other_batch()
            batch = perturb(batch, self.mismatch)
        roles = sig.roles()
        writer = "slot_mapping" in roles
        pools = [block_pool(batch, (block_size, p.num_kv_heads, d), p.dtype, self.device)
                 for d in (p.head_dim, p.head_dim_vo)]
        for pool in pools:                        # a block of each: [block_size, Hkv, D]
            poison_tails(batch, pool, p.cache_tail, 0)
        if not writer:
            self._write_cache(batch, pools)
        given = self.values(batch)
        given["q"] = self.views.input("q", batch.query)
        given["k"] = self.views.input("k", batch.key.contiguous())
        given["v"] = self.views.input("v", batch.value.contiguous())
        given["slot_mapping"] = torch.tensor(batch.slot_mapping, dtype=torch.int64,
                                             device=self.device)
        restaged = Metadata(self, batch) if Metadata.restages(params) else None
        if restaged is not None:
            held = restaged.tensors()
            given.update({role: held[name] for role, name in _INDEX_ROLES.items()})
        else:
            given.update({role: self.views.index(name, getattr(batch, name), self.device)
                          for role, name in _INDEX_ROLES.items()})
        given["out"] = self.out_like_q(batch.query.shape[0], batch.rows)
        sinks = self.per_head_vector("sinks", p.sinks)
        slopes = self.per_head_vector("alibi_slopes", p.alibi_slopes)
        if sinks is not None:
            given["sinks"] = sinks
        if slopes is not None:
            given["alibi_slopes"] = slopes
        functions = self.target.functions()
        calls = sig.calls()
        missing = [c for c in calls if c not in functions]
        if missing:
            raise ValueError(f"adapter {self.target.name!r}: no function for call(s) {missing}")
        handle = None
        other = self.other_batch(batch)
        order = [c for c in calls if _is_writer(sig, c)] + [c for c in calls
                                                              if not _is_writer(sig, c)]
        caches_watched = False
        for i, name in enumerate(order):
            writing = _is_writer(sig, name)
            if not writing and not caches_watched:
                # From here the caches are the library's input: watched, never written.
                given["k_cache"] = self.views.input("k_cache", pools[0])
                given["v_cache"] = self.views.input("v_cache", pools[1])
                self.views.check_used()
                caches_watched = True
            elif writing:
                given["k_cache"], given["v_cache"] = pools
            if restaged is not None and name == order[-1] and not writing and any(
                    not _is_writer(sig, c) for c in order[:i]):
                restaged.rewrite()    # after the metadata call read them, before the run
            kwargs = {}
            handed = given
            if not writing and name != order[-1]:
                # A metadata call: the plan for the other batch, the scalars it was told.
                handed = {**given, **(other or {}), **batch.planned}
            for a in sig.args:
                if a.call != name:
                    continue
                if a.role == "plan_handle":
                    kwargs[a.name] = handle
                elif a.role in handed:
                    kwargs[a.name] = _encoded(a, handed[a.role])
            check_supplied(functions[name], name, sig, kwargs)
            self.buffers.stage("write cache" if writing else name)
            result = functions[name](**kwargs)
            if not writing:
                handle = result
                damage = handle_damage(self.mismatch)
                if damage and name != order[-1]:
                    handle = damaged_handle(handle, damage)
        return {"o": first_rows(given["out"], batch.rows)}


def _is_writer(sig, call: str) -> bool:
    return any(a.call == call and a.role == "slot_mapping" for a in sig.args)


def _encoded(arg, value):
    """The value in the argument's encoding (signature.ENCODINGS)."""
    if arg.encoding == "window_plus_1":
        return value + 1 if value >= 0 else -1
    if arg.encoding == "len_minus_1" and isinstance(value, torch.Tensor):
        return value - 1
    if arg.encoding == "inclusive" and isinstance(value, torch.Tensor):
        return value[1:]
    if arg.encoding == "window_pair":
        return (value, 0) if value >= 0 else (-1, -1)
    return value


class DeclaredTarget(Target):
    """Subclass: name, routes, signature (core="declared"), capabilities, functions()."""
    signature = None

    def functions(self) -> Mapping[str, Callable]:
        """{call name in the signature: the library's function}."""
        raise NotImplementedError

    def version(self) -> str:
        return "?"

    def platform(self) -> str:
        return "cpu"

    def run(self, case, problem, buffers):
        if case.route not in self.routes:
            raise Skip(f"{self.name} has no route {case.route!r}")
        if case.op == "batch_decode" and any(n != 1 for n in problem.qo_lens) \
                and "multi_token_decode" not in self.capabilities.features:
            raise Skip("batch decode takes one query token per request")
        if case.op in ("single_prefill", "single_decode") and problem.batch_size != 1:
            raise Skip("a single route takes one request")
        return DeclaredCall(self, case, problem, buffers).run()
