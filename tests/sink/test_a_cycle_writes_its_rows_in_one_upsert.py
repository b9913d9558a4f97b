"""The cycle's rows in one conditional upsert: refusals found among many rows, several batches of
one response in one write, and a thousand concurrent streams stored with nothing spooled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select

from eventguard.lifecycle import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink
from eventguard.sql.tables import TERMINAL, anomalies, events, responses, transitions

from .conftest import Target
from .helpers import delta, run_guarded, script


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def _count(sink: SqlSink, stmt: Any) -> int:
    async with sink.engine.connect() as conn:
        return int((await conn.execute(stmt)).scalar_one())


async def test_refused_terminal_among_many_rows_of_one_statement(target: Target) -> None:
    # Writer a ends "r_taken" as completed. Writer b then records 30 responses in ONE cycle (one
    # upsert statement), one of them a recovered attempt of "r_taken" that failed: only that row is
    # refused, recorded as a sink_refused anomaly with the refused transition; the 29 others are
    # written. (A second stream of the same attempt would be a duplicate: test_duplicate_stream.)
    async with asyncio.timeout(60):
        a = make_sink(target)
        await run_guarded(a, script("r_taken", n_deltas=2, final="completed"))
        await a.aclose()

        b = make_sink(target, flush_interval=3600)
        await b.start()
        recs = []
        ids = [f"r_new_{i}" for i in range(29)] + ["r_taken"]
        for rid in ids:
            info = ResponseInfo(response_id=rid)
            lc = Lifecycle.for_recovery(info) if rid == "r_taken" else Lifecycle(info=info)
            rec = b.recorder(lc)
            lc.transition(State.IN_PROGRESS)
            for i in range(3):
                rec.event(i, "response.output_text.delta", delta(i))
            lc.transition(State.FAILED if rid == "r_taken" else State.COMPLETED)
            rec.changed()
            recs.append(rec)
        await b.flush()  # one cycle, all 30 rows
        assert b.stats.batches_written == 30
        for rec in recs:
            await rec.close()
        await b.aclose()

        r, t, an = responses.c, transitions.c, anomalies.c
        assert [x.wanted for x in b.stats.refusals] == ["failed"]
        async with b.engine.connect() as conn:
            statuses = dict((await conn.execute(select(r.response_id, r.status))).all())
            refused = (
                await conn.execute(
                    select(an.payload).where(an.response_id == "r_taken", an.kind == "sink_refused")
                )
            ).all()
            n_terminal = (
                await conn.execute(
                    select(func.count()).where(t.response_id == "r_taken", t.to_state.in_(TERMINAL))
                )
            ).scalar_one()
            n_events = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        await b.engine.dispose()
    assert statuses["r_taken"] == "completed"
    assert all(statuses[rid] == "completed" for rid in ids[:-1])
    assert n_terminal == 1
    assert len(refused) == 1
    assert refused[0].payload[0]["to_state"] == "failed"
    # a stored 6 events of r_taken (attempt 1); b's 3 of attempt 2 are kept beside them.
    assert n_events == 6 + 29 * 3 + 3


async def test_several_batches_of_one_response_in_one_write(target: Target) -> None:
    # Spooled batches replay together: the same response several times in one write takes
    # several rounds of the upsert (PostgreSQL refuses to touch a row twice in one statement).
    async with asyncio.timeout(60):
        sink = make_sink(target)
        await sink.start()
        lc = Lifecycle(info=ResponseInfo(response_id="r_rounds"))
        rec = sink.recorder(lc)
        batches = []
        lc.transition(State.IN_PROGRESS)
        rec.changed()
        for i in range(4):
            rec.event(i, "response.output_text.delta", delta(i))
            if i == 3:
                lc.transition(State.COMPLETED)
                rec.changed()
            b = rec.collect()
            assert b is not None
            batches.append(b)
        sink.writer.to_spool(batches, None)
        result = await sink.replay_spool()
        r = responses.c
        async with sink.engine.connect() as conn:
            row = (await conn.execute(select(r.status, r.state_seq).where(r.response_id == "r_rounds"))).one()
            n = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
        await sink.aclose()
    assert result.batches == 4
    assert result.refusals == ()
    assert tuple(row) == ("completed", 2)
    assert n == 4


@pytest.mark.slow
async def test_1000_concurrent_streams_store_everything_directly(target: Target) -> None:
    from eventguard import guard

    from .helpers import aiter_of

    async def one(sink: SqlSink, rid: str) -> int:
        n = 0
        async with guard(aiter_of(script(rid, n_deltas=96)), asyncio.Event(), sink=sink) as g:
            async for _ in g:
                n += 1
        return n

    sink = make_sink(target)
    async with asyncio.timeout(120):
        await sink.start()
        counts = await asyncio.gather(*(one(sink, f"r{i}") for i in range(1000)))
        await sink.aclose()
        assert counts == [100] * 1000
        assert sink.stats.batches_spooled == 0
        assert sink.stats.overflows == 0
        assert not target.spool.exists()
        assert await _count(sink, select(func.count()).select_from(events)) == 100_000
        assert (
            await _count(
                sink, select(func.count()).select_from(responses).where(responses.c.status == "completed")
            )
            == 1000
        )
        await sink.engine.dispose()
