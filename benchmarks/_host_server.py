"""One server of the host-level benchmark, in a process of its own.

``python -m benchmarks._host_server VARIANT [--sqlite PATH | --pg-schema NAME] --spool PATH`` serves a
real ``ResponsesHostServer`` (the host's own handler over a model-free chat agent) through uvicorn on
``127.0.0.1`` and a free port, prints one JSON line ``{"url": ..., "pid": ...}`` once it serves, and
runs until its stdin closes (or SIGTERM). Variants: ``unguarded`` (the host as shipped),
``unguarded-twin`` (a second server of the same code: the benchmark's own resolution), ``guarded``
(``GuardedResponses``, no sink), ``sqlite`` and ``postgres`` (``GuardedResponses`` + ``SqlSink``), and
``sqlite-store`` and ``postgres-store``: the same sink and ``database=`` on the same database, so the
host's response store and agent sessions are eventguard's SQL provider instead of its state folder
(the whole of eventguard, as the README's "one database" setup writes it).

The host keeps its state (stored responses) under ``AGENTSERVER_STATE_ROOT``, which the parent sets
to a folder of this server's own. Two routes of the benchmark's own sit beside the host's:

- ``POST /_bench/reset`` empties that folder (between rounds, while no response is in flight) and
  collects garbage, so every round starts from the same host state;
- ``POST /_bench/flush`` returns once the sink has written everything it was given (at once without
  a sink), so the server CPU measured around a run includes the writing it caused;
- ``GET /_bench/gc`` returns the seconds this process has spent in the cyclic garbage collector so
  far, and how many collections of each generation ran (``gc.callbacks``, every thread), so the
  part of the CPU time that is collection can be told apart from the rest; and the process's
  context switches so far (``getrusage``: every thread, ended ones included), so the thread
  hand-offs and waits a variant adds can be counted.

The sink is started and closed in the app's lifespan, on uvicorn's event loop: uvicorn re-raises
SIGTERM once it has stopped, so code after ``serve()`` may never run, and a sink closed there would
never be closed. (The library has no lifespan hook for its sink yet; this wraps the router's.)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from agent_framework_foundry_hosting import ResponsesHostServer
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from eventguard.foundry import GuardedResponses
from eventguard.sink import SqlSink
from eventguard.testing import ScriptedChatClient, chat_agent

from ._common import PG_URL
from ._report import quiet_eventguard_logs

VARIANTS = ("unguarded", "unguarded-twin", "guarded", "sqlite", "postgres", "sqlite-store", "postgres-store")
#: 20 text chunks make a 28-event SSE response (created, in_progress, the message's added/done
#: events, 20 deltas, completed), the size the issue measured.
CHUNKS = tuple(f"tok{i} " for i in range(20))


class GuardedServer(GuardedResponses, ResponsesHostServer):  # type: ignore[misc,unused-ignore]
    """The one-line integration, as a user writes it."""


def database_url(args: argparse.Namespace) -> str | None:
    """The variant's database (``None`` for the unguarded and the guard-only servers)."""
    if args.variant.startswith("sqlite"):
        return f"sqlite+aiosqlite:///{args.sqlite}"
    if args.variant.startswith("postgres"):
        return PG_URL
    return None


def build_sink(args: argparse.Namespace) -> SqlSink | None:
    """The variant's sink (``None`` for the unguarded and the guard-only servers)."""
    url = database_url(args)
    if url is None:
        return None
    return SqlSink(url, schema=args.pg_schema, spool_path=args.spool)


def build_server(args: argparse.Namespace, sink: SqlSink | None) -> ResponsesHostServer:
    """The variant's host over a fresh scripted chat agent (no model, no network)."""
    agent, _probe = chat_agent(ScriptedChatClient(CHUNKS))
    if args.variant.startswith("unguarded"):
        return ResponsesHostServer(agent, configure_observability=None)
    if args.variant.endswith("-store"):
        # The sink is passed too, only so that its spool is this server's folder (with database=
        # alone a PostgreSQL sink spools to the working directory, the project root here); it is
        # the SqlSink database= builds, on the same URL.
        return GuardedServer(
            agent, sink=sink, database=database_url(args), schema=args.pg_schema, configure_observability=None
        )
    return GuardedServer(agent, sink=sink, configure_observability=None)


def _sink_in_lifespan(
    lifespan: Callable[[Any], AbstractAsyncContextManager[Any]], sink: SqlSink
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    @asynccontextmanager
    async def with_sink(app: Any) -> AsyncIterator[Any]:
        await sink.start()  # on the loop that serves: the sink is bound to it
        try:
            async with lifespan(app) as state:  # the host's own startup and shutdown
                yield state
        finally:
            await sink.aclose()  # after the host ended its responses, before the loop goes

    return with_sink


def empty_folder(root: Path) -> None:
    """Remove everything under ``root`` (kept itself): the host's stored responses and sessions."""
    for child in root.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


class GcClock:
    """Seconds spent in the cyclic garbage collector, and collections per generation, since
    :meth:`install` (a ``gc.callbacks`` hook: the collector runs on whichever thread allocated)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def reading(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "seconds": self.seconds,
            "collections": list(self.collections),
            "switches": usage.ru_nvcsw + usage.ru_nivcsw,
        }


def add_bench_routes(
    server: ResponsesHostServer, sink: SqlSink | None, state_root: Path, clock: GcClock
) -> None:
    """``/_bench/reset``, ``/_bench/flush`` and ``/_bench/gc``, ahead of the host's routes."""

    async def reset(_request: Request) -> JSONResponse:
        empty_folder(state_root)
        gc.collect()
        return JSONResponse({"ok": True})

    async def flush(_request: Request) -> JSONResponse:
        if sink is not None:
            async with asyncio.timeout(120):
                await sink.flush()
            return JSONResponse({"spooled": sink.stats.batches_spooled})
        return JSONResponse({"spooled": 0})

    async def collector(_request: Request) -> JSONResponse:
        return JSONResponse(clock.reading())

    server.router.routes[:0] = [
        Route("/_bench/reset", reset, methods=["POST"]),
        Route("/_bench/flush", flush, methods=["POST"]),
        Route("/_bench/gc", collector, methods=["GET"]),
    ]


def _stop_when_stdin_closes(server: uvicorn.Server, loop: asyncio.AbstractEventLoop) -> None:
    def wait() -> None:
        sys.stdin.read()  # EOF: the parent is done with us (or gone)
        loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    threading.Thread(target=wait, name="stdin-watch", daemon=True).start()


async def serve(args: argparse.Namespace) -> None:
    """Serve until told to stop; announce the URL on stdout once uvicorn listens."""
    quiet_eventguard_logs()
    sink = build_sink(args)
    app = build_server(args, sink)
    if sink is not None:
        app.router.lifespan_context = _sink_in_lifespan(app.router.lifespan_context, sink)
    clock = GcClock()
    clock.install()
    add_bench_routes(app, sink, Path(os.environ["AGENTSERVER_STATE_ROOT"]), clock)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            lifespan="on",
            log_level="warning",
            access_log=False,
            backlog=4096,
            timeout_keep_alive=600,  # the client keeps its connections for the whole run
        )
    )
    _stop_when_stdin_closes(server, asyncio.get_running_loop())
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(120):
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started serving")
            await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}), flush=True)
    await task


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._host_server")
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--sqlite", type=Path, default=None, help="the SQLite file (variants sqlite*)")
    ap.add_argument("--pg-schema", default=None, help="the PostgreSQL schema (variants postgres*)")
    ap.add_argument("--spool", type=Path, required=True, help="the sink's spool file")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
