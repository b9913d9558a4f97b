"""The hostile-content matrix: every column a string can reach x every kind of hostile value x
{live write, spool then replay}, on SQLite and PostgreSQL.

For each case a guarded stream carries the hostile value into one column and then a healthy
response follows in the same sink. Checked, per case:

- the stream completes (the client gets its terminal, or the inner stream's own exception);
- every forwarded event is in the events table or in the quarantine with a reason: 0 lost;
- the recorded status equals what the client was sent;
- live: the healthy response after it is stored by the time its guard has closed (no spooling,
  no back-off on a data error); spool: it is replayed with everything else.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from eventguard import SqlSink, guard
from eventguard.lifecycle import ResponseInfo
from tests._hostile import STRINGS

from ._common import Db, database, pg_execute, report

STEP = 60.0

NUMBERS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "minus_inf": -math.inf}

#: Where a hostile string goes: the column (or field) it can reach.
STRING_COLUMNS = (
    "response_id",
    "event_type",
    "payload_text",
    "error_code",
    "error_message",
    "exception_text",
    "agent_name",
    "conversation_id",
    "chain_id",
    "partition_key",
    "anomaly_reason",
)
NUMBER_COLUMNS = ("payload_number", "usage_tokens")


@dataclass
class Case:
    n: int
    column: str
    kind: str
    value: Any

    @property
    def marker(self) -> str:
        # Letters and digits only: a LIKE prefix with no wildcard in it.
        return f"hm{self.n:03d}x"


def cases() -> list[Case]:
    out: list[Case] = []
    for column in STRING_COLUMNS:
        for kind, value in STRINGS.items():
            out.append(Case(len(out), column, kind, value))
    for column in NUMBER_COLUMNS:
        for kind, number in NUMBERS.items():
            out.append(Case(len(out), column, kind, number))
    return out


def _snapshot(rid: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, **extra}


async def hostile_stream(case: Case) -> AsyncIterator[Any]:
    c, v = case.column, case.value
    rid = case.marker + (v if c == "response_id" else "")
    yield {"type": "response.created", "response": _snapshot(rid, "in_progress")}
    await asyncio.sleep(0)
    yield {"type": "response.in_progress", "response": _snapshot(rid, "in_progress")}
    etype = "response.output_text.delta" + (v if c == "event_type" else "")
    delta: dict[str, Any] = {"type": etype, "delta": v if c == "payload_text" else "ok", "output_index": 0}
    if c == "payload_number":
        delta["logprob"] = v
    yield delta
    if c == "anomaly_reason":
        # A second response.created: an out-of-order event, whose anomaly reason names its type.
        yield {"type": "response.queued" + v, "response": _snapshot(rid, "queued")}
    if c == "exception_text":
        raise RuntimeError(v)
    if c in ("error_code", "error_message"):
        error = {
            "code": v if c == "error_code" else "server_error",
            "message": v if c == "error_message" else "x",
        }
        yield {"type": "response.failed", "response": _snapshot(rid, "failed", error=error)}
        return
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    if c == "usage_tokens":
        usage["input_tokens"] = v
    yield {"type": "response.completed", "response": _snapshot(rid, "completed", usage=usage)}


async def healthy_stream(rid: str) -> AsyncIterator[Any]:
    yield {"type": "response.created", "response": _snapshot(rid, "in_progress")}
    yield {"type": "response.output_text.delta", "delta": "fine", "output_index": 0}
    yield {"type": "response.completed", "response": _snapshot(rid, "completed")}


def info_for(case: Case) -> ResponseInfo | None:
    if case.column in ("agent_name", "conversation_id", "chain_id", "partition_key"):
        return ResponseInfo(**{case.column: "v" + case.value})
    return None


@dataclass
class Sent:
    case: Case
    events: int
    status: str  # what the client was told: the terminal it received, or failed for a raise


async def drive(sink: SqlSink, case: Case) -> Sent:
    got: list[Any] = []
    raised = False
    async with asyncio.timeout(STEP):
        try:
            async with guard(hostile_stream(case), asyncio.Event(), sink=sink, info=info_for(case)) as g:
                async for ev in g:
                    got.append(ev)
        except RuntimeError:
            raised = True
    assert case.column != "exception_text" or raised, case
    terminal = [e for e in got if isinstance(e, dict) and e.get("type") in _STATUS]
    assert len(terminal) <= 1, case
    status = "failed" if raised or not terminal else _STATUS[terminal[0]["type"]]
    return Sent(case, len(got), status)


_STATUS = {
    "response.completed": "completed",
    "response.failed": "failed",
    "response.incomplete": "incomplete",
}


async def drive_healthy(sink: SqlSink, rid: str) -> int:
    n = 0
    async with asyncio.timeout(STEP):
        async with guard(healthy_stream(rid), asyncio.Event(), sink=sink) as g:
            async for _ in g:
                n += 1
    return n


# -- reading what was stored, with plain drivers (not eventguard's own store) --------------------


Query = Callable[[str, tuple[Any, ...]], Any]


def _table(db: Db, name: str) -> str:
    return f'"{db.schema}".{name}' if db.schema else name


async def fetch(db: Db, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """``sql`` with ``{t:name}`` table placeholders and ``?`` parameters, on either database."""
    for name in ("responses", "events", "quarantine"):
        sql = sql.replace(f"{{{name}}}", _table(db, f"eventguard_{name}"))
    if db.kind == "sqlite":
        assert db.path is not None

        def run() -> list[tuple[Any, ...]]:
            with closing(sqlite3.connect(db.path)) as conn:
                return list(conn.execute(sql, args))

        return await asyncio.to_thread(run)
    parts = sql.split("?")
    sql = parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], 1))
    return [tuple(r) for r in await pg_execute(sql, *args)]


def _quarantined_events(record: str) -> int:
    data = json.loads(record)
    if isinstance(data, dict):
        if isinstance(data.get("events"), list):
            return len(data["events"])
        if "seq" in data or "payload" in data:
            return 1
    return 0


async def stored(db: Db, marker: str) -> tuple[str | None, int, int, int]:
    """(status, stored events, quarantined events, quarantine rows) of the case's response."""
    rows = await fetch(
        db, "SELECT response_id, status FROM {responses} WHERE response_id LIKE ?", marker + "%"
    )
    assert len(rows) <= 1, f"{marker}: {len(rows)} rows"
    status = rows[0][1] if rows else None
    (events,) = (await fetch(db, "SELECT count(*) FROM {events} WHERE response_id LIKE ?", marker + "%"))[0]
    q = await fetch(db, "SELECT record, reason FROM {quarantine} WHERE response_id LIKE ?", marker + "%")
    for _record, reason in q:
        assert reason, f"{marker}: a quarantine row without a reason"
    return status, int(events), sum(_quarantined_events(r) for r, _ in q), len(q)


