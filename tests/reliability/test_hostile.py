"""Hostile input and secrets: fuzzed events through guard + SqlSink, SQL metacharacters, redaction,
passwords in database URLs."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventguard import SqlSink, guard
from eventguard.errors import EventGuardError, InvalidQueryError
from eventguard.store import ResponseStore

from ._common import SLOW, report

STEP = 30.0
TYPES = [
    "response.created",
    "response.in_progress",
    "response.queued",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "response.output_text.delta",
    "response.output_item.done",
    "",
    "x" * 300,
]


class Opaque:
    """An object the guard does not know (like the host's ResponseCheckpointEvent)."""

    __slots__ = ()


def deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"n": value}
    return value


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4),
        st.sets(st.integers(), max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=20,
)
types = st.one_of(
    st.sampled_from(TYPES), st.text(max_size=30), st.none(), st.integers(), st.lists(st.integers())
)
response_field = st.one_of(
    values,
    st.fixed_dictionaries(
        {
            "id": st.one_of(st.text(max_size=40), st.integers(), st.none()),
            "status": st.one_of(st.text(max_size=12), st.none()),
        },
        optional={"error": values, "usage": values, "created_at": values},
    ),
)
events = st.one_of(
    st.fixed_dictionaries(
        {"type": types}, optional={"response": response_field, "delta": values, "x": values}
    ),
    st.builds(lambda d: {"type": "response.output_text.delta", "delta": deep(d)}, st.integers(1, 600)),
    st.builds(lambda n: {"type": "response.output_text.delta", "delta": "y" * n}, st.integers(0, 2_000_000)),
    scalars,
    st.lists(scalars, max_size=3),
    st.just(Opaque()),
)

FUZZ = {"streams": 0, "events": 0}
_DIR = Path(__import__("tempfile").mkdtemp(prefix="eg-hostile-"))
_URL = f"sqlite+aiosqlite:///{_DIR / 'hostile.db'}"


async def feed(items: list[Any]) -> AsyncIterator[Any]:
    for item in items:
        await asyncio.sleep(0)
        yield item


async def fuzz_once(items: list[Any], strict: bool) -> None:
    async with asyncio.timeout(STEP):
        async with SqlSink(_URL, spool_path=_DIR / "spool.jsonl", max_payload_bytes=64 * 1024) as sink:
            out: list[Any] = []
            try:
                async with guard(feed(items), asyncio.Event(), sink=sink, strict=strict) as g:
                    async for ev in g:
                        out.append(ev)
            except EventGuardError:
                assert strict, "a typed error without strict=True"
            assert g.lifecycle.ended  # a strict typed error ends it too
            assert g.inner_closed == 1
            for ev in out:
                if isinstance(ev, dict):
                    assert isinstance(ev.get("type"), str) and ev["type"], ev
                else:
                    assert isinstance(ev, Opaque), type(ev)  # unknown objects pass through untouched
            terminals = [e for e in out if isinstance(e, dict) and e["type"] in TERMINAL_TYPES]
            assert len(terminals) <= 1
            if terminals:
                assert out[-1] is terminals[0]
        assert not sink.spool.pending(), "a fuzzed event made the database refuse a batch"
    FUZZ["streams"] += 1
    FUZZ["events"] += len(items)


TERMINAL_TYPES = {"response.completed", "response.failed", "response.incomplete"}


