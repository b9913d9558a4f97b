"""Every string that reaches a column is storable, on SQLite and PostgreSQL (issue 11).

For every column a string can reach x {NUL, lone surrogate, C0/C1 controls, an ANSI escape, an RTL
override, a huge value (1 MB; 300 characters for ids and types)}, and for NaN/±Infinity in a
payload, a guarded stream through ``guard(..., sink=sink)``:

- completes (the client gets its terminal, or the inner stream's own exception);
- has every forwarded event stored (0 lost) and its recorded status equal to what the client got;
- is followed by a healthy response in the same sink that is stored too (nothing spooled);
- has each change explained by a ``sink`` anomaly from which the original can be rebuilt, and
  every value that needed no change stored exactly as it was.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select, text

from eventguard import guard
from eventguard.lifecycle import AnomalyKind, Cause, Lifecycle, ResponseInfo, State
from eventguard.records import History
from eventguard.sink import SqlSink
from eventguard.sql.storable import REPLACEMENT, unescape
from eventguard.sql.tables import responses
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import run_guarded, script

STEP = 60.0
MB = 1_000_000  # under the sink's default max_payload_bytes (1 MiB) once in its JSON

#: The hostile strings. "huge" is per column (see huge()).
KINDS = ("nul", "surrogate", "c0_c1", "ansi", "rtl", "huge")
STRINGS = {
    "nul": "a\x00b",
    "surrogate": "a\udcffb",
    "c0_c1": "a\x01\x07\x08\x1f\x7f\x85\x9fb",
    "ansi": "a\x1b[31mred\x1b[0m\x1b]0;title\x07b",
    "rtl": "a\u202eevil\u202cb",
}
#: Columns of 255 characters (or the type's 128): a huge value there is 300+ characters.
ID_COLUMNS = (
    "response_id",
    "conversation_id",
    "chain_id",
    "partition_key",
    "agent_name",
    "owner",
    "error_code",
    "error_type",
)
TYPE_COLUMNS = ("event_type", "anomaly_event_type")
TEXT_COLUMNS = ("error_message", "exception_text", "payload_text", "payload_key")
COLUMNS = ID_COLUMNS + TYPE_COLUMNS + TEXT_COLUMNS
INFO_COLUMNS = ("conversation_id", "chain_id", "partition_key", "agent_name")
TERMINALS = {
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
}


def huge(column: str) -> str:
    if column in ID_COLUMNS or column in TYPE_COLUMNS:
        return "h" * 299 + "\u202e"  # 300 characters, the last one beyond any id's 255
    return "m" * MB + "\u202e"


def hostile(column: str, kind: str) -> str:
    return huge(column) if kind == "huge" else STRINGS[kind]


def needs_change(column: str, kind: str) -> bool:
    if kind in ("nul", "surrogate"):
        return True
    if kind != "huge":
        return False
    # The type columns keep a prefix; the exception text is cut by the guard itself (500).
    return column in ID_COLUMNS or column in TYPE_COLUMNS


def snapshot(rid: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, **extra}


@dataclass
class Case:
    n: int
    column: str
    kind: str
    value: str

    @property
    def marker(self) -> str:
        return f"cc{self.n:03d}x"  # letters and digits: findable with LIKE

    @property
    def rid(self) -> str:
        return self.marker + (self.value if self.column == "response_id" else "")


class HostileError(RuntimeError):
    pass


def error_class(name: str) -> type[HostileError]:
    """An exception class whose qualified name holds ``name`` (type() refuses a NUL in a name)."""
    cls = type("Named", (HostileError,), {})
    cls.__qualname__ = name
    return cls


async def stream(case: Case) -> AsyncIterator[Any]:
    c, v, rid = case.column, case.value, case.rid
    yield {"type": "response.created", "response": snapshot(rid, "in_progress")}
    await asyncio.sleep(0)
    yield {"type": "response.in_progress", "response": snapshot(rid, "in_progress")}
    delta: dict[str, Any] = {"type": "response.output_text.delta", "delta": "ok", "output_index": 0}
    if c == "event_type":
        delta["type"] = "x.delta." + v
    elif c == "payload_text":
        delta["delta"] = v
    elif c == "payload_key":
        delta[v] = 1
    yield delta
    if c == "exception_text":
        raise HostileError(v)
    if c == "error_type":
        raise error_class(v)("boom")
    if c in ("error_code", "error_message"):
        code, message = (v, "x") if c == "error_code" else ("server_error", v)
        error = {"code": code, "message": message}
        yield {"type": "response.failed", "response": snapshot(rid, "failed", error=error)}
        return
    yield {"type": "response.completed", "response": snapshot(rid, "completed")}
    if c == "anomaly_event_type":
        # After the terminal: not forwarded, kept as a guard anomaly that names its type.
        yield {"type": "late." + v, "n": 1}


async def healthy(rid: str) -> AsyncIterator[Any]:
    yield {"type": "response.created", "response": snapshot(rid, "in_progress")}
    yield {"type": "response.output_text.delta", "delta": "fine", "output_index": 0}
    yield {"type": "response.completed", "response": snapshot(rid, "completed")}


@dataclass
class Sent:
    events: list[Any]
    status: str


async def drive(sink: SqlSink, source: AsyncIterator[Any], info: ResponseInfo | None = None) -> Sent:
    got: list[Any] = []
    raised = False
    async with asyncio.timeout(STEP):
        try:
            async with guard(source, asyncio.Event(), sink=sink, info=info) as g:
                async for ev in g:
                    got.append(ev)
        except HostileError:
            raised = True
    terminals = [e for e in got if isinstance(e, dict) and e.get("type") in TERMINALS]
    assert len(terminals) <= 1
    status = "failed" if raised or not terminals else TERMINALS[terminals[0]["type"]]
    return Sent(got, status)


def make_sink(target: Target, **kw: Any) -> SqlSink:
    return SqlSink(target.url, schema=target.schema, spool_path=target.spool, **kw)


async def the_history(store: ResponseStore, sink: SqlSink, marker: str) -> History:
    """The one response whose id starts with ``marker`` (whatever its stored form)."""
    async with sink.engine.connect() as conn:
        ids = (
            (
                await conn.execute(
                    select(responses.c.response_id).where(responses.c.response_id.like(marker + "%"))
                )
            )
            .scalars()
            .all()
        )
    assert len(ids) == 1, f"{marker}: {len(ids)} rows"
    hist = await store.history(ids[0])
    assert hist is not None
    return hist


def stored_value(case: Case, hist: History) -> Any:
    c = case.column
    row = hist.response
    events = {e.seq: e for e in hist.attempts[0].events}
    if c == "response_id":
        return row.response_id
    if c in INFO_COLUMNS or c in ("error_code", "owner"):
        return getattr(row, c)
    if c == "error_message":
        return row.error_message
    if c == "exception_text":
        return row.error_message
    if c == "error_type":
        return row.error_type
    if c == "event_type":
        return events[2].type
    if c == "payload_text":
        return events[2].payload["delta"]
    if c == "payload_key":
        return next(k for k in events[2].payload if k not in ("type", "delta", "output_index"))
    if c == "anomaly_event_type":
        late = [
            a for a in hist.attempts[0].anomalies if a.source == "guard" and a.kind == "event_after_terminal"
        ]
        assert len(late) == 1
        return late[0].event_type
    raise AssertionError(c)


def original_in_column(case: Case) -> str:
    """What the column would hold if every value were storable."""
    c, v = case.column, case.value
    return {
        "response_id": case.rid,
        "error_type": f"{__name__}.{v}",
        "event_type": "x.delta." + v,
        "anomaly_event_type": "late." + v,
    }.get(c, v)


def sink_anomalies(hist: History) -> list[Any]:
    return [a for a in hist.attempts[0].anomalies if a.source == "sink"]


def check_explained(case: Case, hist: History, stored: Any) -> None:
    """The change is explained by an anomaly from which the original can be rebuilt."""
    c = case.column
    found = sink_anomalies(hist)
    if c in ("payload_text", "payload_key"):
        # Payloads: U+FFFD in place of each NUL / lone surrogate, the anomaly naming path and code point.
        assert REPLACEMENT in stored
        reasons = [a.reason for a in found if a.kind == "not_serialisable" and a.event_index == 2]
        assert reasons, found
        if case.kind == "nul":
            assert any("U+0000" in r and "$" in r for r in reasons), reasons
        else:
            assert any("U+DCFF at 1" in r for r in reasons), reasons
        return
    original = original_in_column(case)
    if c == "event_type" and case.kind == "huge":
        # Only too long: the column keeps a prefix, the payload the whole type (as before).
        events = {e.seq: e for e in hist.attempts[0].events}
        assert stored == original[:128] and events[2].payload["type"] == original
        assert any(
            a.kind == "payload_truncated" and f"{len(original)} characters" in a.reason for a in found
        ), found
        return
    escaped = [a for a in found if a.kind == AnomalyKind.VALUE_ESCAPED.value]
    assert escaped, f"{case}: no value_escaped anomaly among {found}"
    if c in ("error_message", "exception_text"):
        # Free text: stored escaped, and the escape is reversible.
        assert unescape(stored) == original
        assert any(a.reason.startswith("responses.error_message: ") for a in escaped)
        return
    field = {
        "event_type": "events.type",
        "anomaly_event_type": "anomalies.event_type",
        "owner": "responses.owner",
        "response_id": "response_id",
    }.get(c, f"responses.{c}")
    mine = [a for a in escaped if a.reason.startswith(field)]
    assert mine, f"{case}: no anomaly about {field}: {[a.reason for a in escaped]}"
    a = mine[0]
    if a.payload is None:
        # The stored value is the whole original, escaped.
        assert c in TYPE_COLUMNS and unescape(stored) == original
        return
    assert a.payload["stored"] == stored
    assert unescape(a.payload["original_escaped"]) == original
    assert a.payload["original_length"] == len(original)
    if c in ID_COLUMNS:
        assert "~" in stored and len(stored) <= 255


async def check_case(target: Target, store: ResponseStore, sink: SqlSink, case: Case) -> None:
    info = ResponseInfo(**{case.column: case.value}) if case.column in INFO_COLUMNS else None
    sent = await drive(sink, stream(case), info)
    healthy_rid = "healthy" + case.marker
    after = await drive(sink, healthy(healthy_rid))
    async with asyncio.timeout(STEP):
        await sink.flush()
        hist = await the_history(store, sink, case.marker)
        good = await store.history(healthy_rid)
    # The stream completed with the status the client was told, and nothing it was sent is lost.
    assert hist.response.status == sent.status, case
    assert [e.seq for e in hist.attempts[0].events] == list(range(len(sent.events))), case
    assert hist.response.event_count == len(sent.events)
    # The healthy response after it is stored, and nothing went to the spool.
    assert good is not None and good.response.status == after.status == "completed"
    assert len(good.attempts[0].events) == len(after.events) == 3
    # (A sink's owner is in every row it writes: each response says so once.)
    assert all(a.reason.startswith("responses.owner: ") for a in sink_anomalies(good))
    assert sink.stats.batches_spooled == 0, sink.stats.last_error
    assert not sink.spool.pending()
    stored = stored_value(case, hist)
    if needs_change(case.column, case.kind):
        check_explained(case, hist, stored)
    else:
        original = original_in_column(case)
        if case.column == "exception_text":
            original = original if len(original) <= 500 else original[:499] + "…"  # the guard's cut
        assert stored == original, f"{case}: stored {stored!r:.80}"
        assert not [a for a in sink_anomalies(hist) if a.kind == "value_escaped"], case


@pytest.fixture
async def store(target: Target) -> AsyncIterator[ResponseStore]:
    st = ResponseStore(target.url, schema=target.schema)
    try:
        yield st
    finally:
        await st.aclose()


@pytest.mark.parametrize("column", [c for c in COLUMNS if c != "owner"])
async def test_hostile_strings_in_every_column(target: Target, store: ResponseStore, column: str) -> None:
    cases = [Case(n, column, kind, hostile(column, kind)) for n, kind in enumerate(KINDS)]
    async with asyncio.timeout(STEP * len(cases)):
        sink = make_sink(target)
        try:
            await sink.migrate()
            for case in cases:
                await check_case(target, store, sink, case)
        finally:
            await sink.aclose()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hostile_owner_is_stored_in_every_row(
    target: Target, store: ResponseStore, kind: str
) -> None:
    """The sink's ``owner=`` is in every row it writes: one sink per value."""
    case = Case(0, "owner", kind, hostile("owner", kind))
    async with asyncio.timeout(STEP):
        sink = make_sink(target, owner=case.value)
        try:
            await sink.migrate()
            await check_case(target, store, sink, case)
            good = await store.get("healthy" + case.marker)
            assert good is not None
            assert good.owner == (await the_history(store, sink, case.marker)).response.owner
        finally:
            await sink.aclose()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "minus_inf"])
