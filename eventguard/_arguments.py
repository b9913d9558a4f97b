"""Checking a constructor's settings where they are given: a ``TypeError`` or ``ValueError`` that
names the argument, at once, instead of a failure later inside a stream.

Unchecked, ``SqlSink(flush_interval="1")`` was built without a word and then ended the first stream it
recorded with a ``TypeError`` from the event loop's timer; ``max_payload_bytes="x"`` sent every event
to the quarantine instead of the database; a ``nan`` timeout compares false with everything, so it
was never "too long". A number here is an ``int`` or a ``float``, never a ``bool`` (``True`` is an
``int`` to Python, and never meant as a count or a duration); a duration is finite.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Literal, overload

__all__ = ["callable_or_none", "count", "flag", "fraction", "seconds", "text"]


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:  # an int past a float's range: no event loop takes it as a delay
        raise ValueError(f"{name} must be a finite number, not an int too large for a float") from None


@overload
def seconds(name: str, value: object, *, zero: bool = ..., none: Literal[False] = False) -> float: ...
@overload
def seconds(name: str, value: object, *, zero: bool = ..., none: Literal[True]) -> float | None: ...
def seconds(name: str, value: object, *, zero: bool = True, none: bool = False) -> float | None:
    """``value`` as a duration in seconds: finite, above zero (``zero``: or zero); ``none``: None
    allowed (no limit)."""
    if value is None and none:
        return None
    number = _number(name, value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        least = ">= 0" if zero else "> 0"
        also = " or None" if none else ""
        raise ValueError(f"{name} must be a finite number of seconds {least}{also}, not {value!r}")
    return number


def fraction(name: str, value: object) -> float:
    """``value`` as a finite share of something, zero or more (``0.5``: half as much again)."""
    number = _number(name, value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    return number


def count(name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` as a whole number of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {value!r}")
    return value


@overload
def flag(name: str, value: object, *, none: Literal[False] = False) -> bool: ...
@overload
def flag(name: str, value: object, *, none: Literal[True]) -> bool | None: ...
def flag(name: str, value: object, *, none: bool = False) -> bool | None:
    """``value`` as a ``bool`` (``none``: or None). A string such as ``"false"`` is truthy: refused."""
    if value is None and none:
        return None
    if not isinstance(value, bool):
        also = " or None" if none else ""
        raise TypeError(f"{name} must be True or False{also}, not {type(value).__name__}")
    return value


def text(name: str, value: object) -> str | None:
    """``value`` as a ``str`` or None."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")
    return value


def callable_or_none(name: str, value: object) -> Callable[..., Any] | None:
    """``value`` as something called for its answer at once, or None. An ``async def`` one answers
    with a coroutine: always true as a ``bool``, and stored as its repr as a payload."""
    if value is None:
        return None
    if not callable(value):
        raise TypeError(f"{name} must be callable or None, not {type(value).__name__}")
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(getattr(value, "__call__", None)):  # noqa: B004
        raise TypeError(f"{name} must answer at once, not be async")
    return value
