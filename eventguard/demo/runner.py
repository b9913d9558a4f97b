"""Running the demo: a guarded, tapped ``ResponsesHostServer`` per scenario, and the table of results.

Each scenario starts a real ``ResponsesHostServer`` (guarded with :mod:`eventguard.foundry`, recording
into an :class:`~eventguard.sink.SqlSink`) under uvicorn on ``127.0.0.1``, drives it with the official
``openai`` client, and then sets side by side, per response:

- what the *unguarded* upstream handler yielded as its terminal (tapped inside the server, before the
  guard), with the cause flags at that moment;
- what eventguard recorded (read back from the database);
- what the public API reports (``client.responses.retrieve``).

The scenarios are in :mod:`eventguard.demo.scenarios`; the tap and the loopback server are
:mod:`eventguard.testing`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import openai
from sqlalchemy.engine import URL

from eventguard.records import ResponseRecord
from eventguard.sink import SqlSink
from eventguard.sql import engine as _db
from eventguard.sql import migrate as _migrate
from eventguard.store import ResponseStore
from eventguard.testing.server import loopback_server, wait_until
from eventguard.testing.taps import Seen, tap

from .scenarios import STEP, Ctx, Scenario, scenarios

__all__ = ["DemoResult", "Observed", "Row", "lies", "run_demo", "upstream_versions"]

#: How long the guard waits for a handler the host stopped iterating after a cancel.
CANCEL_GRACE = 1.0
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

    @classmethod
    def from_seen(cls, seen: list[Seen]) -> Observed:
        """From the tap's record: every type, and the first terminal with its S, C and D flags."""
        first = next((s for s in seen if isinstance(s.event, dict) and s.ending is not None), None)
        return cls(
            types=[s.type for s in seen],
            terminal=None if first is None else first.ending,
            flags="" if first is None else "".join(f for f in first.flags if f in "SCD"),
        )

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


def _server_class() -> type[Any]:
    """``GuardedResponses`` over a tap over ``ResponsesHostServer``: the tap sees the raw handler."""
    from agent_framework_foundry_hosting import ResponsesHostServer

    from eventguard.foundry import GuardedResponses

    class Tap(ResponsesHostServer):  # type: ignore[misc,unused-ignore]
        """Records what the unguarded upstream handler yields, before the guard sees it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.seen: dict[str, list[Seen]] = {}

        async def _handle_response(self, request: Any, context: Any, cancellation_signal: Any) -> Any:
            seen = self.seen.setdefault(str(context.response_id), [])
            upstream: Any = super()._handle_response(request, context, cancellation_signal)
            async with aclosing(tap(upstream, seen, cancellation_signal, context)) as inner:
                async for event in inner:
                    yield event

    class DemoServer(GuardedResponses, Tap):  # type: ignore[misc,unused-ignore]
        """The guarded server of the demo (MRO: guard -> tap -> ResponsesHostServer)."""

    return DemoServer


async def _run_one(scenario: Scenario, sink: SqlSink) -> tuple[str, Observed, str | None, float]:
    started = time.monotonic()
    agent, probe = scenario.make_agent()
    server = _server_class()(agent, sink=sink, cancel_grace=CANCEL_GRACE, configure_observability=None)
    async with (
        loopback_server(server, within=STEP) as base_url,
        openai.AsyncOpenAI(base_url=base_url, api_key="dummy", timeout=STEP, max_retries=0) as client,
    ):
        ctx = Ctx(server, client)
        response_id = await scenario.drive(ctx, probe)
        if not response_id:
            raise RuntimeError(f"scenario {scenario.title!r}: the server never named its response")
        await wait_until(lambda: ctx.ended(response_id), f"eventguard to record {response_id}'s ending", STEP)
        public: str | None = None
        async with asyncio.timeout(STEP):
            while True:
                public = (await client.responses.retrieve(response_id)).status
                if public in ENDED:
                    break
                await asyncio.sleep(0.05)
    observed = Observed.from_seen(server.seen.get(response_id, []))
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


async def migrate(url: URL, schema: str | None = None) -> None:
    engine = _db.create_engine(url, schema=schema)
    try:
        await _migrate.upgrade(engine)
    finally:
        await engine.dispose()


async def run_demo(
    url: str | URL | None = None, *, schema: str | None = None, progress: Progress | None = None
) -> DemoResult:
    """Run the five scenarios, store them at ``url`` (default: the sink's), and return the table.

    ``schema``: PostgreSQL only, the schema of eventguard's tables (as ``SqlSink(schema=...)``);
    it must exist. ``progress`` is told each step in words.
    """
    say = progress or (lambda _message: None)
    began = time.monotonic()
    resolved = _db.resolve_url(url)
    say(f"database {_db.safe_url(resolved)}: migrating")
    await migrate(resolved, schema)
    chosen = scenarios()
    runs: list[tuple[Scenario, str, Observed, str | None, float]] = []
    with _quiet_host(), _state_root():
        sink = SqlSink(resolved, schema=schema, auto_migrate=False)
        await sink.start()
        try:
            for number, scenario in enumerate(chosen, 1):
                say(f"[{number}/{len(chosen)}] {scenario.title} ...")
                response_id, observed, public, seconds = await _run_one(scenario, sink)
                say(f"[{number}/{len(chosen)}] {scenario.title}: {public} ({seconds:.1f}s)")
                runs.append((scenario, response_id, observed, public, seconds))
        finally:
            await sink.aclose()
    rows: list[Row] = []
    async with ResponseStore(resolved, schema=schema) as store:
        for number, (scenario, response_id, observed, public, seconds) in enumerate(runs, 1):
            record = await store.get(response_id)
            rows.append(Row(number, scenario.title, response_id, observed, record, public, seconds))
    return DemoResult(_db.safe_url(resolved), upstream_versions(), rows, time.monotonic() - began)


def lies(result: DemoResult) -> list[Row]:
    return [row for row in result.rows if row.lie]
