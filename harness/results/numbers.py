"""A number read from a results table, which may come from a stranger: a float, or None
for what is missing, not a number, a boolean or NaN (never an exception)."""
from __future__ import annotations

import math


def finite_number(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value
