"""A redactor that raises: nothing forwarded is lost, the row still ends, and nothing it was meant to
mask reaches the database, the spool, the quarantine table or the quarantine file. On SQLite and
PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from eventguard.sink import SqlSink, quarantine
from eventguard.sink.batch import Batch
from eventguard.sink.recorder import SqlRecorder
from eventguard.sink.spool import Spool
from eventguard.sql.tables import anomalies, events, responses
from eventguard.sql.tables import quarantine as quarantine_table

from .conftest import Target
from .helpers import created, delta, in_progress, run_guarded, terminal

SECRET = "my-SSN-123-45-6789"
ARGS = "response.function_call_arguments.delta"


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


def masks_typed_events(_etype: str | None, event: Any) -> Any:
    """A typical redactor: masks the secret, and assumes every event has a ``type`` (KeyError else)."""
    out = {k: ("***" if v == SECRET else v) for k, v in event.items()}
    if event["type"] == "response.created":
        out["response"] = {**event["response"], "instructions": "***"}
    return out


def chokes_on_arguments(etype: str | None, event: Any) -> Any:
    """Masks the secret, but raises on a field name it expects and the event does not have."""
    if etype == ARGS:
        return {**event, "delta": event["arguments_delta_v2"]}
    return {k: ("***" if v == SECRET else v) for k, v in event.items()}


async def everything(sink: SqlSink) -> str:
    """Every row of every sink table, as text."""
    out = []
    async with sink.engine.connect() as conn:
        for table in (responses, events, anomalies, quarantine_table):
            out += [repr(tuple(r)) for r in (await conn.execute(select(table))).all()]
    return "\n".join(out)


def files_beside(spool: Path) -> str:
    return "".join(p.read_text("utf-8", "replace") for p in sorted(spool.parent.glob(f"{spool.name}*")))


async def test_a_redactor_that_raises_on_an_anomaly_payload_loses_no_event(target: Target) -> None:
    rid = "resp_redact_anomaly"
    evs = [
        created(rid),
        in_progress(rid),
        delta(0),
        {"untyped": True, "user_input": SECRET},  # not forwarded: a guard anomaly keeps it
        delta(1),
        delta(2),
        delta(3),
        terminal(rid),
    ]
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=masks_typed_events, flush_interval=0.01)
        await sink.start()
        seen = await run_guarded(sink, evs)
        await run_guarded(sink, [created("resp_next"), terminal("resp_next")])  # the writer goes on
        async with sink.engine.connect() as conn:
            row = (await conn.execute(select(responses).where(responses.c.response_id == rid))).one()
            stored = (
                await conn.execute(select(events.c.seq, events.c.type).where(events.c.response_id == rid))
            ).all()
            found = (await conn.execute(select(anomalies).where(anomalies.c.response_id == rid))).all()
        dump = await everything(sink)
        await sink.aclose()
    assert len(seen) == 7
    assert row.status == "completed" and row.event_count == 7
    assert sorted(t for _, t in stored) == sorted(e["type"] for e in seen)
    guard = [a for a in found if a.source == "guard"]
    assert [(a.kind, a.payload) for a in guard] == [("missing_type", None)]
    said = [a.reason for a in found if a.source == "sink" and a.kind == "not_serialisable"]
    assert len(said) == 1 and "redactor raised KeyError" in said[0] and "not stored" in said[0]
    assert sink.stats.lost == 0 and sink.stats.quarantine_file == 0
    assert SECRET not in dump
    assert not sink.quarantine_path.exists()
    assert "resp_next" in dump


def names_the_secret(etype: str | None, event: Any) -> Any:
    """A redactor whose error message quotes what it was meant to mask."""
    if etype == ARGS:
        raise KeyError(f"no field for {event['delta']}")
    return {k: ("***" if v == SECRET else v) for k, v in event.items()}


@pytest.mark.parametrize("redactor", [chokes_on_arguments, names_the_secret], ids=lambda f: f.__name__)
async def test_an_event_the_redactor_cannot_handle_is_quarantined_without_its_content(
    target: Target, redactor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Nor the error's message, which may quote what it was meant to mask (``names_the_secret``): its
    type only, in the quarantine row's reason and in the log, said once and counted."""
    rid = "resp_redact_event"
    evs = [
        created(rid),
        in_progress(rid),
        {"type": ARGS, "delta": f'{{"api_key": "{SECRET}"}}'},
        {**delta(1), "delta": SECRET},
        terminal(rid),
    ]
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=redactor, flush_interval=0.01)
        await sink.start()
        await run_guarded(sink, evs)
        kept = await quarantine.read(sink.engine, response_id=rid)
        dump = await everything(sink)
        await sink.aclose()
    assert len(kept) == 1
    content = kept[0].content()
    assert (content["seq"], content["type"]) == (2, ARGS)
    assert "event" not in content
    assert "the redactor raised KeyError" in kept[0].reason
    assert SECRET not in caplog.text and "the redactor raised KeyError" in caplog.text
    assert sink.stats.unexpected_errors == 1 and sink.stats.lost == 0
    assert SECRET not in dump