async def test_non_finite_numbers_in_a_payload_are_stored_as_strings_with_an_anomaly(
    target: Target, store: ResponseStore, number: float
) -> None:
    rid = "resp_number"
    events = [
        {"type": "response.created", "response": snapshot(rid, "in_progress")},
        {"type": "response.output_text.delta", "delta": "x", "logprob": number, "top": [1.5, number]},
        {"type": "response.output_text.delta", "delta": "y", "logprob": None},  # a real null stays null
        {"type": "response.completed", "response": snapshot(rid, "completed")},
    ]
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.migrate()
        sent = await drive(sink, _iter(events))
        await drive(sink, healthy("resp_after_number"))
        await sink.aclose()
        hist = await store.history(rid)
        good = await store.get("resp_after_number")
    assert hist is not None and good is not None and good.status == "completed"
    assert hist.response.status == sent.status == "completed"
    by_seq = {e.seq: e.payload for e in hist.attempts[0].events}
    assert sorted(by_seq) == [0, 1, 2, 3]
    text = {math.inf: "Infinity", -math.inf: "-Infinity"}.get(number, "NaN")
    assert by_seq[1]["logprob"] == text
    assert by_seq[1]["top"] == [1.5, text]
    assert by_seq[2]["logprob"] is None
    reasons = [a.reason for a in sink_anomalies(hist) if a.kind == "not_serialisable" and a.event_index == 1]
    assert len(reasons) == 1
    assert f"$.logprob: {text}" in reasons[0] and f"$.top[1]: {text}" in reasons[0]
    assert not [a for a in sink_anomalies(hist) if a.event_index == 2]
    assert sink.stats.batches_spooled == 0


