"""A scripted inner stream for guard tests: yields given events, injects faults, counts closes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


def event(etype: str, rid: str = "resp_1", **fields: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"type": etype}
    if etype in {"response.created", "response.queued", "response.in_progress"}:
        e["response"] = {"id": rid, "status": "queued" if etype == "response.queued" else "in_progress"}
    e.update(fields)
    return e


def terminal(status: str = "completed", rid: str = "resp_1") -> dict[str, Any]:
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
    evs = [event("response.created"), event("response.in_progress")]
    evs += [
        {"type": "response.output_text.delta", "delta": f"d{i}", "output_index": 0} for i in range(n_deltas)
    ]
    if final is not None:
        evs.append(terminal(final))
    return evs


def make_context(*, background: bool = True, store: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        response_id="resp_1",
        client_cancelled=False,
        shutdown=asyncio.Event(),
        is_steered_turn=False,
        is_recovery=False,
        conversation_id=None,
        mode_flags=SimpleNamespace(background=background, stream=True, store=store),
    )


class BlockForever(Exception):
    """Marker: the scripted stream should block at this position, ignoring the signal."""


@dataclass
class Scripted:
    """Async iterator over ``events``; ``before`` hooks run just before event i is produced."""

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
    """Stands in for an executor that ignores the cancellation signal (but not task cancellation)."""
    await asyncio.sleep(3600)
