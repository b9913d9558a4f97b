"""Fixtures: a tmp SQLite database per test (never the user's ./eventguard.db), filled through the guard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eventguard import guard
from eventguard.cli import app
from eventguard.sink import SqlSink

STEP = 30.0


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run every test in its own folder, without the user's EVENTGUARD_DATABASE_URL."""
    monkeypatch.delenv("EVENTGUARD_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


class Cli:
    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, *args: str, url: bool = True) -> Any:
        argv = [*args, "--database-url", self.url] if url else list(args)
        return self.runner.invoke(app, argv, catch_exceptions=False)


@pytest.fixture
def cli(db_url: str) -> Cli:
    return Cli(db_url)


def event(rid: str, etype: str, status: str | None = None) -> dict[str, Any]:
    if etype.startswith("response.") and etype.count(".") == 1:
        return {"type": etype, "response": {"id": rid, "status": status or "in_progress"}}
    return {"type": etype, "delta": "x", "output_index": 0}


def script(rid: str, ending: str) -> list[dict[str, Any]]:
    head = [event(rid, "response.created"), event(rid, "response.in_progress")]
    text = [event(rid, "response.output_text.delta"), event(rid, "response.output_text.delta")]
    if ending == "completed":
        return [*head, *text, event(rid, "response.completed", "completed")]
    if ending == "failed":
        return [*head, event(rid, "response.failed", "failed")]
    if ending == "cancel":  # the upstream lie: completed after a client cancel
        return [*head, *text, event(rid, "response.completed", "completed")]
    raise ValueError(ending)


class Ctx:
    """Stands in for the host's ResponseContext: the cause flags."""

    def __init__(self, *, client_cancelled: bool = False) -> None:
        self.client_cancelled = client_cancelled
        self.shutdown = asyncio.Event()


async def record(url: str, runs: list[tuple[str, str]]) -> None:
    """Guard scripted streams into the database: (response id, "completed" | "failed" | "cancel")."""
    async with asyncio.timeout(STEP):
        sink = SqlSink(url, spool_path=Path("spool.jsonl"))
        await sink.start()  # creates the schema in an empty database
        try:
            for rid, ending in runs:
                signal = asyncio.Event()
                ctx = Ctx(client_cancelled=ending == "cancel")
                if ending == "cancel":
                    signal.set()

                async def stream(rid: str = rid, ending: str = ending) -> AsyncIterator[dict[str, Any]]:
                    for e in script(rid, ending):
                        yield e

                async with guard(stream(), signal, context=ctx, sink=sink, cancel_grace=None) as g:
                    async for _ in g:
                        pass
        finally:
            await sink.aclose()


RUNS = [("resp_done", "completed"), ("resp_boom", "failed"), ("resp_cancel", "cancel")]


@pytest.fixture
def filled(db_url: str) -> str:
    """A migrated database with one completed, one failed and one cancelled response."""
    asyncio.run(record(db_url, RUNS))
    return db_url