class _Chunk(BaseModel):
    """An event object (the openai SDK's are pydantic models) that carries raw bytes."""

    model_config = ConfigDict(extra="allow")
    type: str
    data: bytes


async def test_an_event_model_holding_bytes_that_are_not_utf8_is_stored_with_an_anomaly(
    target: Target, store: ResponseStore
) -> None:
    """Origin: pydantic's JSON dump raises ``UnicodeDecodeError`` on ``b"\\x80"``; the sink's
    serialiser let it out, so the event could not be stored (tests/reliability/test_hostile.py)."""
    rid = "resp_bytes"
    events = [
        {"type": "response.created", "response": snapshot(rid, "in_progress")},
        _Chunk(type="response.output_text.delta", data=b"\x80ok", delta="x"),
        _Chunk(type="response.output_text.delta", data=b"fine"),  # UTF-8 bytes: as pydantic writes them
        {"type": "response.completed", "response": snapshot(rid, "completed")},
    ]
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.migrate()
        sent = await drive(sink, _iter(events))
        await sink.aclose()
        hist = await store.history(rid)
    assert hist is not None and hist.response.status == sent.status == "completed"
    by_seq = {e.seq: e.payload for e in hist.attempts[0].events}
    assert sorted(by_seq) == [0, 1, 2, 3]
    assert by_seq[1] == {"type": "response.output_text.delta", "data": "gG9r", "delta": "x"}
    assert by_seq[2] == {"type": "response.output_text.delta", "data": "fine"}
    reasons = [a.reason for a in sink_anomalies(hist) if a.kind == "not_serialisable"]
    assert [a.event_index for a in sink_anomalies(hist) if a.kind == "not_serialisable"] == [1]
    assert "base64" in reasons[0]
    assert sink.stats.batches_spooled == 0


