"""A sink's ``start()`` and ``aclose()`` called while a close is under way take turns: a start
reopens the sink once the close has ended, a second close returns when the first has closed, and
a new stream's recorder is refused while it closes. Begun halfway through, the close went on
to close the sink under a writer task the start (or the recorder) had just made, which ran on,
orphaned, with nothing to write to. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from eventguard.lifecycle import Lifecycle, ResponseInfo
from eventguard.sink import SqlSink

from .conftest import Target
from .helpers import run_guarded, script, stored_events


def writer_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("eventguard-writer") and not t.done()]


async def closing(sink: SqlSink) -> asyncio.Task[None]:
    """``sink.aclose()`` in a task, run until it waits for the first time (mid-close)."""
    task = asyncio.create_task(sink.aclose())
    await asyncio.sleep(0)
    assert sink.writer._closing is not None, "the close ended before the test could come in"
    return task


async def test_a_start_during_a_close_reopens_the_sink_once_the_close_has_ended(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        close = await closing(sink)
        await sink.start()
        await close
        assert not sink.writer.closed
        assert len(writer_tasks()) == 1
        await run_guarded(sink, script("resp_reopened", n_deltas=3))
        assert await stored_events(sink, "resp_reopened") == 7
        await sink.aclose()
        assert writer_tasks() == []


async def test_a_second_close_returns_once_the_first_has_closed(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        close = await closing(sink)
        await sink.aclose()
        assert close.done()
        assert sink.writer.closed
        await close
        assert writer_tasks() == []


async def test_a_recorder_asked_for_during_a_close_is_refused(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.start()
        close = await closing(sink)
        with pytest.raises(RuntimeError, match="is closing"):
            sink.recorder(Lifecycle(info=ResponseInfo(response_id="resp_late")))
        await close
        assert writer_tasks() == []
