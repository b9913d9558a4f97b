"""One writer state per event loop: what a sink used from several loops keeps apart.

An AsyncEngine's pool, an ``asyncio.Event`` and a ``Lock`` belong to the loop that first used
them. A sink used from several loops one after the other (a module-level sink, two
``asyncio.run()`` calls, function-scoped test loops) keeps one :class:`LoopState` per loop: each
loop gets its own, and a closed loop's state is forgotten the next time a new loop comes. Two
loops running at the same time in two threads cannot share a sink: the second gets
:class:`~eventguard.errors.SinkLoopError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from eventguard.errors import SinkLoopError
from eventguard.sink.report import log
from eventguard.sql import engine as _db

__all__ = ["LoopState", "Loops"]


@dataclass(eq=False, slots=True)
class LoopState:
    """What one event loop's writer owns: each is bound to the loop that first used it."""

    loop: asyncio.AbstractEventLoop
    #: Set to wake the writer (the hot path sets it).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Held around each write (a cycle, a replayed chunk): one transaction at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Held by a replay: one replay at a time on this loop.
    replay_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    engine: AsyncEngine | None = None
    #: The writer task.
    task: asyncio.Task[None] | None = None
    #: The background replay of the spool, if one was started.
    replay: asyncio.Task[Any] | None = None
    #: Set by ``aclose()``: the writer ends after its current cycle.
    stopping: bool = False
    #: The wake-up a lifecycle change asked for, ``flush_interval`` later (one at a time: the
    #: changes meanwhile share it).
    soon: asyncio.TimerHandle | None = None


class Loops:
    """The states of every event loop that used one sink; ``live`` is the current loop's.

    ``name``: the sink's name, for errors; ``take_unbound``: hands over (and forgets) an engine
    made outside any event loop, for the first loop to use.
    """

    def __init__(self, name: Callable[[], str], take_unbound: Callable[[], AsyncEngine | None]) -> None:
        self._name = name
        self._take_unbound = take_unbound
        self.states: list[LoopState] = []
        self.live: LoopState | None = None
        #: The live loop's wake event (the hot path sets it without a lookup).
        self.wake = asyncio.Event()

    def here(self) -> LoopState:
        """The running loop's state, made on its first use (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        st = self.live
        if st is not None and st.loop is loop:
            return st
        for st in self.states:
            if st.loop is loop:
                break
        else:
            for other in self.states:
                if other.loop.is_running() and other.task is not None and not other.task.done():
                    raise SinkLoopError(
                        f"{self._name()} is in use by another running event loop (another thread): "
                        "create one SqlSink per event loop"
                    )
            st = LoopState(loop)
            st.engine = self._take_unbound()
            self.states = [s for s in self.states if not _retire(s)]
            self.states.append(st)
        self.live = st
        self.wake = st.wake
        return st

    def writing(self) -> bool:
        """Whether the current loop's writer task is alive: it will store, or keep, what it was given."""
        st = self.live
        if st is None or st.task is None or st.task.done():
            return False
        try:
            return st.loop is asyncio.get_running_loop()
        except RuntimeError:
            return False


def _retire(st: LoopState) -> bool:
    """Forget a closed loop's state (its writer disposed of its engine when the loop ended;
    if it could not, the pool is dropped without touching the loop-bound connections)."""
    if not st.loop.is_closed():
        return False
    engine, st.engine = st.engine, None
    if engine is not None:
        try:
            _db.let_go(engine)
        except Exception as exc:  # pragma: no cover - no I/O is involved
            log.debug("eventguard sink: dropping a closed loop's pool: %s", exc)
    return True