async def test_usage_beyond_64_bits_is_stored_null_with_an_anomaly(
    target: Target, store: ResponseStore
) -> None:
    """Not a string, but a row value all the same: a token count no BIGINT holds."""
    rid = "resp_tokens"
    usage = {"input_tokens": 2**80, "output_tokens": -(2**63) - 1, "total_tokens": 2**63 - 1}
    events = [
        {"type": "response.created", "response": snapshot(rid, "in_progress")},
        {"type": "response.completed", "response": snapshot(rid, "completed", usage=usage)},
    ]
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.migrate()
        sent = await drive(sink, _iter(events))
        await drive(sink, healthy("resp_after_tokens"))
        await sink.aclose()
        hist = await store.history(rid)
        good = await store.get("resp_after_tokens")
    assert hist is not None and good is not None and good.status == "completed"
    assert hist.response.status == sent.status == "completed"
    assert len(hist.attempts[0].events) == 2
    row = hist.response
    assert (row.input_tokens, row.output_tokens, row.total_tokens) == (None, None, 2**63 - 1)
    reasons = [a.reason for a in sink_anomalies(hist) if a.kind == "value_escaped"]
    assert reasons == [
        f"responses.input_tokens: {2**80} is beyond the column's 64-bit range: stored NULL",
        f"responses.output_tokens: {-(2**63) - 1} is beyond the column's 64-bit range: stored NULL",
    ]