async def check(db: Db, sent: list[Sent], healthy: dict[str, int]) -> dict[str, int]:
    lost = mismatched = quarantined = 0
    problems: list[str] = []
    for s in sent:
        status, events, q_events, q_rows = await stored(db, s.case.marker)
        quarantined += q_rows
        if events + q_events != s.events:
            lost += s.events - events - q_events
            problems.append(f"{s.case.column}/{s.case.kind}: sent {s.events}, stored {events} + {q_events}")
        if status != s.status and not (status is None and q_rows):
            mismatched += 1
            problems.append(f"{s.case.column}/{s.case.kind}: client got {s.status}, stored {status}")
    for rid, n in healthy.items():
        status, events, _, _ = await stored(db, rid)
        if status != "completed" or events != n:
            problems.append(f"healthy {rid}: {status}, {events} of {n} events")
    assert not problems, "\n".join(problems)
    return {"lost": lost, "mismatched": mismatched, "quarantine_rows": quarantined}


# -- the matrix ------------------------------------------------------------------------------------


DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", DATABASES)
async def test_hostile_content_written_live_loses_nothing_and_never_delays_the_next_response(
    kind: str, tmp_path: Path
) -> None:
    all_cases = cases()
    async with database(kind, tmp_path) as db:
        async with SqlSink(db.url, schema=db.schema, spool_path=db.spool) as sink:
            sent: list[Sent] = []
            healthy: dict[str, int] = {}
            for case in all_cases:
                sent.append(await drive(sink, case))
                rid = f"hh{case.n:03d}x"
                healthy[rid] = await drive_healthy(sink, rid)
                # Stored by the time its guard closed: a refusal delays no one.
                status, events, _, _ = await stored(db, rid)
                assert (status, events) == ("completed", healthy[rid]), (case.column, case.kind, status)
            assert sink.stats.batches_spooled == 0, sink.stats.last_error
        figures = await check(db, sent, healthy)
    report(
        "hostile matrix",
        db=kind,
        mode="live",
        cases=len(all_cases),
        events_sent=sum(s.events for s in sent) + sum(healthy.values()),
        **figures,
    )


@pytest.mark.parametrize("kind", DATABASES)
async def test_hostile_content_spooled_then_replayed_loses_nothing(kind: str, tmp_path: Path) -> None:
    all_cases = cases()
    async with database(kind, tmp_path) as db:
        # The database is away: everything goes to the spool.
        # (SQLite: a database file under a regular file, which no one can create.)
        (tmp_path / "a-file").write_text("")
        away = (
            f"sqlite+aiosqlite:///{tmp_path / 'a-file' / 'x.db'}"
            if kind == "sqlite"
            else "postgresql+asyncpg://postgres@127.0.0.1:1/test"
        )
        down = SqlSink(away, spool_path=db.spool, connect_timeout=2)
        sent: list[Sent] = []
        healthy: dict[str, int] = {}
        try:
            for case in all_cases:
                sent.append(await drive(down, case))
                rid = f"hh{case.n:03d}x"
                healthy[rid] = await drive_healthy(down, rid)
        finally:
            async with asyncio.timeout(STEP):
                await down.aclose()
        assert db.spool.exists()
        # Back: the sink replays its spool (by itself on start; replay_spool() for operators).
        async with asyncio.timeout(STEP), SqlSink(db.url, schema=db.schema, spool_path=db.spool) as up:
            await up.replay_spool()
        figures = await check(db, sent, healthy)
    report(
        "hostile matrix",
        db=kind,
        mode="spool+replay",
        cases=len(all_cases),
        events_sent=sum(s.events for s in sent) + sum(healthy.values()),
        **figures,
    )
