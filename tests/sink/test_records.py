"""What gets stored: filters, odd events, odd ids, two writers, recovered attempts, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

from eventguard import guard
from eventguard.lifecycle import Cause, Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink, quarantine
from eventguard.sql.tables import TERMINAL, transitions
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import aiter_of, created, delta, in_progress, run_guarded, script, terminal


@pytest.fixture
async def store(target: Target) -> AsyncIterator[ResponseStore]:
    st = ResponseStore(target.url, schema=target.schema)
    try:
        yield st
    finally:
        await st.aclose()


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        ("all", None),
        (
            "finished",
            {"response.created", "response.in_progress", "response.output_item.done", "response.completed"},
        ),
        ("lifecycle", {"response.created", "response.in_progress", "response.completed"}),
    ],
)
async def test_the_event_filter_stores_only_the_events_its_mode_keeps(
    target: Target, store: ResponseStore, mode: str, kept: set[str] | None
) -> None:
    evs = script("resp_f", n_deltas=6)
    async with asyncio.timeout(30):
        sink = make_sink(target, events=mode)
        await run_guarded(sink, evs)
        await sink.aclose()
        hist = await store.history("resp_f")
    assert hist is not None
    stored = [e.type for e in hist.attempts[0].events]
    expected = [e["type"] for e in evs if kept is None or e["type"] in kept]
    assert stored == expected
    assert hist.response.status == "completed"
    assert hist.response.event_count == len(evs)  # counted even when not stored
    assert len(hist.attempts[0].transitions) >= 2  # always stored


async def test_predicate_refines_the_mode(target: Target, store: ResponseStore) -> None:
    evs = script("resp_p", n_deltas=6)
    async with asyncio.timeout(30):
        sink = make_sink(
            target, predicate=lambda t, e: t != "response.output_text.delta" or e["delta"] == "d3"
        )
        await run_guarded(sink, evs)
        await sink.aclose()
        hist = await store.history("resp_p")
    assert hist is not None
    assert [
        e.payload.get("delta") for e in hist.attempts[0].events if e.type == "response.output_text.delta"
    ] == ["d3"]


def test_a_sinks_filter_cannot_change_under_its_streams(target: Target) -> None:
    # A recorder reads the filter once, when its stream starts (a filter that keeps everything
    # is then never called per event): a filter changed later would apply to some streams only.
    sink = make_sink(target, events="finished")
    with pytest.raises(AttributeError):
        sink.filter.predicate = lambda t, e: False  # type: ignore[misc]
    with pytest.raises(AttributeError):
        sink.filter.mode = "all"  # type: ignore[misc]
    assert sink.filter.mode == "finished" and not sink.filter.keeps_all
    assert make_sink(target).filter.keeps_all


class SdkEvent(BaseModel):
    type: str
    delta: str
    output_index: int = 0


class Checkpoint:
    __slots__ = ("response",)

    def __init__(self) -> None:
        self.response = {"id": "resp_odd"}


class Weird:
    def __repr__(self) -> str:
        return "<Weird>"


async def test_odd_events_are_stored_with_anomalies(target: Target, store: ResponseStore) -> None:
    rid = "resp_odd"
    evs: list[Any] = [
        created(rid),
        in_progress(rid),
        SdkEvent(type="response.output_text.delta", delta="typed"),
        Checkpoint(),
        {"type": "response.output_text.delta", "delta": Weird(), "output_index": 0},
        {"type": "response.output_text.delta", "delta": "x" * 5000, "output_index": 0},
        {"type": "response.output_text.delta", "delta": "big int", "n": 2**80},
        terminal(rid),
    ]
    async with asyncio.timeout(30):
        sink = make_sink(target, max_payload_bytes=2000)
        seen = await run_guarded(sink, evs)
        await sink.aclose()
        hist = await store.history(rid)
    assert seen == evs
    assert hist is not None
    by_seq = {e.seq: e for e in hist.attempts[0].events}
    assert len(by_seq) == len(evs)
    assert by_seq[2].payload == {"type": "response.output_text.delta", "delta": "typed", "output_index": 0}
    assert by_seq[3].payload["_eventguard"]["python_type"].endswith("Checkpoint")
    assert by_seq[4].payload["delta"] == "<Weird>"
    assert by_seq[5].payload["_eventguard"]["truncated"] is True
    assert "_eventguard" in by_seq[6].payload
    kinds = {(a.kind, a.event_index) for a in hist.attempts[0].anomalies if a.source == "sink"}
    assert ("not_serialisable", 3) in kinds
    assert ("not_serialisable", 4) in kinds
    assert ("payload_truncated", 5) in kinds
    assert ("not_serialisable", 6) in kinds
    assert hist.response.status == "completed"


ODD_IDS = [
    "r'; DROP TABLE eventguard_events; --",
    'r"quoted"\\back',
    "r%_*?[]{}",
    "résumé-日本-🙂",
    "r\nnewline\ttab",
]


@pytest.mark.parametrize("rid", ODD_IDS)
async def test_odd_response_ids_through_bound_parameters(
    target: Target, store: ResponseStore, rid: str
) -> None:
    async with asyncio.timeout(30):
        sink = make_sink(target)
        await run_guarded(sink, script(rid, n_deltas=2))
        await sink.aclose()
        rec = await store.get(rid)
        hist = await store.history(rid)
        page = await store.terminal_states(status="completed")
        anomalies = await store.anomalies(response_id=rid, kind=rid)
        assert await store.get(rid + "x") is None
    assert rec is not None
    assert rec.response_id == rid
    assert hist is not None
    assert len(hist.attempts[0].events) == 6
    assert [r.response_id for r in page.items] == [rid]
    assert anomalies.items == []


async def test_a_second_sink_streaming_the_same_id_cannot_overwrite_a_terminal(
    target: Target, store: ResponseStore
) -> None:
    # The second writer streams the same response id and attempt: a duplicate stream. None of it
    # reaches the first one's history (its row, events, transitions, anomalies); all of it is in
    # the quarantine, and one duplicate_stream anomaly says so on the response.
    rid = "resp_twice_ended"
    async with asyncio.timeout(30):
        a, b = make_sink(target), make_sink(target)
        await run_guarded(a, script(rid, n_deltas=2, final="completed"))
        await a.aclose()
        await run_guarded(b, script(rid, n_deltas=2, final="failed"))
        await b.aclose()
        rec = await store.get(rid)
        hist = await store.history(rid)
        refused = await store.anomalies(response_id=rid, kind="sink_refused")
        duplicate = await store.anomalies(response_id=rid, kind="duplicate_stream")
        async with b.engine.connect() as conn:
            n_terminal = (
                await conn.execute(
                    select(func.count()).where(
                        transitions.c.response_id == rid, transitions.c.to_state.in_(TERMINAL)
                    )
                )
            ).scalar_one()
            kept = await quarantine.read(conn, response_id=rid)
        await b.engine.dispose()
    assert rec is not None
    assert rec.status == "completed"
    assert n_terminal == 1
    assert hist is not None
    assert [e.type for e in hist.attempts[0].events][-1] == "response.completed"
    assert b.stats.refusals == []
    assert refused.items == []
    assert len(duplicate.items) == 1
    assert {k.origin for k in kept} == {"duplicate"}
    assert sum(k.event_count() for k in kept) == 6  # every event of the second stream


async def test_recovered_attempt_keeps_the_first(target: Target, store: ResponseStore) -> None:
    rid = "resp_recovered"
    info = ResponseInfo(response_id=rid, background=True)
    async with asyncio.timeout(30):
        sink = make_sink(target)
        await sink.start()
        first = Lifecycle(info=info)
        rec1 = sink.recorder(first)
        first.transition(State.IN_PROGRESS)
        for i in range(4):
            rec1.event(i, "response.output_text.delta", delta(i))
        first.transition(State.INTERRUPTED, cause=Cause.SHUTDOWN, reason="process exit")
        rec1.changed()
        await rec1.close()

        second = Lifecycle.for_recovery(info.model_copy(update={"is_recovery": True}))
        rec2 = sink.recorder(second)
        second.transition(State.IN_PROGRESS, cause=Cause.RECOVERY)
        for i in range(3):
            rec2.event(i, "response.output_text.delta", delta(100 + i))
        second.transition(State.COMPLETED, cause=Cause.NORMAL)
        rec2.changed()
        await rec2.close()
        await sink.aclose()
        hist = await store.history(rid)
    assert hist is not None
    assert [a.attempt for a in hist.attempts] == [1, 2]
    one, two = hist.attempts
    assert [e.payload["delta"] for e in one.events] == ["d0", "d1", "d2", "d3"]
    assert [e.payload["delta"] for e in two.events] == ["d100", "d101", "d102"]
    assert one.transitions[-1].to_state == "interrupted"
    assert two.transitions[-1].to_state == "completed"
    assert hist.response.status == "completed"
    assert hist.response.attempt == 2
    assert hist.response.is_recovery


async def test_cancelled_task_still_records_its_ending(target: Target, store: ResponseStore) -> None:
    rid = "resp_cancel"
    signal = asyncio.Event()
    reached = asyncio.Event()

    async def slow() -> AsyncIterator[Any]:
        yield created(rid)
        yield in_progress(rid)
        for i in range(1000):
            if i == 3:
                reached.set()
            await asyncio.sleep(0.01)
            yield delta(i)

    sink = make_sink(target)

    async def run() -> None:
        g = guard(slow(), signal, sink=sink)
        async with g:
            async for _ in g:
                pass

    async with asyncio.timeout(30):
        await sink.start()
        task = asyncio.create_task(run())
        await reached.wait()
        signal.set()  # a client cancel, as the host does it, then the task goes
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sink.aclose()
        rec = await store.get(rid)
    assert rec is not None
    assert rec.status in ("cancelled", "interrupted", "failed")
    assert rec.finished_at is not None


async def test_no_response_id_still_keeps_a_row(target: Target, store: ResponseStore) -> None:
    evs = [delta(0), delta(1)]
    async with asyncio.timeout(30):
        sink = make_sink(target)
        g = guard(aiter_of(evs), asyncio.Event(), sink=sink)
        async with g:
            async for _ in g:
                pass
        await sink.aclose()
        page = await store.terminal_states()
    assert len(page.items) == 1
    assert page.items[0].response_id.startswith("eventguard-unidentified-")
