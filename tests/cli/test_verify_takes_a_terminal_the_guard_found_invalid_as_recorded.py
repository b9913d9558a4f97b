"""``verify`` takes a terminal event the guard itself found invalid as the record says it was.

A host that sends ``response.completed`` with a usage that is not one (``input_tokens`` NaN, a
string, a usage that is not an object) is forwarded and recorded as it came, with the guard's
``invalid_lifecycle_event`` anomaly for that event (and ``unverified_completion``). ``verify`` then
validated the stored event, failed, and reported the history as disagreeing with itself, exit 1,
where record and events agree: the run ended on a terminal nobody could read, and the record says
so. Now such an event is no disagreement when the guard's anomaly names it; its type is still held
against the transitions, and an invalid terminal no anomaly names is still reported. Real SQLite and
PostgreSQL, recorded through the guard and the sink.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, update

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.sql.tables import anomalies, responses, transitions
from eventguard.store import ResponseStore
from eventguard.verify import VerifyReport
from tests._postgres import sqlite_or_postgres

from .verifying import alter, cli_verify, run, verified

#: Usages a host may send that do not validate (each its own response).
BAD_USAGES: dict[str, Any] = {
    "resp_nan": {"input_tokens": float("nan"), "output_tokens": 1, "total_tokens": 2},
    "resp_text": {"input_tokens": "three", "output_tokens": 1, "total_tokens": 2},
    "resp_not_an_object": "not a usage",
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    with sqlite_or_postgres(request.param, tmp_path, "eg_invalid") as target:
        yield target


class _Signal:
    def is_set(self) -> bool:
        return False


async def record(url: str, schema: str | None, usages: dict[str, Any]) -> None:
    sink = SqlSink(url, schema=schema, spool_path=Path("spool.jsonl"))
    await sink.start()
    try:
        for rid, usage in usages.items():

            async def stream(rid: str = rid, usage: Any = usage) -> AsyncIterator[Any]:
                started = {"id": rid, "object": "response", "status": "in_progress", "output": []}
                yield {"type": "response.created", "sequence_number": 0, "response": started}
                yield {"type": "response.in_progress", "sequence_number": 1, "response": started}
                ended = {"id": rid, "object": "response", "status": "completed", "output": [], "usage": usage}
                yield {"type": "response.completed", "sequence_number": 2, "response": ended}

            async with guard(stream(), _Signal(), sink=sink) as g:
                async for _ in g:
                    pass
    finally:
        await sink.aclose()


def test_a_terminal_the_guard_recorded_as_invalid_is_no_disagreement(
    database: tuple[str, str | None],
) -> None:
    url, schema = database
    run(record(url, schema, BAD_USAGES))

    async def kinds() -> dict[str, list[str]]:
        async with ResponseStore(url, schema=schema) as store:
            out = {}
            for rid in BAD_USAGES:
                h = await store.history(rid)
                assert h is not None and h.response.status == "completed"
                out[rid] = [a.kind for a in h.attempts[0].anomalies if a.source == "guard"]
            return out

    # what the guard records, so that this test reads what it writes
    assert all(k[:1] == ["invalid_lifecycle_event"] for k in run(kinds()).values())
    assert run(verified(url, schema)) == VerifyReport(checked=3, without_history=0, disagreements=())
    code, printed = cli_verify(url, schema)
    assert (code, printed["ok"], printed["disagreements"]) == (0, True, [])


def test_an_invalid_terminal_no_anomaly_names_or_the_transitions_contradict_is_still_reported(
    database: tuple[str, str | None],
) -> None:
    url, schema = database
    run(record(url, schema, {"resp_nan": BAD_USAGES["resp_nan"], "resp_text": BAD_USAGES["resp_text"]}))
    run(
        alter(
            url,
            schema,
            delete(anomalies).where(anomalies.c.response_id == "resp_text"),
            update(transitions)
            .where((transitions.c.response_id == "resp_nan") & (transitions.c.to_state == "completed"))
            .values(to_state="incomplete"),
            update(responses).where(responses.c.response_id == "resp_nan").values(status="incomplete"),
        )
    )
    problems = {(d.response_id, d.problem.split(":")[0]) for d in run(verified(url, schema)).disagreements}
    assert problems == {
        ("resp_text", "event #2 response.completed does not validate"),
        (
            "resp_nan",
            "the stored terminal event #2 response.completed (found invalid by the guard) says completed, "
            "the transitions end incomplete",
        ),
    }
