"""Scripted inner streams: plain async iterables of event dicts, with faults at chosen positions.

Nothing here imports the host: a :class:`Scripted` stream and a :func:`host_context` are enough to drive
:func:`eventguard.guard` as the host would, in any test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

__all__ = ["Scripted", "block_ignoring_signal", "event", "host_context", "stream_events", "terminal"]

_STARTS = frozenset({"response.created", "response.queued", "response.in_progress"})


def event(etype: str, rid: str = "resp_1", **fields: Any) -> dict[str, Any]:
    """An event dict of type ``etype``; a lifecycle start carries a ``response`` snapshot of ``rid``."""
    e: dict[str, Any] = {"type": etype}
    if etype in _STARTS:
        e["response"] = {"id": rid, "status": "queued" if etype == "response.queued" else "in_progress"}
    e.update(fields)
    return e


def terminal(status: str = "completed", rid: str = "resp_1") -> dict[str, Any]:
    """The terminal event for ``status`` (``cancelled`` travels as ``response.failed``), with usage."""
    etype = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
        status, "response.failed"
    )
    return {
        "type": etype,
        "response": {
            "id": rid,
            "status": status,
            "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
        },
    }


def stream_events(n_deltas: int = 17, final: str | None = "completed") -> list[dict[str, Any]]:
    """``created``, ``in_progress``, ``n_deltas`` text deltas, then ``terminal(final)`` (none if None)."""
    evs = [event("response.created"), event("response.in_progress")]
    evs += [
        {"type": "response.output_text.delta", "delta": f"d{i}", "output_index": 0} for i in range(n_deltas)
    ]
    if final is not None:
        evs.append(terminal(final))
    return evs


def host_context(*, background: bool = True, store: bool = True, response_id: str = "resp_1") -> Any:
    """A stand-in for the host's response context: the fields the guard reads, all flags clear.

    Set ``client_cancelled = True`` or ``shutdown.set()`` on it to play the host's part.
    """
    return SimpleNamespace(
        response_id=response_id,
        client_cancelled=False,
        shutdown=asyncio.Event(),
        is_steered_turn=False,
        is_recovery=False,
        conversation_id=None,
        mode_flags=SimpleNamespace(background=background, stream=True, store=store),
    )


@dataclass
class Scripted:
    """An async iterator over ``events``; ``before[i]`` runs (awaited if it is a coroutine) just
    before event ``i`` is produced, and ``before[len(events)]`` before the stream ends.

    ``produced`` lists what was handed out; ``closes`` counts ``aclose()`` calls.
    """

    events: list[Any]
    before: dict[int, Callable[[], Any]] = field(default_factory=dict)
    closes: int = 0
    produced: list[Any] = field(default_factory=list)
    _gen: AsyncGenerator[Any, None] | None = None

    def __post_init__(self) -> None:
        self._gen = self._run()

    async def _run(self) -> AsyncGenerator[Any, None]:
        for i in range(len(self.events) + 1):
            hook = self.before.get(i)
            if hook is not None:
                result = hook()
                if asyncio.iscoroutine(result):
                    await result
            if i == len(self.events):
                return
            self.produced.append(self.events[i])
            yield self.events[i]

    def __aiter__(self) -> Scripted:
        return self

    async def __anext__(self) -> Any:
        assert self._gen is not None
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        self.closes += 1
        assert self._gen is not None
        await self._gen.aclose()


async def block_ignoring_signal() -> None:
    """Block for an hour: an inner stream's executor that ignores the cancellation signal but not task
    cancellation. As a :class:`Scripted` ``before`` hook it makes the stream stuck at that position
    (the watchdog's case); cancel the task to end the wait."""
    await asyncio.sleep(3600)
