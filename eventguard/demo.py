"""``eventguard demo``: five real responses through a guarded ``ResponsesHostServer``, no model.

Each scenario starts a real ``ResponsesHostServer`` (guarded with :mod:`eventguard.foundry`, recording
into an :class:`~eventguard.sink.SqlSink`) under uvicorn on ``127.0.0.1``, drives it with the official
``openai`` client, and then sets side by side, per response:

- what the *unguarded* upstream handler yielded as its terminal (tapped inside the server, before the
  guard), with the cause flags at that moment;
- what eventguard recorded (read back from the database);
- what the public API reports (``client.responses.retrieve``).

The executors and the chat client are the model-free building blocks of :mod:`eventguard._scenarios`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import openai
import uvicorn
from sqlalchemy.engine import URL

from eventguard import _db
from eventguard.records import ResponseRecord
from eventguard.sink import SqlSink
from eventguard.sink import migrate as _migrate
from eventguard.store import ResponseStore

__all__ = ["DemoResult", "Observed", "Row", "run_demo"]

#: Bound of one step (a request, a wait for an executor, the guard's ending).
STEP = 20.0
#: How long the guard waits for a handler the host stopped iterating after a cancel.
CANCEL_GRACE = 1.0
TERMINAL_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})
ENDED = frozenset({"completed", "incomplete", "failed", "cancelled"})
QUIET_LOGGERS = (
    "azure.ai.agentserver",
    "agent_framework",
    "agent_framework_foundry_hosting",
    "httpx",
    "openai",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "asyncio",
)


@dataclass
class Observed:
    """What the unguarded handler yielded for one response, with the flags as each event came out."""

    types: list[str] = field(default_factory=list)
    terminal: str | None = None  # "completed", "failed", "cancelled", "incomplete"; None: no terminal
    flags: str = ""  # S = cancellation signal, C = client_cancelled, D = shutdown

    @property
    def shown(self) -> str:
        if self.terminal is None:
            return "(no terminal)"
        return self.terminal + (f" {{{self.flags}}}" if self.flags else "")


@dataclass(frozen=True)
class Row:
    """One line of the demo's table."""

    number: int
    scenario: str
    response_id: str
    unguarded: Observed
    recorded: ResponseRecord | None
    public: str | None
    seconds: float

    @property
    def recorded_status(self) -> str | None:
        return None if self.recorded is None else self.recorded.status

    @property
    def lie(self) -> bool:
        """The unguarded handler claimed an ending that is not what happened."""
        claimed = self.unguarded.terminal
        return claimed is not None and claimed != self.recorded_status

    @property
    def consistent(self) -> bool:
        """eventguard's record and the public API agree."""
        return self.recorded_status is not None and self.recorded_status == self.public

    @property
    def verdict(self) -> str:
        if not self.consistent:
            return "MISMATCH: record != API"
        if self.unguarded.terminal is None:
            return "no terminal; cause kept"
        if self.lie:
            return "LIE, corrected"
        return "truthful"

    def as_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "scenario": self.scenario,
            "response_id": self.response_id,
            "unguarded_terminal": self.unguarded.terminal,
            "unguarded_flags": self.unguarded.flags,
            "unguarded_events": self.unguarded.types,
            "recorded_status": self.recorded_status,
            "recorded_cause": None if self.recorded is None else self.recorded.cause,
            "public_status": self.public,
            "lie": self.lie,
            "consistent": self.consistent,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class DemoResult:
    url: str  # without the password
    versions: dict[str, str]
    rows: list[Row]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(row.consistent for row in self.rows)


Progress = Callable[[str], None]


def upstream_versions() -> dict[str, str]:
    names = ("agent-framework-foundry-hosting", "agent-framework-core", "azure-ai-agentserver-responses")
    out: dict[str, str] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# -- the server -------------------------------------------------------------------------------------


def _flags(signal: Any, context: Any) -> str:
    shutdown = getattr(context, "shutdown", None)
    on = (
        ("S", bool(signal.is_set())),
        ("C", bool(getattr(context, "client_cancelled", False))),
        ("D", bool(shutdown is not None and shutdown.is_set())),
    )
    return "".join(letter for letter, set_ in on if set_)


def _terminal_of(event: dict[str, Any]) -> str:
    kind = str(event.get("type", "")).removeprefix("response.")
    response = event.get("response")
    status = response.get("status") if isinstance(response, dict) else None
    if kind == "failed" and status == "cancelled":
        return "cancelled"
    return kind


