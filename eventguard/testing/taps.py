"""The tap: what a stream yielded, event by event, with the host's cause flags at that moment."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import Any

__all__ = ["TERMINAL_TYPES", "Seen", "seen", "tap"]

#: The event types that end a response (a cancel travels as ``response.failed``).
TERMINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass(frozen=True)
class Seen:
    """One event as a wrapper saw it, with the cause flags when it came out.

    Letters of :attr:`flags`: S the cancellation signal, C ``context.client_cancelled``,
    D ``context.shutdown`` set, T ``context.is_steered_turn``.
    """

    type: str
    signal: bool
    client_cancelled: bool
    shutdown: bool
    steered: bool
    event: object = None

    @property
    def flags(self) -> str:
        return "".join(
            letter
            for letter, on in (
                ("S", self.signal),
                ("C", self.client_cancelled),
                ("D", self.shutdown),
                ("T", self.steered),
            )
            if on
        )

    @property
    def ending(self) -> str | None:
        """For a terminal: ``completed``, ``incomplete``, ``failed`` or ``cancelled``; else None."""
        if self.type not in TERMINAL_TYPES:
            return None
        kind = self.type.removeprefix("response.")
        event = self.event
        response = event.get("response") if isinstance(event, dict) else None
        if kind == "failed" and isinstance(response, dict) and response.get("status") == "cancelled":
            return "cancelled"
        return kind


def event_type(event: object) -> str:
    """A dict's ``type``; for any other object (the host's checkpoint events), its class name."""
    if isinstance(event, dict):
        return str(event.get("type"))
    return type(event).__name__


def seen(event: object, signal: Any = None, context: Any = None) -> Seen:
    """``event`` with the flags of ``signal`` (anything with ``is_set()``) and ``context`` now."""
    shutdown = getattr(context, "shutdown", None)
    return Seen(
        type=event_type(event),
        signal=bool(signal is not None and signal.is_set()),
        client_cancelled=bool(getattr(context, "client_cancelled", False)),
        shutdown=bool(shutdown is not None and shutdown.is_set()),
        steered=bool(getattr(context, "is_steered_turn", False)),
        event=event,
    )


async def tap(
    stream: AsyncIterable[Any], into: list[Seen], signal: Any = None, context: Any = None
) -> AsyncGenerator[Any, None]:
    """Yield what ``stream`` yields, unchanged, appending each event to ``into`` as :func:`seen`.

    The tap owns ``stream``: it closes it (``aclose()``, when it has one) once, however the tap ends;
    close the tap itself with ``contextlib.aclosing`` to close the stream at a known moment. Put it
    below a guard to see what the unguarded handler yielded, or above one to see what the host was
    handed.
    """
    inner = aiter(stream)
    try:
        async for event in inner:
            into.append(seen(event, signal, context))
            yield event
    finally:
        close = getattr(inner, "aclose", None)
        if close is not None:
            await close()
