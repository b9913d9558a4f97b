"""A response snapshot that JSON cannot hold, even by the fallback that writes bytes as base64 and
unknown objects as their repr: nested past pydantic's depth limit, a cycle, an object whose
``__repr__`` raises. The guard keeps each lifecycle event's snapshot as JSON (for a terminal it may
have to write in the stream's place); before, that fallback raised into the guard, which ended the
stream with its own error: the client lost the rest of the stream and the record said ``failed``
where the stream had completed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.store import ResponseStore

from .conftest import Target
from .helpers import aiter_of, created, delta, terminal


def _deep(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def _cycle() -> dict[str, Any]:
    cyclic: dict[str, Any] = {"name": "loop"}
    cyclic["self"] = cyclic
    return cyclic


class NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr() is not for this object")


VALUES = {"nested 300 deep": lambda: _deep(300), "a cycle": _cycle, "a repr() that raises": NoRepr}


@pytest.mark.parametrize("where", ["response.created", "response.completed"])
@pytest.mark.parametrize("value", list(VALUES))
async def test_a_snapshot_json_cannot_hold_is_kept_without_that_value_and_the_stream_completes(
    target: Target, value: str, where: str
) -> None:
    rid = f"resp_odd_snapshot_{len(value)}_{len(where)}"
    first, last = created(rid), terminal(rid, "completed")
    (first if where == "response.created" else last)["response"]["metadata"] = {"odd": VALUES[value]()}
    events = [first, delta(0), delta(1), last]
    sink = SqlSink(target.url, schema=target.schema, spool_path=target.spool)
    await sink.start()
    seen: list[Any] = []
    try:
        async with asyncio.timeout(30):
            g = guard(aiter_of(events), asyncio.Event(), sink=sink)
            async with g:
                async for ev in g:
                    seen.append(ev)
    finally:
        await sink.aclose()
    assert [ev["type"] for ev in seen] == [ev["type"] for ev in events]
    async with ResponseStore(target.url, schema=target.schema) as store, asyncio.timeout(30):
        record = await store.get(rid)
        history = await store.history(rid)
        noted = await store.anomalies(response_id=rid, kind="not_serialisable")
    assert record is not None and history is not None
    assert (record.status, record.cause, record.event_count) == ("completed", "normal", 4)
    assert sum(len(a.events) for a in history.attempts) == 4
    # The guard says what it did with the snapshot it keeps: the value left out, or (an object that
    # cannot say itself) kept as a stand-in naming its type.
    said = [a.reason for a in noted.items if a.event_type == where and "ResponseSnapshot" in a.reason]
    assert len(said) == 1, [a.reason for a in noted.items]
    if value == "a repr() that raises":
        assert said[0].startswith(f"{where}: ResponseSnapshot holds values JSON cannot take"), said
    else:
        assert said[0].startswith(f"{where}: ResponseSnapshot could not be read as JSON ("), said
        assert said[0].endswith("): stored without 'metadata'"), said


def test_a_model_read_field_by_field_keeps_its_own_exclusions_and_serialisers() -> None:
    """When even the fallback cannot read a model, it is read field by field through its own dump:
    a field it excludes stays out, and a field serialiser (a redacting one) still applies. A first
    version read each value raw and stored the excluded secret."""
    from pydantic import BaseModel, ConfigDict, Field, field_serializer

    from eventguard.events import json_of_model

    cyclic: list[Any] = []
    cyclic.append(cyclic)

    class Model(BaseModel):
        model_config = ConfigDict(extra="allow")
        secret: str = Field("hunter2", exclude=True)
        token: str = "abc"
        loop: list[Any] = cyclic
        count: int = 1

        @field_serializer("token")
        def _mask(self, _value: str) -> str:
            return "***"

    dumped, why = json_of_model(Model(more={"x": 1}))
    assert dumped == {"token": "***", "count": 1, "more": {"x": 1}}
    assert why is not None and why.endswith("stored without 'loop'")
