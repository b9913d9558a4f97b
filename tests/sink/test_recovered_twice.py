"""A response the host recovers more than once. ``Lifecycle.for_recovery`` always says attempt 2: a
new stream that finds its attempt ended ``interrupted`` by another stream takes the next attempt
number, so each run keeps its own history and the last one's ending is recorded. A second stream
of an attempt that is not interrupted is still a duplicate. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import select

from eventguard import ResponseStore
from eventguard.lifecycle import Cause, Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink, quarantine
from eventguard.sql.tables import responses

from .conftest import Target

RID = "resp_recovered_twice"
INFO = ResponseInfo(response_id=RID, background=True)


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


def lifecycle(recovered: bool) -> Lifecycle:
    if recovered:
        return Lifecycle.for_recovery(INFO.model_copy(update={"is_recovery": True}))
    return Lifecycle(info=INFO)


async def run(sink: SqlSink, mark: str, end: State, *, recovered: bool = True, deltas: int = 2) -> None:
    """One run of the response: ``deltas`` deltas marked ``mark``, then ``end``."""
    lc = lifecycle(recovered)
    rec = sink.recorder(lc)
    lc.transition(State.IN_PROGRESS, cause=Cause.RECOVERY if recovered else None)
    rec.changed()
    for i in range(deltas):
        rec.event(
            i, "response.output_text.delta", {"type": "response.output_text.delta", "delta": f"{mark}{i}"}
        )
        await asyncio.sleep(0)
    cause = Cause.SHUTDOWN if end is State.INTERRUPTED else None
    lc.transition(end, cause=cause, reason=mark)
    rec.changed()
    await rec.close()


async def per_attempt(target: Target) -> tuple[Any, dict[int, list[str]], dict[int, list[str]]]:
    async with ResponseStore(target.url, schema=target.schema) as store:
        hist = await store.history(RID)
    assert hist is not None
    deltas = {a.attempt: [e.payload["delta"] for e in a.events] for a in hist.attempts}
    states = {a.attempt: [t.to_state for t in a.transitions] for a in hist.attempts}
    return hist.response, deltas, states


async def test_a_response_recovered_twice_records_each_run_and_the_last_ending(target: Target) -> None:
    async with asyncio.timeout(60):
        for mark, end, recovered in (
            ("one", State.INTERRUPTED, False),
            ("two", State.INTERRUPTED, True),
            ("three", State.COMPLETED, True),
        ):
            sink = make_sink(target)  # a new process each time
            await sink.start()
            await run(sink, mark, end, recovered=recovered)
            await sink.aclose()
            assert sink.stats.duplicates == 0 and sink.stats.quarantined == 0, mark
        row, deltas, states = await per_attempt(target)
        sink = make_sink(target)
        kept = await quarantine.read(sink.engine)
        await sink.engine.dispose()
    assert (row.status, row.attempt) == ("completed", 3)
    assert deltas == {1: ["one0", "one1"], 2: ["two0", "two1"], 3: ["three0", "three1"]}
    assert states == {
        1: ["in_progress", "interrupted"],
        2: ["in_progress", "interrupted"],
        3: ["in_progress", "completed"],
    }
    assert kept == []


async def test_a_response_recovered_twice_by_one_sink_records_each_run(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await run(sink, "one", State.INTERRUPTED, recovered=False)
        await run(sink, "two", State.INTERRUPTED)
        await run(sink, "three", State.INTERRUPTED)
        await run(sink, "four", State.FAILED)
        await sink.aclose()
        row, deltas, states = await per_attempt(target)
    assert (row.status, row.attempt) == ("failed", 4)
    assert [d[0][:-1] for _, d in sorted(deltas.items())] == ["one", "two", "three", "four"]
    assert states[4] == ["in_progress", "failed"]
    assert sink.stats.duplicates == 0 and sink.stats.refusals == []


async def test_a_second_recovery_spooled_then_replayed_takes_the_next_attempt(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await run(sink, "one", State.INTERRUPTED, recovered=False)
        await run(sink, "two", State.INTERRUPTED)
        await sink.aclose()
        # flush_interval=0: each lifecycle change of the third run is a batch of its own (two or
        # more spooled batches of one stream, each renumbered on replay), not one for the run.
        sink = make_sink(target, flush_interval=0)
        await sink.start()
        # In an outage's back-off: the third run is spooled.
        sink.writer.outage.retry_at = time.monotonic() + 60
        sink.writer.outage.reason = "simulated"
        await run(sink, "three", State.COMPLETED, deltas=4)
        assert sink.stats.batches_spooled >= 2
        sink.writer.outage.retry_at = 0.0
        await sink.replay_spool()
        await sink.aclose()
        row, deltas, states = await per_attempt(target)
    assert (row.status, row.attempt) == ("completed", 3)
    assert deltas[2] == ["two0", "two1"]
    assert deltas[3] == ["three0", "three1", "three2", "three3"]
    assert states[3] == ["in_progress", "completed"]
    assert sink.stats.duplicates == 0


async def test_two_streams_recovering_the_same_interrupted_attempt_get_one_owner(target: Target) -> None:
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await run(sink, "one", State.INTERRUPTED, recovered=False)
        await run(sink, "two", State.INTERRUPTED)
        await sink.aclose()
        b, c = make_sink(target), make_sink(target)  # two replicas recover it at once
        await b.start()
        await c.start()
        await asyncio.gather(run(b, "B", State.COMPLETED, deltas=6), run(c, "C", State.FAILED, deltas=6))
        await b.aclose()
        await c.aclose()
        row, deltas, states = await per_attempt(target)
        kept = await quarantine.read(c.engine, origin="duplicate")
        async with c.engine.connect() as conn:
            stream = (
                await conn.execute(select(responses.c.stream_id).where(responses.c.response_id == RID))
            ).scalar()
        await c.engine.dispose()
    assert deltas[2] == ["two0", "two1"]  # the interrupted run's history is its own
    owner = deltas[3][0][0]
    assert deltas[3] == [f"{owner}{i}" for i in range(6)] and set(deltas) == {1, 2, 3}
    assert row.status == ("completed" if owner == "B" else "failed")
    assert states[3] == ["in_progress", row.status]
    # The other one is refused as a whole: every one of its events is in the quarantine.
    other = sorted(e["seq"] for k in kept for e in k.content()["events"])
    assert other == list(range(6))
    assert all(k.stream_id != stream for k in kept)
    assert b.stats.duplicates + c.stats.duplicates == len(kept) >= 1
