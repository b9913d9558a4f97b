"""The seam between the guard and persistence: two small protocols, no implementation.

The guard depends on these, never on a database; :class:`eventguard.SqlSink` is one implementation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from eventguard.lifecycle import Lifecycle

__all__ = ["Recorder", "Sink"]


@runtime_checkable
class Recorder(Protocol):
    """Records one response's stream. Created by a :class:`Sink` for each guard."""

    def event(self, index: int, event_type: str | None, event: object) -> None:
        """Called once per forwarded event, in order, on the guard's hot path: ``index`` counts from 0,
        ``event_type`` is its ``type`` (None when it has none), ``event`` the object forwarded.

        Must not await or do I/O: buffer a reference and serialise later. Events are not mutated
        after they were forwarded.
        """

    def changed(self) -> None:
        """The lifecycle gained a verified transition, an anomaly or a field: write it soon."""

    async def close(self) -> None:
        """Final flush, including the terminal. The guard shields it and bounds it in time.

        Database trouble must not raise here (spool instead); only programming errors propagate.
        """


@runtime_checkable
class Sink(Protocol):
    """Where guarded streams are recorded."""

    def recorder(self, lifecycle: Lifecycle) -> Recorder:
        """A recorder for one guarded stream; it keeps ``lifecycle`` and reads it when it writes."""
