"""A spec's values checked one at a time: numbers, shares, whole numbers and mappings, each
error naming the field (``SpecError``), and the bounds past which a value is a slip."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tuner.errors import SpecError

# Beyond these a value is a slip, not a setting: seconds (a day), a time scale, a count of
# trials or measurements, a bound of a searched argument (what a float holds exactly).
MOST_S = 86400.0
MOST_SCALE = 1000.0
LEAST_SCALE = 1 / MOST_SCALE
MOST_TRIALS = 100_000
MOST_REPEATS = 1000
MOST_BOUND = float(2**53)
# Choices of a categorical dimension: what Optuna stores as a parameter.
CHOICE_TYPES = (str, int, float, bool, type(None))


def checked_number(
    path: str, name: str, value: Any, *, positive: bool = True, most: float = MOST_BOUND
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(path, name, f"must be a number, got {value!r}")
    if positive and value <= 0:
        raise SpecError(path, name, f"must be positive, got {value!r}")
    if abs(value) > most:
        raise SpecError(path, name, f"{value!r} is beyond any sensible value (at most {most:g})")
    return float(value)


def checked_share(path: str, name: str, value: Any) -> float:
    number = checked_number(path, name, value)
    if number > 1:
        raise SpecError(path, name, f"must be a share from 0 to 1, got {value!r}")
    return number


def checked_whole(path: str, name: str, value: Any, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise SpecError(path, name, f"must be a whole number from {least} to {most}, got {value!r}")
    return value


def checked_mapping(path: str, name: str, value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, name, f"must be a mapping, got {type(value).__name__}")
    odd = [k for k in value if not isinstance(k, str) or not k.strip() or not k.isprintable()]
    if odd:
        raise SpecError(path, name, f"has a key that is not a name: {odd[0]!r}")
    return value
