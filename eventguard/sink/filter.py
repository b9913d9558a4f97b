"""How much history a sink keeps: decided per event on the hot path, before any serialisation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeAlias

from eventguard.events import LIFECYCLE_KINDS

#: "all": every forwarded event (the default, for audit). "finished": lifecycle events plus
#: finished output items, so deltas go but the final text stays. "lifecycle": lifecycle only.
EventMode: TypeAlias = Literal["all", "finished", "lifecycle"]
#: A user refinement: ``(event_type, event) -> keep?``. It runs on the hot path: keep it cheap. If
#: it raises, the event is kept and the error counted (``stats.unexpected_errors``) and logged.
EventPredicate: TypeAlias = Callable[[str | None, object], bool]

LIFECYCLE_TYPES: frozenset[str] = frozenset(LIFECYCLE_KINDS)
FINISHED_TYPES: frozenset[str] = LIFECYCLE_TYPES | {"response.output_item.done"}


class EventFilter:
    """Decides which forwarded events are stored. The response row and transitions always are.

    ``mode`` is an :data:`EventMode` (``"all"``, ``"finished"``, ``"lifecycle"``); ``predicate``, an
    :data:`EventPredicate`, refines it: an event is kept when the mode and the predicate both keep it.
    """

    __slots__ = ("_allowed", "_mode", "_predicate")

    def __init__(self, mode: EventMode = "all", predicate: EventPredicate | None = None) -> None:
        if mode not in ("all", "finished", "lifecycle"):
            raise ValueError(f"events= must be 'all', 'finished' or 'lifecycle', not {mode!r}")
        # Read-only once made: a recorder reads the filter once, when its stream starts.
        self._mode: EventMode = mode
        self._predicate = predicate
        self._allowed: frozenset[str] | None = {
            "all": None,
            "finished": FINISHED_TYPES,
            "lifecycle": LIFECYCLE_TYPES,
        }[mode]

    @property
    def mode(self) -> EventMode:
        """Which events are stored: ``"all"``, ``"finished"`` or ``"lifecycle"``."""
        return self._mode

    @property
    def predicate(self) -> EventPredicate | None:
        """The user's refinement of ``mode``, if any."""
        return self._predicate

    @property
    def keeps_all(self) -> bool:
        """Whether every event is kept (mode ``"all"``, no predicate): the hot path then asks nothing."""
        return self._allowed is None and self._predicate is None

    def keep(self, event_type: str | None, event: object) -> bool:
        """Whether the event (its ``event_type`` and the ``event`` forwarded) is stored."""
        allowed = self._allowed
        if allowed is not None and event_type not in allowed:
            return False
        predicate = self._predicate
        return predicate is None or bool(predicate(event_type, event))