async def _iter(events: list[Any]) -> AsyncIterator[Any]:
    for ev in events:
        await asyncio.sleep(0)
        yield ev


#: Ids that differ only in an unstorable character or beyond the column's 255 characters.
LOOKALIKE_IDS = [
    "resp\x00a",
    "resp\x00b",
    "resp\udcffa",
    "resp\ud800a",
    "resp\\x00a",  # the escape's own spelling, as an ordinary id
    "resp\\udcffa",
    "respa",
    "resp",
    "p" * 255 + "A",
    "p" * 255 + "B",
    "p" * 255,
    "p" * 256,
]


async def test_lookalike_ids_stay_distinct_rows(target: Target, store: ResponseStore) -> None:
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.migrate()
        for n, rid in enumerate(LOOKALIKE_IDS):
            events = [
                {"type": "response.created", "response": snapshot(rid, "in_progress")},
                {"type": "response.output_text.delta", "delta": f"n{n}", "output_index": 0},
                {"type": "response.completed", "response": snapshot(rid, "completed")},
            ]
            await drive(sink, _iter(events))
        await sink.aclose()
        page = await store.terminal_states(limit=100)
        stored = [r.response_id for r in page.items]
        deltas = {}
        for sid in stored:
            hist = await store.history(sid)
            assert hist is not None
            deltas[sid] = [e.payload["delta"] for e in hist.attempts[0].events if "delta" in e.payload]
    assert len(stored) == len(set(stored)) == len(LOOKALIKE_IDS)
    # Each row holds its own stream's events, in the order the ids were driven.
    assert [deltas[s] for s in stored] == [[f"n{n}"] for n in range(len(LOOKALIKE_IDS))]
    # The ids that were storable as they were are stored byte for byte.
    for rid, sid in zip(LOOKALIKE_IDS, stored, strict=True):
        if "\x00" not in rid and not any(0xD800 <= ord(c) <= 0xDFFF for c in rid) and len(rid) <= 255:
            assert sid == rid
        else:
            assert sid != rid and len(sid) <= 255 and "~" in sid


async def test_a_huge_response_id_is_explained_whole(target: Target, store: ResponseStore) -> None:
    rid = "resp" + "\x00" + "i" * MB
    events = [
        {"type": "response.created", "response": snapshot(rid, "in_progress")},
        {"type": "response.completed", "response": snapshot(rid, "completed")},
    ]
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.migrate()
        await drive(sink, _iter(events))
        await sink.aclose()
        page = await store.terminal_states()
        assert len(page.items) == 1
        hist = await store.history(page.items[0].response_id)
    assert hist is not None and hist.response.status == "completed"
    assert len(hist.attempts[0].events) == 2
    (note,) = [a for a in sink_anomalies(hist) if a.kind == "value_escaped"]
    assert note.reason.startswith(
        f"response_id: 1 NUL (U+0000), {len(rid)} characters (the column holds 255)"
    )
    assert unescape(note.payload["original_escaped"]) == rid
    assert note.payload["original_escaped_cut"] is False


