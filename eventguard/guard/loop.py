"""The event loop a guard is bound to: the one it was built in, when it has a sink.

A sink's recorder belongs to the running loop it was made in (its writer task lives there), so a
guard with a sink must be built inside a running loop and iterated in that same loop; a guard
without one may be built anywhere, but is iterated inside a loop. Both checks raise
:class:`~eventguard.errors.GuardOutsideLoop`, saying what to do.
"""

from __future__ import annotations

import asyncio
from typing import Final

from eventguard.errors import GuardOutsideLoop

__all__ = ["bound_loop", "check_loop"]

_OUTSIDE_LOOP: Final = (
    "build the guard inside the coroutine that iterates it: guard() {what}, and a guard is bound to the "
    "event loop it was built in"
)


def bound_loop(*, has_sink: bool) -> asyncio.AbstractEventLoop | None:
    """The running loop a guard being built is bound to (None outside one: allowed without a sink).

    Raises ``GuardOutsideLoop`` for a guard with a sink (``has_sink``) built outside a running loop:
    its recorder belongs to a running loop, and without one it would fail deep inside.
    """
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        if has_sink:
            raise GuardOutsideLoop(
                _OUTSIDE_LOOP.format(what="with a sink was called outside a running event loop")
            ) from None
        return None


def check_loop(bound: asyncio.AbstractEventLoop | None, *, has_sink: bool) -> asyncio.AbstractEventLoop:
    """The running loop a guard is iterated in, which must be ``bound``, the one it was built in,
    when it has a sink (``has_sink``). Raises ``GuardOutsideLoop`` otherwise."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise GuardOutsideLoop(
            _OUTSIDE_LOOP.format(what="was iterated outside a running event loop")
        ) from None
    if has_sink and loop is not bound:
        raise GuardOutsideLoop(_OUTSIDE_LOOP.format(what="was iterated in another event loop than its own"))
    return loop
