"""Helpers the guard's behaviour tests share: streams with odd closes, signals and flags of every kind,
a counting sink, bounded drains. Scripted streams themselves come from the public kit,
:mod:`eventguard.testing.streams`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from eventguard import Guard, Lifecycle
from eventguard.testing.streams import (
    Scripted,
    event,
    terminal,
)

BOUND = 5.0


GRACE = 0.05


CREATED = event("response.created")


CREATED_R1 = {"type": "response.created", "response": {"id": "r1", "status": "in_progress"}}


async def drain(g: Guard) -> list[Any]:
    async with asyncio.timeout(5):
        async with g:
            return [e async for e in g]


async def collect(g: Any) -> list[Any]:
    async with asyncio.timeout(BOUND):
        return [e async for e in g]


class OwningIterable:
    """An iterable that hands out a fresh iterator and owns a resource of its own (like openai's
    ``AsyncStream``): closing must reach both, the iterator first."""

    def __init__(self, events: list[Any], *, close_name: str = "aclose", fail_first: bool = False) -> None:
        self.inner = Scripted(events)
        self.log: list[str] = []
        self.fail_first = fail_first
        if close_name == "aclose":
            self.aclose = self._close
        elif close_name == "async close":
            self.close = self._close
        elif close_name == "sync close":
            self.close = self._sync_close

    def __aiter__(self) -> AsyncIterator[Any]:
        outer = self

        class It:
            def __aiter__(self) -> It:
                return self

            async def __anext__(self) -> Any:
                return await outer.inner.__anext__()

            async def aclose(self) -> None:
                outer.log.append("iterator")
                await outer.inner.aclose()
                if outer.fail_first:
                    raise RuntimeError("iterator close failed")

        return It()

    async def _close(self) -> None:
        self.log.append("iterable")

    def _sync_close(self) -> None:
        self.log.append("iterable (sync)")


@dataclass
class CountingSink:
    closes: int = 0
    events: list[int] = field(default_factory=list)

    def recorder(self, lifecycle: Lifecycle) -> CountingSink:
        return self

    def event(self, index: int, event_type: str | None, event: object) -> None:
        self.events.append(index)

    def changed(self) -> None:
        pass

    async def close(self) -> None:
        self.closes += 1


def watchdog_tasks() -> list[asyncio.Task[Any]]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "") == "Watchdog._watch" and not t.done()
    ]


class ClaimsEveryClass(type):
    """A metaclass whose classes claim to equal every class: such a class is told from ``str`` or
    ``GeneratorExit`` only by identity, which is how the guard compares classes."""

    def __eq__(cls, other: object) -> bool:
        return True

    __hash__ = type.__hash__


class TaskEqualToAny(asyncio.Task[Any]):
    """A task that claims to equal any object, other tasks included (see :func:`tasks_equal_to_any`)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = asyncio.Task.__hash__


@contextlib.asynccontextmanager
async def tasks_equal_to_any() -> AsyncIterator[None]:
    """While inside, the running loop makes every new task a :class:`TaskEqualToAny` (a task factory,
    as an application may install): the guard must tell tasks apart by identity."""
    loop = asyncio.get_running_loop()
    loop.set_task_factory(lambda loop, coro, **kw: TaskEqualToAny(coro, loop=loop, **kw))
    try:
        yield
    finally:
        loop.set_task_factory(None)


class PlainSignal:
    """A cancellation signal that is not an asyncio.Event: the watchdog polls it."""

    def __init__(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag


class IsSet:
    """A flag that is neither an asyncio.Event nor a threading.Event: only ``is_set()``."""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def is_set(self) -> bool:
        return self.value


SHUTDOWN_FLAGS = {
    "threading.Event": threading.Event,
    "is_set() object": IsSet,
    "asyncio.Event": asyncio.Event,
}


class BlockingClose(Scripted):
    """An inner stream whose close never returns: the guard must not wait for it inline."""

    async def aclose(self) -> None:
        self.closes += 1
        await asyncio.sleep(3600)


def stuck_inner(behaviour: str) -> Any:
    async def returns_late() -> None:
        await asyncio.sleep(6 * GRACE)

    async def inner() -> AsyncIterator[Any]:
        yield CREATED
        if behaviour == "honours the cancel":
            await asyncio.sleep(3600)
        else:
            call = asyncio.ensure_future(returns_late())
            try:
                await asyncio.shield(call)
            except asyncio.CancelledError:
                if behaviour == "swallows it and yields":
                    yield {"type": "response.output_text.delta", "delta": "x"}
                await call  # "swallows it and waits again"
            if behaviour == "swallows it, waits again, ends":
                return
        yield {"type": "response.output_text.delta", "delta": "late"}
        yield terminal()

    return inner()


def watchdog_timers(loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Timers scheduled from the watchdog's task, recorded as they are scheduled."""
    scheduled: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        task = asyncio.current_task()
        if task is not None and getattr(task.get_coro(), "__qualname__", "") == "Watchdog._watch":
            scheduled.append(when)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    return scheduled