async def test_transition_and_guard_anomaly_fields(target: Target, store: ResponseStore) -> None:
    """Reasons and anomaly types, whatever code wrote them: escaped, explained, nothing lost."""
    rid = "resp_fields"
    async with asyncio.timeout(STEP):
        sink = make_sink(target)
        await sink.start()
        lc = Lifecycle(info=ResponseInfo(response_id=rid))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS, reason="started \x00 here \udcff")
        lc.note(AnomalyKind.OUT_OF_ORDER, "why \x00\\x00", event_type="t\udcff" * 100, payload={"k": "v\x00"})
        lc.note(AnomalyKind.STUCK, "ansi \x1b[31m rtl \u202e ok", event_type="plain")
        rec.event(0, "response.output_text.delta", {"type": "response.output_text.delta", "delta": "\ud800"})
        lc.transition(State.COMPLETED, cause=Cause.NORMAL, reason="\x00" * 10)
        rec.changed()
        await rec.close()
        await sink.aclose()
        hist = await store.history(rid)
    assert hist is not None and hist.response.status == "completed"
    (one,) = hist.attempts
    assert [unescape(t.reason) for t in one.transitions] == ["started \x00 here \udcff", "\x00" * 10]
    guard_notes = [a for a in one.anomalies if a.source == "guard"]
    assert unescape(guard_notes[0].reason) == "why \x00\\x00"
    assert guard_notes[0].event_type is not None and len(guard_notes[0].event_type) <= 128
    assert guard_notes[0].payload == {"k": "v" + REPLACEMENT}
    assert guard_notes[1].reason == "ansi \x1b[31m rtl \u202e ok"  # storable: untouched
    assert guard_notes[1].event_type == "plain"
    assert one.events[0].payload["delta"] == REPLACEMENT
    sink_notes = [a.reason for a in one.anomalies if a.source == "sink"]
    for field in (
        "transitions.reason (attempt 1, idx 0)",
        "transitions.reason (attempt 1, idx 1)",
        "anomalies.reason of guard anomaly 0",
        "anomalies.event_type of guard anomaly 0",
        "guard anomaly 0 (attempt 1)'s payload: NUL",
    ):
        assert any(r.startswith(field) for r in sink_notes), (field, sink_notes)
    assert any("U+D800 at 0" in r for r in sink_notes)
    (type_note,) = [a for a in one.anomalies if a.source == "sink" and "anomalies.event_type" in a.reason]
    assert orjson.loads(orjson.dumps(type_note.payload))["original_escaped"] == "t\\udcff" * 100


# -- from review: content that used to stop a write -----------------------------------------------


async def test_a_nul_in_a_payload_neither_blocks_the_write_nor_the_next_response(target: Target) -> None:
    """PostgreSQL's jsonb refuses U+0000: the payload is stored with U+FFFD and a
    ``not_serialisable`` anomaly, and nothing is spooled. From review: it used to fail the whole
    write as if the database were away (reproduced before the fix)."""
    bad = script("resp_nul", n_deltas=1)
    bad[2] = {**bad[2], "delta": "a\x00b"}
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        await run_guarded(sink, bad)
        await run_guarded(sink, script("resp_after", n_deltas=1))
        await sink.flush()
        async with sink.engine.connect() as conn:
            rows = (
                await conn.execute(text("SELECT response_id, status FROM eventguard_responses ORDER BY pk"))
            ).all()
            kinds = (await conn.execute(text("SELECT kind FROM eventguard_anomalies"))).scalars().all()
            payloads = (
                (
                    await conn.execute(
                        text(
                            "SELECT payload FROM eventguard_events WHERE response_id = 'resp_nul' AND seq = 2"
                        )
                    )
                )
                .scalars()
                .all()
            )
        await sink.aclose()
    assert [tuple(r) for r in rows] == [("resp_nul", "completed"), ("resp_after", "completed")]
    assert sink.stats.batches_spooled == 0
    assert "not_serialisable" in kinds
    assert "a\ufffdb" in repr(payloads) or "a\\ufffdb" in repr(payloads)


async def test_an_event_type_longer_than_its_column_is_cut_with_an_anomaly(target: Target) -> None:
    """The type column holds 128 characters: a longer type is cut there, and an anomaly says how
    long it was. From review (reproduced before the fix)."""
    events = script("resp_long", n_deltas=1)
    events.insert(2, {"type": "x" * 300})
    async with asyncio.timeout(30):
        sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
        await sink.migrate()
        await run_guarded(sink, events)
        await sink.flush()
        async with sink.engine.connect() as conn:
            types = (
                (
                    await conn.execute(
                        text("SELECT type FROM eventguard_events WHERE response_id = 'resp_long'")
                    )
                )
                .scalars()
                .all()
            )
            reasons = (await conn.execute(text("SELECT reason FROM eventguard_anomalies"))).scalars().all()
        await sink.aclose()
    assert "x" * 128 in types
    assert any("300 characters" in r for r in reasons)
