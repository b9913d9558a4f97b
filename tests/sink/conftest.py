"""Fixtures: a real SQLite file per test, a fresh PostgreSQL schema per test (dropped after), and
a response that overflows its sink's buffer."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlRecorder, SqlSink
from tests._postgres import PG_URL, fresh_schema

from .helpers import delta


@dataclass(frozen=True)
class Target:
    kind: str
    url: str
    schema: str | None
    spool: Path


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    async with fresh_schema("eg_test") as schema:
        yield schema


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