def _server_class() -> type[Any]:
    """``GuardedResponses`` over a tap over ``ResponsesHostServer``: the tap sees the raw handler."""
    from agent_framework_foundry_hosting import ResponsesHostServer

    from eventguard.foundry import GuardedResponses

    class Tap(ResponsesHostServer):  # type: ignore[misc,unused-ignore]
        """Records what the unguarded upstream handler yields, before the guard sees it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.observed: dict[str, Observed] = {}

        async def _handle_response(self, request: Any, context: Any, cancellation_signal: Any) -> Any:
            seen = self.observed.setdefault(str(context.response_id), Observed())
            upstream: Any = super()._handle_response(request, context, cancellation_signal)
            async with aclosing(upstream) as inner:
                async for event in inner:
                    etype = event.get("type") if isinstance(event, dict) else type(event).__name__
                    seen.types.append(str(etype))
                    if isinstance(event, dict) and etype in TERMINAL_TYPES and seen.terminal is None:
                        seen.terminal = _terminal_of(event)
                        seen.flags = _flags(cancellation_signal, context)
                    yield event

    class DemoServer(GuardedResponses, Tap):  # type: ignore[misc,unused-ignore]
        """The guarded server of the demo (MRO: guard -> tap -> ResponsesHostServer)."""

    return DemoServer


@asynccontextmanager
async def _serving(app: Any) -> AsyncIterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="critical")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(STEP):
            while not (server.started or task.done()):  # noqa: ASYNC110 - uvicorn exposes a flag only
                await asyncio.sleep(0.01)
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started serving")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(STEP):
            await task


async def _wait(predicate: Callable[[], bool], what: str, within: float = STEP) -> None:
    try:
        async with asyncio.timeout(within):
            while not predicate():  # noqa: ASYNC110 - polls state owned by the host
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}") from None


async def _wait_event(event: asyncio.Event, what: str) -> None:
    await _wait(event.is_set, what)


# -- the scenarios ----------------------------------------------------------------------------------


@dataclass
class _Ctx:
    """What one scenario needs: its server (for the tap and the guard) and a client."""

    server: Any
    client: openai.AsyncOpenAI

    def ended(self, response_id: str) -> bool:
        g = self.server.guard_for(response_id)
        return g is not None and g.lifecycle.ended

    def saw(self, response_id: str, event_type: str) -> bool:
        seen = self.server.observed.get(response_id)
        return seen is not None and event_type in seen.types


async def _completes(ctx: _Ctx, probe: Any) -> str:
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(model="scripted", input="hello", stream=True, store=True)
        response_id = ""
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
    return response_id


async def _cancel_suspended(ctx: _Ctx, probe: Any) -> str:
    """The seed: a background run cancelled through POST /cancel while its executor is suspended."""
    async with asyncio.timeout(STEP):
        created = await ctx.client.responses.create(
            model="scripted", input="work slowly", background=True, store=True
        )
    await _wait_event(probe.started, "the executor to start")
    async with asyncio.timeout(STEP):
        await ctx.client.responses.cancel(created.id)
    await _wait_event(probe.interrupted, "the executor to be interrupted")
    return created.id


async def _cancel_after_text(ctx: _Ctx, probe: Any) -> str:
    """A background stream cancelled through POST /cancel once its text has reached the client."""
    response_id = ""
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(
            model="scripted", input="write, then wait", background=True, stream=True, store=True
        )
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_text.delta" and probe.streamed.is_set():
                break
        await ctx.client.responses.cancel(response_id)
        async for _event in stream:
            pass
    await _wait_event(probe.interrupted, "the executor to be interrupted")
    return response_id


async def _raises(ctx: _Ctx, probe: Any) -> str:
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(model="scripted", input="explode", stream=True, store=True)
        response_id = ""
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
    return response_id


async def _shutdown(ctx: _Ctx, probe: Any) -> str:
    """A streaming chat run cut short by graceful shutdown (the host's SIGTERM path)."""
    from eventguard._scenarios import trigger_shutdown

    response_id = ""
    async with asyncio.timeout(STEP):
        stream = await ctx.client.responses.create(
            model="scripted", input="tell me a long story", stream=True, store=True
        )
        async for event in stream:
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_text.delta" and probe.streamed.is_set():
                break
        await trigger_shutdown(ctx.server, "request")
        async for _event in stream:
            pass
    return response_id


@dataclass(frozen=True)
class _Scenario:
    title: str
    make_agent: Callable[[], tuple[Any, Any]]
    drive: Callable[[_Ctx, Any], Awaitable[str]]


#: The scenarios' titles, in order.
SCENARIO_TITLES = (
    "completes",
    "cancel while suspended (seed)",
    "cancel after text streamed",
    "executor raises",
    "chat cut short by shutdown",
)


def _scenarios() -> list[_Scenario]:
    from eventguard._scenarios import ScriptedChatClient, chat_agent, workflow_agent

    story = ("Once", " upon", " a", " time", " there", " was", " a", " long", " story")
    return [
        _Scenario(
            SCENARIO_TITLES[0],
            lambda: workflow_agent("complete", name="demo-completes", text=("Hello", ", world")),
            _completes,
        ),
        _Scenario(
            SCENARIO_TITLES[1],
            lambda: workflow_agent("stuck", name="demo-seed"),
            _cancel_suspended,
        ),
        _Scenario(
            SCENARIO_TITLES[2],
            lambda: workflow_agent("text_then_stuck", name="demo-cancel-text", text=("Partial", " answer")),
            _cancel_after_text,
        ),
        _Scenario(
            SCENARIO_TITLES[3],
            lambda: workflow_agent("raise", name="demo-raises", error_message="tool call failed"),
            _raises,
        ),
        _Scenario(
            SCENARIO_TITLES[4],
            lambda: chat_agent(ScriptedChatClient(story, hang_after=3), name="demo-chat"),
            _shutdown,
        ),
    ]


async def _run_one(scenario: _Scenario, sink: SqlSink) -> tuple[str, Observed, str | None, float]:
    started = time.monotonic()
    agent, probe = scenario.make_agent()
    server = _server_class()(agent, sink=sink, cancel_grace=CANCEL_GRACE, configure_observability=None)
    async with (
        _serving(server) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="dummy", timeout=STEP, max_retries=0) as client,
    ):
        ctx = _Ctx(server, client)
        response_id = await scenario.drive(ctx, probe)
        if not response_id:
            raise RuntimeError(f"scenario {scenario.title!r}: the server never named its response")
        await _wait(lambda: ctx.ended(response_id), f"eventguard to record {response_id}'s ending")
        public: str | None = None
        async with asyncio.timeout(STEP):
            while True:
                public = (await client.responses.retrieve(response_id)).status
                if public in ENDED:
                    break
                await asyncio.sleep(0.05)
    observed = server.observed.get(response_id, Observed())
    return response_id, observed, public, time.monotonic() - started