@settings(
    max_examples=600 if SLOW else 120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(items=st.lists(events, max_size=12), strict=st.booleans())
# Found by CI: bytes that are not UTF-8 in a snapshot killed the guard (pydantic's JSON dump).
@example(items=[{"type": "response.created", "response": {"": b"\x80"}}], strict=False)
def test_fuzzed_events_never_break_the_guard_or_the_sink(items: list[Any], strict: bool) -> None:
    asyncio.run(fuzz_once(items, strict))


def test_zz_fuzz_figures() -> None:
    report("hostile_fuzz", **FUZZ)


METACHARACTERS = [
    "x'; DROP TABLE eventguard_responses; --",
    'resp"); DELETE FROM eventguard_events; --',
    "resp%_*?\\' OR '1'='1",
    "résp-ünï-çødé-🙂",
    "resp\nnewline\ttab",
    "a" * 255,
]


def script(rid: str, secret: str = "") -> list[dict[str, Any]]:
    return [
        {"type": "response.created", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.in_progress", "response": {"id": rid, "status": "in_progress"}},
        {"type": "response.output_item.added", "item": {"type": "function_call", "arguments": secret}},
        {"type": "response.output_text.delta", "delta": "hello"},
        {
            "type": "response.completed",
            "response": {"id": rid, "status": "completed", "instructions": secret},
        },
    ]


async def test_sql_metacharacters_in_ids_and_store_arguments(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'meta.db'}"
    async with asyncio.timeout(STEP):
        async with SqlSink(url, spool_path=tmp_path / "spool") as sink:
            for rid in METACHARACTERS:
                async with guard(feed(script(rid)), asyncio.Event(), sink=sink) as g:
                    _ = [e async for e in g]
        async with ResponseStore(url) as store:
            for rid in METACHARACTERS:
                row = await store.get(rid)
                assert row is not None and row.response_id == rid and row.status == "completed"
                hist = await store.history(rid)
                assert hist is not None and len(hist.attempts[0].events) == 5
            for hostile in ("' OR '1'='1", "%", "_", "*", "resp%"):
                assert await store.get(hostile) is None
                assert (await store.anomalies(response_id=hostile)).items == []
                assert (await store.anomalies(kind=hostile)).items == []
                with pytest.raises(InvalidQueryError):
                    await store.terminal_states(status=hostile)
            assert len((await store.terminal_states(limit=100)).items) == len(METACHARACTERS)
    conn = sqlite3.connect(tmp_path / "meta.db")
    try:
        assert conn.execute("SELECT count(*) FROM eventguard_responses").fetchone()[0] == len(METACHARACTERS)
        assert conn.execute("SELECT count(*) FROM eventguard_events").fetchone()[0] == 5 * len(METACHARACTERS)
    finally:
        conn.close()
    report("sql_metacharacters", ids=len(METACHARACTERS), store_args=5 * 4)


SECRET = "sk-live-SUPERSECRET-0123456789"


def mask(event_type: str | None, event: Any) -> Any:
    """A redactor: masks the function-call arguments and the instructions, never mutates its input."""
    if not isinstance(event, dict):
        return event
    out = dict(event)
    if isinstance(out.get("item"), dict):
        out["item"] = {**out["item"], "arguments": "***"}
    if isinstance(out.get("response"), dict) and "instructions" in out["response"]:
        out["response"] = {**out["response"], "instructions": "***"}
    return out


async def _redacted_run(tmp_path: Path, items: list[Any], outage: bool) -> tuple[Path, Path]:
    db = tmp_path / ("redact-outage.db" if outage else "redact.db")
    spool = db.with_name(db.name + ".spool.jsonl")
    async with asyncio.timeout(STEP):
        async with SqlSink(f"sqlite+aiosqlite:///{db}", spool_path=spool, redact=mask) as sink:
            if outage:
                # The database is away: all goes to the spool.
                sink.writer.outage.retry_at = time.monotonic() + 3600
            async with guard(feed(items), asyncio.Event(), sink=sink) as g:
                _ = [e async for e in g]
    return db, spool


def _contains(path: Path, needle: str) -> bool:
    if not path.exists():
        return False
    data = path.read_bytes()
    for extra in (path.with_name(path.name + "-wal"),):
        if extra.exists():
            data += extra.read_bytes()
    return needle.encode() in data


async def test_redactor_keeps_masked_values_out_of_db_and_spool(tmp_path: Path) -> None:
    items = script("resp_redact", SECRET)
    db, _ = await _redacted_run(tmp_path, items, outage=False)
    assert not _contains(db, SECRET)
    _, spool = await _redacted_run(tmp_path, script("resp_redact2", SECRET), outage=True)
    assert spool.exists()
    assert not _contains(spool, SECRET)


# Anomaly payloads (an event after the terminal) go through the Redactor too (fixed in 9dc5379).
async def test_redactor_covers_anomaly_payloads(tmp_path: Path) -> None:
    items = [*script("resp_redact3"), {"type": "response.output_item.added", "item": {"arguments": SECRET}}]
    db, _ = await _redacted_run(tmp_path, items, outage=False)
    assert not _contains(db, SECRET)


@pytest.mark.parametrize("bad", [0, 1.5, True, (1, 2)])
async def test_non_str_type_is_not_forwarded(bad: Any) -> None:
    async with asyncio.timeout(STEP):
        async with guard(feed([{"type": bad}]), asyncio.Event()) as g:
            out = [e async for e in g]
    assert all(isinstance(e.get("type"), str) for e in out)


async def test_strict_error_ends_the_lifecycle() -> None:
    async with asyncio.timeout(STEP):
        g = guard(feed([{"type": None}]), asyncio.Event(), strict=True)
        with pytest.raises(EventGuardError):
            async with g:
                _ = [e async for e in g]
    assert g.lifecycle.ended


PASSWORD = "pa55-W0RD-never-shown"


async def test_password_never_in_logs_or_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"postgresql+asyncpg://eventguard:{PASSWORD}@127.0.0.1:1/nowhere"
    sink = SqlSink(url, spool_path=tmp_path / "spool.jsonl", connect_timeout=2)
    texts = [repr(sink)]
    async with asyncio.timeout(STEP):
        try:
            await sink.start()
        except Exception as exc:
            texts += [str(exc), repr(exc)]
        # Without start(): the writer logs the outage once and spools.
        async with guard(feed(script("resp_pw")), asyncio.Event(), sink=sink) as g:
            _ = [e async for e in g]
        await sink.aclose()
        store = ResponseStore(url)
        texts.append(repr(store))
        try:
            await store.get("x")
        except Exception as exc:
            texts += [str(exc), repr(exc)]
        await store.aclose()
    assert sink.spool.pending()
    texts += [r.getMessage() for r in caplog.records]
    texts += [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
    texts.append(str(sink.stats.last_error))
    leaks = [t for t in texts if PASSWORD in t]
    exe = Path(sys.executable).with_name("eventguard")
    cli_runs = 0
    if exe.exists():
        for args in (["list"], ["show", "x"], ["recover", "--older-than", "1h"], ["db", "upgrade"]):
            out = await asyncio.to_thread(
                subprocess.run,
                [str(exe), *args, "--database-url", url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            cli_runs += 1
            if PASSWORD in out.stdout + out.stderr:
                leaks.append(f"eventguard {' '.join(args)}: {out.stdout}{out.stderr}")
    report("secrets", texts_checked=len(texts), cli_commands=cli_runs, leaks=len(leaks))
    assert not leaks, leaks
