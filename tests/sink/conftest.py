"""Fixtures: a real SQLite file per test, a fresh PostgreSQL schema per test (dropped after), and
a response that overflows its sink's buffer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlRecorder, SqlSink

from .helpers import delta

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Target:
    kind: str
    url: str
    schema: str | None
    spool: Path


async def _pg_reachable() -> str | None:
    try:
        async with asyncio.timeout(5):
            conn = await asyncpg.connect(PG_DSN)
            await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"no PostgreSQL at {PG_DSN}: {type(exc).__name__}: {exc}"
    return None


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    why = await _pg_reachable()
    if why is not None:
        pytest.skip(why)
    schema = f"eg_test_{uuid.uuid4().hex[:12]}"
    async with asyncio.timeout(10):
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.close()
    try:
        yield schema
    finally:
        async with asyncio.timeout(30):
            conn = await asyncpg.connect(PG_DSN)
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            await conn.close()


@pytest.fixture
def sqlite_target(tmp_path: Path) -> Target:
    return Target("sqlite", f"sqlite+aiosqlite:///{tmp_path / 'eg.db'}", None, tmp_path / "spool.jsonl")


@pytest.fixture
def pg_target(pg_schema: str, tmp_path: Path) -> Target:
    return Target("postgres", PG_URL, pg_schema, tmp_path / "spool.jsonl")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest) -> Target:
    name = "sqlite_target" if request.param == "sqlite" else "pg_target"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Overflow:
    """A response in progress whose recorder was handed more events than its sink buffers."""

    lifecycle: Lifecycle
    recorder: SqlRecorder

    async def complete(self) -> None:
        """End the response ``completed`` and close its recorder (its final flush)."""
        self.lifecycle.transition(State.COMPLETED)
        self.recorder.changed()
        await self.recorder.close()


#: The ``overflow`` fixture's type: ``(sink, response_id, n) -> Overflow``.
Overflowing = Callable[[SqlSink, str, int], Overflow]


@pytest.fixture
def overflow() -> Overflowing:
    """``overflow(sink, response_id, n)``: a response in progress, then ``n`` deltas with no await
    in between, so the writer cannot keep up and the sink spills to its spool (give the sink a
    ``max_buffered`` below ``n``)."""

    def fill(sink: SqlSink, response_id: str, n: int) -> Overflow:
        lc = Lifecycle(info=ResponseInfo(response_id=response_id))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS)
        rec.changed()
        for i in range(n):  # no await in between: the writer cannot keep up
            rec.event(i, "response.output_text.delta", delta(i))
        return Overflow(lc, rec)

    return fill
