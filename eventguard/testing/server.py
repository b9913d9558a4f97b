"""A loopback server: an ASGI app under uvicorn on ``127.0.0.1``, a free port, bounded in time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn

__all__ = ["loopback_server", "wait_until"]

#: Default bound of starting, and of stopping, the server.
STEP = 20.0


class _EmbeddedServer(uvicorn.Server):
    """uvicorn serving inside a program that has its own life: the process's signals stay the
    program's. (uvicorn's own would take SIGINT and SIGTERM to stop serving, leave the program to
    find its server gone, and raise the signal again once stopped.)"""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@asynccontextmanager
async def loopback_server(
    app: Any, *, within: float = STEP, log_level: str = "critical", **config: Any
) -> AsyncIterator[str]:
    """Serve ``app`` (with its lifespan) on ``127.0.0.1`` and a free port; yield its base URL.

    Starting and stopping are each bounded by ``within`` seconds (``TimeoutError``). A server that
    stops before it serves raises its own error, or ``RuntimeError``. Leaving the block asks
    uvicorn to exit (its graceful shutdown runs the app's lifespan shutdown) and waits for it.
    ``config`` goes to ``uvicorn.Config`` (``backlog=``, ...). uvicorn does not take the process's
    signals: Ctrl-C interrupts the caller (``asyncio.run`` cancels it), and leaving the block then
    stops the server as above.
    """
    server = _EmbeddedServer(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level=log_level, **config)
    )
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started or task.done(), "uvicorn to start serving", within)
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started serving")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(within):
            await task


async def wait_until(predicate: Callable[[], bool], what: str = "a condition", within: float = STEP) -> None:
    """Poll ``predicate`` every 10 ms until it holds; ``TimeoutError`` naming ``what`` after ``within`` s."""
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 - polls state owned by someone else
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}") from None
