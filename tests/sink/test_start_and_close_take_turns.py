"""A sink's ``start()`` and ``aclose()`` called while a close is under way take turns: a start
reopens the sink once the close has ended, a second close returns when the first has closed, and
a new stream's recorder is refused while it closes. Begun halfway through, the close went on
to close the sink under a writer task the start (or the recorder) had just made, which ran on,
orphaned, with nothing to write to. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from eventguard.lifecycle import Lifecycle, ResponseInfo
from eventguard.sink import SqlSink

from .conftest import Target
from .helpers import run_guarded, script, stored_events


def writer_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("eventguard-writer") and not t.done()]


@contextlib.asynccontextmanager
async def closing(target: Target) -> AsyncIterator[tuple[SqlSink, asyncio.Task[None]]]:
    """A started sink and its ``aclose()`` in a task, run until it waits for the first time
    (mid-close); at the end, the close has ended and no writer task is left."""
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        task = asyncio.create_task(sink.aclose())
        await asyncio.sleep(0)
        assert sink.writer._closing is not None, "the close ended before the test could come in"
        yield sink, task
        await task
        await sink.aclose()
        assert writer_tasks() == []


async def test_a_start_during_a_close_reopens_the_sink_once_the_close_has_ended(target: Target) -> None:
    async with closing(target) as (sink, close):
        await sink.start()
        assert close.done() and not sink.writer.closed
        assert len(writer_tasks()) == 1
        await run_guarded(sink, script("resp_reopened", n_deltas=3))
        assert await stored_events(sink, "resp_reopened") == 7


async def test_a_second_close_returns_once_the_first_has_closed(target: Target) -> None:
    async with closing(target) as (sink, close):
        await sink.aclose()
        assert close.done() and sink.writer.closed


async def test_a_recorder_asked_for_during_a_close_is_refused(target: Target) -> None:
    async with closing(target) as (sink, _close):
        with pytest.raises(RuntimeError, match="is closing"):
            sink.recorder(Lifecycle(info=ResponseInfo(response_id="resp_late")))


async def test_a_close_during_a_start_stands_and_leaves_no_writer(target: Target) -> None:
    """The other order: the close came while the start was preparing the schema. The start made
    its writer task after the close had stopped this loop's, and the close ended the sink under it."""
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        starting = asyncio.create_task(sink.start())
        while not sink.writer.loops.here().lock.locked():  # noqa: ASYNC110  # the start's own step
            await asyncio.sleep(0)
        await sink.aclose()
        await starting
        assert sink.writer.closed
        assert writer_tasks() == []
