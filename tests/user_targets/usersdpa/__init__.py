"""Out-of-tree targets as a user's own package would hold them (tests only): the example
adapter, and copies of it with a planted defect or a perturbation it ignores."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sdpa_target" / "sdpa_target.py"
_spec = importlib.util.spec_from_file_location("usersdpa_example", _EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class NoCausal(example.SdpaSinglePrefill):
    """A planted defect: the causal mask is dropped (every key is visible)."""
    name = "usersdpa-nocausal"

    def run(self, case, problem, buffers):
        from dataclasses import replace
        return super().run(case, replace(problem, causal=False), buffers)


class WordsWithoutValues(example.SdpaSinglePrefill):
    """Refuses a GQA group that does not divide in its own words, but without the values."""
    name = "usersdpa-novalues"

    def run(self, case, problem, buffers):
        p = problem
        if p.num_kv_heads <= 0 or p.num_qo_heads % p.num_kv_heads:
            buffers.stage("run")
            raise ValueError("key_heads must divide num_qo_heads")
        return super().run(case, problem, buffers)


def make_target():
    return example.SdpaSinglePrefill()


def make_nocausal():
    return NoCausal()


def make_novalues():
    return WordsWithoutValues()