async def test_work_that_cannot_be_collected_is_quarantined_without_content_under_a_redactor(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    rid = "resp_redact_collect"

    def broken(self: SqlRecorder, now: Any) -> dict[str, Any]:
        raise AttributeError("a bug in the recorder")

    monkeypatch.setattr(SqlRecorder, "_row", broken)
    evs = [created(rid), in_progress(rid), {**delta(0), "delta": SECRET}, {"no_type": SECRET}, terminal(rid)]
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=masks_typed_events, flush_interval=0.01)
        await sink.start()
        await run_guarded(sink, evs)
        await sink.aclose()
    records = quarantine.read_file(sink.quarantine_path)
    assert records and all(r.response_id == rid for r in records)
    assert all(SECRET not in r.record for r in records)
    # What is kept says which events and anomalies there were, without their content.
    seqs = sorted(e["seq"] for r in records for e in r.content().get("pending_events", []))
    assert seqs == [0, 1, 2, 3]
    assert sink.stats.lost == 0


class SpoolThatRaises(Spool):
    def append(self, batches: Iterable[Batch]) -> int:
        raise OSError(28, "No space left on device")


async def test_the_quarantine_file_holds_no_unredacted_event_when_the_spool_fails(
    target: Target, tmp_path: Path
) -> None:
    rid = "resp_redact_nowhere"
    evs = [
        created(rid),
        in_progress(rid),
        {"type": ARGS, "delta": SECRET},
        {**delta(1), "delta": SECRET},
        terminal(rid),
    ]
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=chokes_on_arguments, flush_interval=0.01)
        sink.spool = SpoolThatRaises(target.spool)
        await sink.start()
        sink.writer.outage.retry_at = time.monotonic() + 60  # in an outage's back-off: every batch is spooled
        sink.writer.outage.reason = "simulated"
        await run_guarded(sink, evs)
        await sink.aclose()
    written = files_beside(target.spool)
    assert written and SECRET not in written
    records = quarantine.read_file(sink.quarantine_path)
    stored_seqs = sorted(e["seq"] for r in records for e in r.content().get("events", []))
    skipped = [r.content()["seq"] for r in records if "seq" in r.content()]
    assert skipped == [2]
    assert sorted([*stored_seqs, *skipped]) == list(range(len(evs)))
    assert sink.stats.lost == 0


async def test_one_event_the_redactor_cannot_handle_does_not_take_its_batch_out_of_the_spool(
    target: Target,
) -> None:
    rid = "resp_redact_spooled"
    evs = [created(rid), in_progress(rid), delta(0), {"type": ARGS, "delta": "{}"}, delta(1), terminal(rid)]
    async with asyncio.timeout(60):
        sink = make_sink(target, redact=chokes_on_arguments, flush_interval=0.01)
        await sink.start()
        sink.writer.outage.retry_at = time.monotonic() + 0.5  # in an outage's back-off: the writer spools
        sink.writer.outage.reason = "simulated"
        await run_guarded(sink, evs)
        assert sink.stats.batches_spooled >= 1
        await asyncio.sleep(0.6)
        await run_guarded(sink, [created("resp_other"), terminal("resp_other")])  # back: replayed
        await sink.replay_spool()
        async with sink.engine.connect() as conn:
            status = (
                await conn.execute(select(responses.c.status).where(responses.c.response_id == rid))
            ).scalar()
            seqs = (
                (await conn.execute(select(events.c.seq).where(events.c.response_id == rid))).scalars().all()
            )
        await sink.aclose()
    assert status == "completed"
    assert sorted(seqs) == [0, 1, 2, 4, 5]
    records = quarantine.read_file(sink.quarantine_path)
    assert [(r.content()["seq"], r.content()["type"]) for r in records] == [(3, ARGS)]
    assert sink.stats.lost == 0


async def test_a_predicate_that_raises_keeps_the_event_and_the_stream(target: Target) -> None:
    """A predicate that assumes every event has a 'delta' raised on response.created: the guard
    re-raised it to the host, the client got nothing and the response was stored failed. Now every
    event is forwarded, the ones it could not judge are kept, and the error is counted."""

    def only_first_delta(_etype: str | None, event: Any) -> bool:
        return bool(event["delta"] == "d0")

    class Undecided:
        def __bool__(self) -> bool:
            raise ValueError("neither")

    async with asyncio.timeout(60):
        for n, predicate in enumerate((only_first_delta, lambda _t, _e: Undecided())):
            rid = f"resp_predicate_raises_{n}"
            evs = [created(rid), in_progress(rid), delta(0), delta(1), terminal(rid)]
            sink = make_sink(target, predicate=predicate, flush_interval=0.01)
            await sink.start()
            seen = await run_guarded(sink, evs)
            async with sink.engine.connect() as conn:
                row = (await conn.execute(select(responses).where(responses.c.response_id == rid))).one()
                stored = (await conn.execute(select(events.c.seq).where(events.c.response_id == rid))).all()
            await sink.aclose()
            assert len(seen) == len(evs)
            assert row.status == "completed"
            # The events it could not judge are kept; the one it judged false (d1) is not.
            judged_out = 1 if predicate is only_first_delta else 0
            assert sorted(seq for (seq,) in stored) == [
                i for i in range(len(evs)) if i != 3 or not judged_out
            ]
            assert sink.stats.unexpected_errors == (3 if judged_out else len(evs))