@contextmanager
def _quiet_host() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def _state_root() -> Iterator[None]:
    """The host keeps its own response store on disk: a temporary folder, removed afterwards."""
    keys = ("AGENTSERVER_STATE_ROOT", "AGENTSERVER_SHUTDOWN_GRACE_SECONDS")
    before = {key: os.environ.get(key) for key in keys}
    with tempfile.TemporaryDirectory(prefix="eventguard-demo-") as root:
        os.environ["AGENTSERVER_STATE_ROOT"] = root
        os.environ["AGENTSERVER_SHUTDOWN_GRACE_SECONDS"] = "1"
        try:
            yield
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


async def migrate(url: URL) -> None:
    engine = _db.create_engine(url)
    try:
        await _migrate.upgrade(engine)
    finally:
        await engine.dispose()


async def run_demo(url: str | URL | None = None, *, progress: Progress | None = None) -> DemoResult:
    """Run the five scenarios, store them at ``url`` (default: the sink's), and return the table."""
    say = progress or (lambda _message: None)
    began = time.monotonic()
    resolved = _db.resolve_url(url)
    say(f"database {_db.safe_url(resolved)}: migrating")
    await migrate(resolved)
    scenarios = _scenarios()
    runs: list[tuple[_Scenario, str, Observed, str | None, float]] = []
    with _quiet_host(), _state_root():
        sink = SqlSink(resolved, auto_migrate=False)
        await sink.start()
        try:
            for number, scenario in enumerate(scenarios, 1):
                say(f"[{number}/{len(scenarios)}] {scenario.title} ...")
                response_id, observed, public, seconds = await _run_one(scenario, sink)
                say(f"[{number}/{len(scenarios)}] {scenario.title}: {public} ({seconds:.1f}s)")
                runs.append((scenario, response_id, observed, public, seconds))
        finally:
            await sink.aclose()
    rows: list[Row] = []
    async with ResponseStore(resolved) as store:
        for number, (scenario, response_id, observed, public, seconds) in enumerate(runs, 1):
            record = await store.get(response_id)
            rows.append(Row(number, scenario.title, response_id, observed, record, public, seconds))
    return DemoResult(_db.safe_url(resolved), upstream_versions(), rows, time.monotonic() - began)


def lies(result: DemoResult) -> list[Row]:
    return [row for row in result.rows if row.lie]
