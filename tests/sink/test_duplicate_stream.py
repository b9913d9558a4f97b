"""One response id, two streams (a retry, a second replica): the first stream whose row write lands
owns the attempt; the other is refused as a whole, kept in the quarantine (origin ``duplicate``),
with one ``duplicate_stream`` anomaly on the owner. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select

from eventguard.lifecycle import Cause, Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink, quarantine
from eventguard.sink.recorder import SqlRecorder
from eventguard.sql.tables import anomalies, events, responses, transitions

from .conftest import Target
from .helpers import created, in_progress, run_guarded, stored_in_progress, terminal


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


def marked(rid: str, mark: str, n: int, final: str) -> list[dict[str, Any]]:
    """A stream whose deltas say which stream they came from."""
    deltas = [{"type": "response.output_text.delta", "delta": f"{mark}{i}"} for i in range(n)]
    return [created(rid), in_progress(rid), *deltas, terminal(rid, final)]


async def history(sink: SqlSink, rid: str) -> dict[str, Any]:
    async with sink.engine.connect() as conn:
        evs = (
            await conn.execute(
                select(events.c.seq, events.c.payload)
                .where(events.c.response_id == rid)
                .order_by(events.c.seq)
            )
        ).all()
        trs = (
            await conn.execute(select(transitions.c.to_state).where(transitions.c.response_id == rid))
        ).all()
        ans = (
            await conn.execute(
                select(anomalies.c.kind, anomalies.c.source).where(anomalies.c.response_id == rid)
            )
        ).all()
        row = (await conn.execute(select(responses).where(responses.c.response_id == rid))).one()
    return {
        "deltas": [e.payload.get("delta") for e in evs if e.payload.get("delta") is not None],
        "seqs": [e.seq for e in evs],
        "last_type": evs[-1].payload["type"] if evs else None,
        "to_states": [t.to_state for t in trs],
        "anomalies": [(a.kind, a.source) for a in ans],
        "status": row.status,
        "stream_id": row.stream_id,
    }


async def test_a_second_stream_with_the_same_id_is_refused_as_a_whole(target: Target) -> None:
    rid = "resp_dup"
    first, second = marked(rid, "A", 3, "completed"), marked(rid, "B", 8, "failed")
    async with asyncio.timeout(60):
        a, b = make_sink(target), make_sink(target)  # two replicas
        await run_guarded(a, first)
        await a.aclose()
        await run_guarded(b, second)
        await b.aclose()
        found = await history(b, rid)
        kept = await quarantine.read(b.engine, response_id=rid)
        await b.engine.dispose()
    # The holder's history is its own: no B event, not even the seqs A never used (after its terminal).
    assert found["deltas"] == ["A0", "A1", "A2"]
    assert found["seqs"] == list(range(len(first)))
    assert found["last_type"] == "response.completed"
    assert found["status"] == "completed"
    assert found["to_states"].count("completed") == 1 and "failed" not in found["to_states"]
    assert found["anomalies"] == [("duplicate_stream", "sink")]
    # Every one of B's events is in the quarantine, with its payload.
    assert {k.origin for k in kept} == {"duplicate"}
    assert len({k.stream_id for k in kept}) == 1 and kept[0].stream_id != found["stream_id"]
    quarantined = sorted((e["seq"], e["payload"]) for k in kept for e in k.content()["events"])
    assert [s for s, _ in quarantined] == list(range(len(second)))
    assert '"B7"' in quarantined[9][1]
    assert b.stats.duplicates == len(kept) and b.stats.refusals == []
    assert a.stats.duplicates == 0


async def test_two_streams_interleaved_in_one_sink_leave_one_history(target: Target) -> None:
    rid = "resp_same_sink"
    async with asyncio.timeout(60):
        sink = make_sink(target, flush_every=2, flush_interval=0.001)
        await sink.start()
        await asyncio.gather(
            run_guarded(sink, marked(rid, "A", 40, "completed")),
            run_guarded(sink, marked(rid, "B", 40, "failed")),
        )
        found = await history(sink, rid)
        kept = await quarantine.read(sink.engine, response_id=rid, origin="duplicate")
        await sink.aclose()
    owner = found["deltas"][0][0]
    assert found["deltas"] == [f"{owner}{i}" for i in range(40)]
    assert found["status"] == ("completed" if owner == "A" else "failed")
    assert found["anomalies"] == [("duplicate_stream", "sink")]
    other = sorted(e["seq"] for k in kept for e in k.content()["events"])
    assert other == list(range(43))  # count in == out: the other stream's every event, once


async def race(target: Target, ids: list[str]) -> tuple[SqlSink, SqlSink, list[Any]]:
    """Two sinks (two replicas) each run a whole stream for every id in ``ids`` at once, then
    close; checks each id has one owner's whole history and the other stream's whole in the
    quarantine; the two sinks (for their stats) and the quarantine records."""
    async with asyncio.timeout(90):
        a, b = make_sink(target, flush_every=3), make_sink(target, flush_every=3)
        await a.start()
        await b.start()
        await asyncio.gather(
            *(run_guarded(a, marked(rid, "A", 15, "completed")) for rid in ids),
            *(run_guarded(b, marked(rid, "B", 15, "completed")) for rid in ids),
        )
        await a.aclose()
        await b.aclose()
        found = {rid: await history(b, rid) for rid in ids}
        kept = await quarantine.read(b.engine, origin="duplicate")
        await b.engine.dispose()
    for rid in ids:
        marks = {d[0] for d in found[rid]["deltas"]}
        assert len(marks) == 1, (rid, found[rid]["deltas"])
        assert found[rid]["seqs"] == list(range(18))
        assert found[rid]["anomalies"] == [("duplicate_stream", "sink")]
        others = sorted(e["seq"] for k in kept if k.response_id == rid for e in k.content()["events"])
        assert others == list(range(18))
    return a, b, kept


async def test_replicas_racing_for_the_same_ids_get_one_owner_each(target: Target) -> None:
    a, b, kept = await race(target, [f"resp_race_{i}" for i in range(8)])
    assert a.stats.duplicates + b.stats.duplicates == len(kept)


async def test_a_recovered_attempt_is_a_new_attempt_and_its_duplicate_is_refused(target: Target) -> None:
    rid = "resp_recovered_dup"
    info = ResponseInfo(response_id=rid, background=True)
    async with asyncio.timeout(60):
        a, b, c = make_sink(target), make_sink(target), make_sink(target)
        first = Lifecycle(info=info)
        rec = a.recorder(first)
        first.transition(State.IN_PROGRESS)
        rec.event(0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "A0"})
        first.transition(State.INTERRUPTED, cause=Cause.SHUTDOWN, reason="process exit")
        rec.changed()
        await rec.close()
        await a.aclose()
        recovered: list[SqlRecorder] = []
        for sink, mark in ((b, "B"), (c, "C")):  # B recovers it; C is a second stream of attempt 2
            lc = Lifecycle.for_recovery(info.model_copy(update={"is_recovery": True}))
            r = sink.recorder(lc)
            lc.transition(State.IN_PROGRESS, cause=Cause.RECOVERY)
            r.event(
                0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": f"{mark}0"}
            )
            lc.transition(State.COMPLETED if mark == "B" else State.FAILED)
            r.changed()
            await r.close()
            recovered.append(r)
        await b.aclose()
        await c.aclose()
        async with c.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(events.c.attempt, events.c.payload)
                    .where(events.c.response_id == rid)
                    .order_by(events.c.attempt, events.c.seq)
                )
            ).all()
        found = await history(c, rid)
        await c.engine.dispose()
    assert [(r.attempt, r.payload["delta"]) for r in rows] == [(1, "A0"), (2, "B0")]
    assert found["status"] == "completed"
    assert found["stream_id"] == recovered[0].stream_id
    assert found["anomalies"] == [("duplicate_stream", "sink")]
    assert c.stats.duplicates >= 1 and b.stats.duplicates == 0


async def test_a_spooled_batch_without_a_stream_counts_as_the_rows_own(target: Target) -> None:
    # Spools written before streams had ids carry none: such a batch is treated as the row's own.
    rid = "resp_old_spool"
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        lc, rec = await stored_in_progress(sink, rid)
        other = SqlRecorder(sink.writer, lc)  # another recorder: another stream id, same lifecycle
        other.event(0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})
        lc.transition(State.COMPLETED)
        batch = other.collect()
        assert batch is not None
        other.encode_some(batch)  # serialised before it is spooled (a batch is plain data)
        batch.stream_id = None
        sink.spool.append([batch])
        result = await sink.replay_spool()
        found = await history(sink, rid)
        await rec.close()
        await sink.aclose()
    assert result.quarantined == 0
    assert found["status"] == "completed"
    assert found["deltas"] == ["x"]
    assert found["stream_id"] == rec.stream_id  # kept: a batch without a stream takes nothing away


async def test_a_stream_that_takes_the_next_attempt_sends_its_later_batches_under_it(target: Target) -> None:
    """The writer tells the recorder when its batch was stored under another attempt (the batch
    is plain data: the writer finds the recorder by the batch's stream id), so the stream's next
    batch already carries the new attempt and stream id. Pins the batch -> recorder lookup that
    replaced ``Batch.source`` (issue 12)."""
    from datetime import timedelta

    from eventguard.store import ResponseStore

    rid = "resp_takes_over"
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        await stored_in_progress(sink, rid)
        store = ResponseStore(target.url, schema=target.schema)
        assert await store.recover(older_than=timedelta(0)) == [rid]  # attempt 1: interrupted
        await store.aclose()
        second = Lifecycle(info=ResponseInfo(response_id=rid))  # another stream, attempt 1 too
        taker = sink.recorder(second)
        own_id = taker.stream_id
        second.transition(State.IN_PROGRESS)
        taker.changed()
        await sink.flush()
        renumbered_id = taker.stream_id
        taker.event(0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "x"})
        later = taker.collect()
        await sink.aclose()
    assert renumbered_id != own_id and renumbered_id.startswith(own_id)
    assert later is not None
    assert (later.attempt, later.stream_id) == (2, renumbered_id)
