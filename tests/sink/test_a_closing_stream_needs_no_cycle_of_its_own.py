"""A recorder that closes once its last work is taken needs no writer cycle of its own (issue 13).

A guard closes its recorder right after the terminal, while the writer's cycle is writing the
stream's last batch: that cycle finishes the closing recorder once the batch is stored or kept. A
second cycle, woken by the close to find nothing, ran for every response before (after that close
had returned; a close with nothing in flight waited for it). Closing must still wait for the batch
in flight, and a recorder whose work is all stored closes at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from eventguard.sink import SqlSink
from eventguard.sink.recorder import SqlRecorder

from .conftest import Target
from .helpers import (
    database_busy,
    delta,
    run_guarded,
    script,
    stored_events,
    stored_in_progress,
    until_in_flight,
)

_EVENTS = 40


def _count_cycles(sink: SqlSink) -> Callable[[], int]:
    """Counts the writer's cycles from now on; returns how many ran."""
    writer = sink.writer
    cycle = writer.cycle
    ran = 0

    async def counted(recorders: Sequence[SqlRecorder]) -> None:
        nonlocal ran
        ran += 1
        await cycle(recorders)

    writer.cycle = counted  # type: ignore[method-assign]
    return lambda: ran


def _sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def test_a_short_guarded_response_takes_one_writer_cycle_its_close_included(target: Target) -> None:
    sink = _sink(target)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            await run_guarded(sink, script("resp_warm", n_deltas=3))  # the schema, the connection
            cycles = _count_cycles(sink)
            # Hostile content on the way: the count of cycles is the subject, the content must land.
            events_in = script("resp_one_cycle", n_deltas=5)
            events_in[3] = {**events_in[3], "delta": "nul\x00 lone\udcff esc\x1b[31m " + "x" * 1_000_000}
            seen = await run_guarded(sink, events_in)
            assert cycles() == 1
            assert await stored_events(sink, "resp_one_cycle") == len(seen) == len(events_in)
            assert sink.stats.batches_spooled == 0
        finally:
            await sink.aclose()


async def test_a_close_while_the_last_batch_is_written_waits_for_it_without_another_cycle(
    target: Target,
) -> None:
    sink = _sink(target, flush_interval=0.01)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            _lc, rec = await stored_in_progress(sink, "resp_close_inflight")
            async with database_busy(target):
                for i in range(_EVENTS):
                    rec.event(i, "response.output_text.delta", delta(i))
                await until_in_flight(rec)
                cycles = _count_cycles(sink)
                closing = asyncio.ensure_future(rec.close())
                await asyncio.wait({closing}, timeout=0.3)
                assert not closing.done(), "close() returned while its last batch was still being written"
            await closing
            # Read at once: a closed recorder's work is stored.
            assert await stored_events(sink, "resp_close_inflight") == _EVENTS
            assert cycles() == 0, "the close ran a writer cycle of its own"
            assert sink.stats.batches_spooled == 0
        finally:
            await sink.aclose()


async def test_a_recorder_whose_work_is_all_stored_closes_without_a_cycle(target: Target) -> None:
    sink = _sink(target)
    async with asyncio.timeout(60):
        await sink.start()
        try:
            _lc, rec = await stored_in_progress(sink, "resp_close_stored")
            for i in range(_EVENTS):
                rec.event(i, "response.output_text.delta", delta(i))
            await sink.flush()
            cycles = _count_cycles(sink)
            await rec.close()
            assert cycles() == 0
            assert await stored_events(sink, "resp_close_stored") == _EVENTS
        finally:
            await sink.aclose()
