"""The typed errors users catch.

Everything eventguard raises on purpose derives from :class:`EventGuardError`, so one
``except EventGuardError`` separates our verdicts from bugs and from the host's own errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eventguard.lifecycle import State

__all__ = [
    "EventGuardError",
    "GuardAlreadyUsed",
    "GuardOutsideLoop",
    "IllegalTransition",
    "InvalidEvent",
    "NotAsyncIterable",
]


class EventGuardError(Exception):
    """Base class of every error eventguard raises on purpose."""


class IllegalTransition(EventGuardError):
    """The lifecycle state machine refused a transition.

    The guard records it as an anomaly and carries on, unless it was built with ``strict=True``.
    """

    def __init__(self, from_state: State, to_state: State, reason: str) -> None:
        self.from_state = from_state
        self.to_state = to_state
        self.reason = reason
        super().__init__(f"illegal lifecycle transition {from_state.value} -> {to_state.value}: {reason}")


class InvalidEvent(EventGuardError):
    """An event the guard cannot accept: raised only by a ``strict`` guard; otherwise an anomaly."""


class NotAsyncIterable(EventGuardError, TypeError):
    """``guard()`` was handed something that is not an async iterable."""


class GuardAlreadyUsed(EventGuardError, RuntimeError):
    """A guard is single-use: it was iterated, or entered, a second time."""


class GuardOutsideLoop(EventGuardError, RuntimeError):
    """A guard was built or iterated outside the running event loop it needs.

    Build the guard inside the coroutine that iterates it.
    """
