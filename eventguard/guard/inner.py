"""The inner stream: the guard closes it exactly once, in the call that ends the guard or in the
background (a stuck stream's close may block as long as it likes).

As aiostream's ``AsyncIteratorContext``: the guard is responsible for the inner stream from the moment
it is built, and :class:`InnerStream` is the one object that closes it. Background work the guard
leaves behind (that close, a bounded final flush, the watchdog's task) is kept alive here until it
ends (:func:`spawn`, :func:`keep`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from eventguard.errors import NotAsyncIterable

__all__ = ["InnerStream", "aiter_of", "empty", "keep", "spawn"]

log = logging.getLogger("eventguard.guard")

#: Keeps background work (a bounded final flush, a stuck inner's close) alive until it ends.
_BACKGROUND: set[asyncio.Future[Any]] = set()


class InnerStream:
    """One inner stream: its iterator, and how and whether it was closed."""

    __slots__ = ("_closer", "closed", "iterator")

    def __init__(self, stream: Any, iterator: AsyncIterator[Any]) -> None:
        self.iterator = iterator
        self._closer = _closer_for(stream, iterator)
        #: How many times the inner stream was closed (0 or 1).
        self.closed = 0

    async def close(self) -> None:
        """Close the inner stream in this call; again: a no-op."""
        if self.closed:
            return
        self.closed += 1
        if self._closer is not None:
            await self._closer()

    def release(self) -> None:
        """The guard has ended and closed the stream (or is closing it in the background, which
        holds what it needs): let go of it, keeping only how often it was closed."""
        self.iterator = empty()
        self._closer = None

    def close_in_background(self) -> None:
        """Close the inner stream in a task of its own, whose errors go to the log; again: a no-op."""
        # The inner stream ignored the signal: closing it could block as long as it likes, so the
        # guard ends its own stream now and leaves the close to run on its own.
        if self.closed:
            return
        self.closed += 1
        if self._closer is not None:
            spawn(_close_quietly(self._closer))


async def empty() -> AsyncGenerator[Any, None]:
    """An async generator that ends at once: a released :class:`InnerStream`'s iterator, and what
    a finished guard gives ``async for``."""
    return
    yield


def aiter_of(stream: object) -> Callable[[], AsyncIterator[Any]]:
    """``stream.__aiter__``, not yet called; ``NotAsyncIterable`` unless ``stream`` is an async iterable."""
    aiter_: Callable[[], AsyncIterator[Any]] | None = getattr(stream, "__aiter__", None)
    if aiter_ is None:
        raise NotAsyncIterable(f"guard() needs an async iterable, got {type(stream).__name__}")
    return aiter_


def spawn(aw: Awaitable[Any]) -> asyncio.Future[Any]:
    """Run ``aw`` in the background, kept alive until it ends."""
    fut = asyncio.ensure_future(aw)
    _BACKGROUND.add(fut)
    fut.add_done_callback(_BACKGROUND.discard)
    return fut


def keep(task: asyncio.Future[Any]) -> None:
    """Keep ``task`` alive until it ends."""
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _closer_for(stream: object, iterator: object) -> Callable[[], Awaitable[Any]] | None:
    """How to close the inner stream: its iterator, and the iterable too when that owns a resource.

    The ``openai`` SDK's ``AsyncStream`` hands out a fresh async generator from ``__aiter__`` and
    keeps the HTTP response itself, released by its own ``close()``: closing only the generator would
    leave the connection open.
    """
    closers: list[Callable[[], Awaitable[Any]]] = []
    aclose = getattr(iterator, "aclose", None)
    if callable(aclose):
        closers.append(aclose)
    if stream is not iterator:
        own = getattr(stream, "aclose", None)
        if own is None:
            close = getattr(stream, "close", None)
            own = close if close is not None and inspect.iscoroutinefunction(close) else None
        if callable(own):
            closers.append(own)
    if not closers:
        return None
    if len(closers) == 1:
        return closers[0]

    async def close_both() -> None:
        try:
            await closers[0]()
        finally:
            await closers[1]()

    return close_both


async def _close_quietly(closer: Callable[[], Awaitable[Any]]) -> None:
    # A task of its own that nobody awaits: whatever the close raises (the host's
    # ResponseExitForRecovery included) has nowhere to go but the log. A cancel (the loop is
    # shutting down) and the interpreter's own exits still go through.
    try:
        await closer()
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        log.warning("closing a stuck inner stream raised", exc_info=True)
