"""A library's call signature: each argument of each call it exposes, in its own names.

A target declares one Signature (docs/targets.md "The signature"): for every argument of
every call the library exposes (a plan or metadata call, the run, a cache writer), its name
in the library's words, its *role* from ROLES below, its encoding where it differs from the
harness's (ENCODINGS), its dtype and layout where they are fixed, and the call that reads
it. Everything the harness says about an argument comes from here:

  - the vocabulary: a refusal that names the argument in the library's words is clear
    (Signature.vocabulary: our field -> the library's names for it);
  - the metadata contract: which adversarial relations (harness/model/relations.py) reach
    the target, each through the call that reads the argument (Signature.metadata);
  - what `harness check-target` lists as reached, and why the rest is not.

Pure data: importing this module (or a target's descriptor built from it) imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The one fixed list of roles an argument may play. A role names what the argument *is* to
# the problem, whatever the library calls it.
ROLES = {
    # tensors of the problem
    "q": "the queries, [rows, q heads, head_dim] packed in request order",
    "k": "the keys (dense or packed tokens, or the tokens a cache writer stores)",
    "v": "the values, as k",
    "k_cache": "the paged key cache",
    "v_cache": "the paged value cache",
    "kv_cache": "one paged cache holding keys and values",
    "out": "the caller's output buffer",
    "lse": "the caller's LSE buffer, or the LSE returned",
    # the batch description
    "qo_offsets": "query offsets per request, [batch + 1] (qo_indptr, cu_seqlens_q, "
                  "query_start_loc)",
    "kv_offsets": "kv offsets per request, [batch + 1] (kv_indptr, cu_seqlens_k; a paged "
                  "kv_indptr offsets into page_indices)",
    "kv_lengths": "kv length per request, [batch] (seq_lens, seqused_k)",
    "page_indices": "the pages each request holds, flat (kv_indices)",
    "last_page_lengths": "tokens in each request's last page, [batch]",
    "block_table": "the blocks each request holds, [batch, max blocks]",
    "slot_mapping": "the cache slot of each written token (a cache writer's)",
    "batch_size": "the number of requests stated",
    "max_seqlen_q": "a stated maximum query length",
    "max_seqlen_k": "a stated maximum kv length",
    "num_qo_heads": "query heads stated",
    "num_kv_heads": "kv heads stated",
    "head_dim_qk": "q/k head dimension stated",
    "head_dim_vo": "v head dimension stated",
    "block_size": "tokens per page (block) stated",
    "dtype": "the query dtype stated",
    "kv_dtype": "the cache dtype stated",
    # the attention variant
    "scale": "softmax scale",
    "causal": "causal mask flag",
    "window": "sliding window",
    "soft_cap": "logits soft cap",
    "sinks": "attention sink logits per q head",
    "alibi_slopes": "ALiBi slopes per q head",
    "fp8_scales": "per-tensor fp8 k/v scales",
    "custom_mask": "a caller's boolean mask",
    "plan_handle": "what a plan or metadata call returns and the run is handed back",
    "variant_flags": "kernel-variant flags (backend, tensor cores, isa, splits)",
    "workspace": "scratch memory the library is handed",
    "other": "anything else the call takes (named, never perturbed)",
}

# How an argument's values may differ from the harness's own encoding of the same thing.
ENCODINGS = {
    "exclusive": "offsets [0, a, a+b, ...] (the harness's): entry i is where request i starts",
    "inclusive": "offsets [a, a+b, ...] without the leading 0",
    "len_minus_1": "a length stored as len - 1",
    "base2": "an LSE in base 2 (log2), the harness's is natural log",
    "window_plus_1": "a window counting the current key (window_left + 1)",
    "window_pair": "flash-attn's (left, right) window, -1 unbounded",
    "transposed": "stored [heads, rows] where the harness's is [rows, heads]",
}

# The harness's own words (case params, refuse words, metadata fields) for each role: what a
# refusal may name and what METADATA_FIELDS (harness/model/capabilities.py) calls the field.
OUR_WORDS = {
    "q": ("q",), "k": ("k",), "v": ("v",), "k_cache": ("k_cache", "k"),
    "v_cache": ("v_cache", "v"), "kv_cache": ("kv_cache",), "out": ("out",), "lse": ("lse",),
    "qo_offsets": ("query_start_loc", "qo_indptr", "rows"),
    "kv_offsets": ("kv_indptr", "kv_rows"),
    "kv_lengths": ("kv_lens",),
    "page_indices": ("kv_indices", "block_table"),
    "last_page_lengths": ("last_page_len",),
    "block_table": ("block_table",),
    "batch_size": ("batch_size",),
    "max_seqlen_q": ("max_seqlen_q",), "max_seqlen_k": ("max_seqlen_k",),
    "num_qo_heads": ("num_qo_heads",), "num_kv_heads": ("num_kv_heads",),
    "head_dim_qk": ("head_dim_qk", "head_dim"), "head_dim_vo": ("head_dim_vo",),
    "block_size": ("page_size",), "dtype": ("dtype",),
    "soft_cap": ("logits_soft_cap",), "sinks": ("sinks",), "alibi_slopes": ("alibi_slopes",),
    "window": ("window_left",), "causal": ("causal",), "plan_handle": ("plan_handle",),
}

# The metadata fields (harness/model/capabilities.py METADATA_FIELDS) a role lets a relation
# perturb: field F reaches a target whose signature has an argument of a role listed for F,
# and whose core performs F (Signature.core names the core; CORE_FIELDS what each performs).
# A call with no plan states the problem by its other tensors: the caller's out holds the
# q heads, the v head dim and the dtype; k holds the q/k head dim.
FIELD_ROLES = {
    "num_qo_heads": ("num_qo_heads", "out"),
    "num_kv_heads": ("num_kv_heads",),
    "head_dim_qk": ("head_dim_qk", "k", "k_cache", "kv_cache"),
    "head_dim_vo": ("head_dim_vo", "out"),
    "page_size": ("block_size",),
    "rank": ("q",),
    "q_rows": ("qo_offsets",),
    "kv_rows": ("kv_offsets",),
    "dtype": ("dtype", "out"),
    "batch_size": ("batch_size",),
    "kv_lens": ("kv_lengths",),
    "block_table": ("block_table", "page_indices"),
    "query_start_loc": ("qo_offsets",),
    "last_page_len": ("last_page_lengths",),
    "max_seqlen_q": ("max_seqlen_q",),
    "max_seqlen_k": ("max_seqlen_k",),
    "plan_handle": ("plan_handle",),
    "causal": ("causal",),
    "window": ("window",),
}
# Scalars a relation bends only between two calls: the metadata call told one value, the
# run handed another. A signature carries such a field only where its role is read both by
# a run (a call that reads q) and by a call before it that does not (a plan-only flag, or
# one several ops' plans read, has no second reader to disagree with).
TWO_CALL_FIELDS = frozenset({"causal", "window"})

# What each neutral core performs (harness/targets/plan_run/mismatch.py and
# harness/targets/block_table/mismatch.py; a test checks these against the cores).
CORE_FIELDS = {
    "plan_run": ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size",
                 "rank", "q_rows", "kv_rows", "dtype", "query_start_loc", "last_page_len",
                 "block_table"),
    "block_table": ("num_qo_heads", "num_kv_heads", "head_dim_qk", "q_rows", "dtype",
                    "batch_size", "kv_lens", "block_table", "query_start_loc", "causal",
                    "window"),
}
# DeclaredTarget's runner (harness/targets/block_table/declared.py): the block-table core's
# fields, and the plan handle (it makes every call, so it can hand the run another plan's).
CORE_FIELDS["declared"] = CORE_FIELDS["block_table"] + ("plan_handle",)


@dataclass(frozen=True)
class Arg:
    """One argument of one call: its name in the library's words, its role (ROLES), the call
    that reads it, and how it differs from ours (ENCODINGS), its dtype and layout."""
    name: str
    role: str
    call: str
    encoding: str = ""
    dtype: str = ""
    layout: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Arg.name: a non-empty string, got {self.name!r}")
        if self.role not in ROLES:
            raise ValueError(f"Arg {self.name!r}: unknown role {self.role!r}; "
                             f"known: {', '.join(sorted(ROLES))}")
        if not isinstance(self.call, str) or not self.call:
            raise ValueError(f"Arg {self.name!r}: call is the name of the call that reads it, "
                             f"got {self.call!r}")
        if self.encoding and self.encoding not in ENCODINGS:
            raise ValueError(f"Arg {self.name!r}: unknown encoding {self.encoding!r}; "
                             f"known: {', '.join(sorted(ENCODINGS))}")


@dataclass(frozen=True)
class Signature:
    """Every argument of every call a library exposes (Arg), and the neutral core that
    performs its relations ("plan_run", "block_table", or "" for an adapter's own code,
    which lists the fields it bends in `performs`).

    `unreached`: fields whose relation the target does not run, each with the reason (a
    library with no check for it yet that the owner of the target tracks elsewhere, an
    argument the adapter cannot bend); check-target shows them."""
    args: tuple = ()
    core: str = ""
    unreached: tuple = ()        # ((field, reason), ...)
    performs: tuple = ()         # fields the adapter's own code bends (beside its core's)

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(self.args))
        for a in self.args:
            if not isinstance(a, Arg):
                raise ValueError(f"Signature.args: Arg items only, got {a!r}")
        if self.core and self.core not in CORE_FIELDS:
            raise ValueError(f"Signature.core: unknown {self.core!r}; known {sorted(CORE_FIELDS)}")
        seen = set()
        for a in self.args:
            if (a.call, a.name) in seen:
                raise ValueError(f"Signature: {a.call}({a.name}) declared twice")
            seen.add((a.call, a.name))
        object.__setattr__(self, "unreached", tuple(tuple(u) for u in self.unreached))
        object.__setattr__(self, "performs", tuple(self.performs))
        unknown = set(self.performs) - set(FIELD_ROLES)
        if unknown:
            raise ValueError(f"Signature.performs: unknown fields {sorted(unknown)}; "
                             f"known {sorted(FIELD_ROLES)}")

    def calls(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a.call for a in self.args))

    def roles(self) -> frozenset:
        return frozenset(a.role for a in self.args)

    def by_role(self, role: str) -> tuple:
        return tuple(a for a in self.args if a.role == role)

    def fields(self) -> dict:
        """{metadata field: (the argument that carries it, ...)} for every field some
        argument's role lets a relation perturb, whether or not the core performs it."""
        out = {}
        runs = {a.call for a in self.args if a.role == "q"}
        for f, roles in FIELD_ROLES.items():
            args = tuple(a for a in self.args if a.role in roles)
            if f in TWO_CALL_FIELDS and not (any(a.call in runs for a in args)
                                             and any(a.call not in runs for a in args)):
                continue
            if args:
                out[f] = args
        return out

    def metadata(self) -> dict:
        """{field: the call that reads it} for every field the signature carries, its core
        performs, and that is not declared unreached (Capabilities.metadata)."""
        performed = set(CORE_FIELDS.get(self.core, ())) | set(self.performs)
        skip = {f for f, _ in self.unreached}
        return {f: args[0].call for f, args in self.fields().items()
                if f in performed and f not in skip}

    def vocabulary(self) -> dict:
        """{our word: the library's names} from each argument's role (Capabilities.vocabulary)."""
        out: dict = {}
        for a in self.args:
            for ours in OUR_WORDS.get(a.role, ()):
                if a.name != ours:
                    out.setdefault(ours, [])
                    if a.name not in out[ours]:
                        out[ours].append(a.name)
        return {k: tuple(v) for k, v in out.items()}

    def reach(self) -> dict:
        """{field: "" if reached, else why not} for every field an argument carries."""
        performed = set(CORE_FIELDS.get(self.core, ())) | set(self.performs)
        skip = dict(self.unreached)
        out = {}
        for f, args in self.fields().items():
            if f in skip:
                out[f] = skip[f]
            elif f not in performed:
                names = ", ".join(a.name for a in args)
                out[f] = (f"no code bends {names} ({self.core or 'the adapter'} does not "
                          f"perform {f})")
            else:
                out[f] = ""
        return out

    def reach_lines(self) -> list[str]:
        """What check-target prints: the calls, the fields whose relations reach the
        target, and each field an argument carries that they do not, with why."""
        reach = self.reach()
        lines = [f"signature: {len(self.args)} argument(s) over {', '.join(self.calls())}",
                 "relations reach: " + (", ".join(sorted(f for f, why in reach.items()
                                                         if not why)) or "none")]
        lines += [f"not reached: {f}: {why}" for f, why in sorted(reach.items()) if why]
        return lines

    def describe(self) -> list[str]:
        """One line per argument, as check-target prints them."""
        lines = []
        for call in self.calls():
            for a in self.args:
                if a.call == call:
                    bits = [f"{call}({a.name})", a.role]
                    bits += [b for b in (a.encoding, a.dtype, a.layout) if b]
                    lines.append("  ".join(bits))
        return lines


def merge_vocabulary(derived: dict, declared: dict) -> dict:
    """The declared vocabulary with the signature's names added to it (declared first)."""
    out = {k: tuple(v) for k, v in declared.items()}
    for k, names in derived.items():
        out[k] = tuple(dict.fromkeys(out.get(k, ()) + tuple(names)))
    return out
