"""``verify`` takes a terminal event the sink stored cut (over ``max_payload_bytes``) as cut.

The sink stores such an event as its marker, ``{"_eventguard": {"truncated": true, ...}, "head":
...}``, with a ``payload_truncated`` anomaly (the README's "What the sink changes to store a value").
That payload cannot be validated, so it is no disagreement; what the event and its row still show
(its type against the transitions, its place, the row's status) is still checked; and a payload that
only looks like the marker is validated as an event, as before. Real SQLite and PostgreSQL, recorded
through the guard and the sink.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, update

from eventguard import guard
from eventguard.sink import SqlSink
from eventguard.sql.tables import anomalies, events, responses, transitions
from eventguard.store import ResponseStore
from eventguard.verify import Disagreement, VerifyReport
from tests._postgres import sqlite_or_postgres

from .verifying import alter, cli_verify, run, verified

#: Small, so that a 5,000-character answer is cut (the default, 1 MiB, cuts a 1 MB answer the same).
LIMIT = 4096
BIG = "x" * 5000


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    """(URL, schema): a SQLite file, or a fresh PostgreSQL schema (dropped after)."""
    with sqlite_or_postgres(request.param, tmp_path, "eg_cut") as target:
        yield target


def terminal(rid: str, etype: str, text: str) -> dict[str, Any]:
    status = {"response.completed": "completed", "response.incomplete": "incomplete"}.get(etype, "failed")
    content = [{"type": "output_text", "text": text, "annotations": []}]
    output = [{"type": "message", "id": "msg_1", "role": "assistant", "status": status, "content": content}]
    return {
        "type": etype,
        "sequence_number": 2,
        "response": {"id": rid, "object": "response", "status": status, "output": output},
    }


class _Signal:
    def is_set(self) -> bool:
        return False


async def record(url: str, schema: str | None, runs: list[tuple[str, str, str]]) -> None:
    """Guard each (response id, terminal type, answer) into the database: created, in_progress, then
    the terminal carrying the answer; a sink with ``max_payload_bytes=LIMIT``."""
    sink = SqlSink(url, schema=schema, spool_path=Path("spool.jsonl"), max_payload_bytes=LIMIT)
    await sink.start()
    try:
        for rid, etype, text in runs:

            async def stream(rid: str = rid, etype: str = etype, text: str = text) -> AsyncIterator[Any]:
                started = {"id": rid, "object": "response", "status": "in_progress", "output": []}
                yield {"type": "response.created", "sequence_number": 0, "response": started}
                yield {"type": "response.in_progress", "sequence_number": 1, "response": started}
                yield terminal(rid, etype, text)

            async with guard(stream(), _Signal(), sink=sink) as g:
                async for _ in g:
                    pass
    finally:
        await sink.aclose()


def cut_event(rid: str) -> Any:
    return (events.c.response_id == rid) & (events.c.seq == 2)


def test_a_terminal_the_sink_cut_is_no_disagreement_and_verify_exits_0(
    database: tuple[str, str | None],
) -> None:
    url, schema = database
    runs = [
        ("resp_done", "response.completed", BIG),
        ("resp_short", "response.incomplete", BIG),
        ("resp_boom", "response.failed", BIG),
    ]
    run(record(url, schema, runs))

    async def stored() -> list[tuple[Any, list[str]]]:
        async with ResponseStore(url, schema=schema) as store:
            out = []
            for rid, _, _ in runs:
                h = await store.history(rid)
                assert h is not None
                (attempt,) = h.attempts
                out.append((attempt.events[-1].payload, [a.kind for a in attempt.anomalies]))
            return out

    for (rid, etype, _), (payload, kinds) in zip(runs, run(stored()), strict=True):
        # what the sink documents, so that this test reads the marker it writes
        assert payload["_eventguard"] == {
            "truncated": True,
            "original_bytes": pytest.approx(5300, abs=300),
            "type": etype,
        }
        assert kinds == ["payload_truncated"], rid
    report = run(verified(url, schema))
    assert report == VerifyReport(checked=3, without_history=0, disagreements=())
    code, printed = cli_verify(url, schema)
    assert (code, printed["ok"], printed["disagreements"]) == (0, True, [])


#: (what is changed in the stored rows of resp_done, whose response.completed was cut; what verify says)
DISAGREEING: dict[str, tuple[list[Any], str]] = {
    "the row's status": (
        [update(responses).where(responses.c.response_id == "resp_done").values(status="failed")],
        "status is failed, the history ends completed",
    ),
    "the transitions against the terminal's type": (
        [
            update(transitions)
            .where((transitions.c.response_id == "resp_done") & (transitions.c.idx == 1))
            .values(to_state="incomplete"),
            update(responses).where(responses.c.response_id == "resp_done").values(status="incomplete"),
        ],
        "the stored terminal event #2 response.completed (stored cut) says completed, "
        "the transitions end incomplete",
    ),
    "an event after the terminal": (
        [
            insert(events).values(
                response_id="resp_done",
                attempt=1,
                seq=3,
                type="response.output_text.delta",
                payload={"type": "response.output_text.delta", "delta": "x"},
                recorded_at=datetime.now(UTC),
            )
        ],
        "event #3 response.output_text.delta was stored after the terminal (#2)",
    ),
    "no payload_truncated anomaly": (
        [delete(anomalies).where(anomalies.c.response_id == "resp_done")],
        "event #2 response.completed is stored cut, but no payload_truncated anomaly says so",
    ),
}


@pytest.mark.parametrize("change", list(DISAGREEING))
def test_a_cut_terminal_whose_row_disagrees_otherwise_is_still_reported(
    database: tuple[str, str | None], change: str
) -> None:
    url, schema = database
    run(record(url, schema, [("resp_done", "response.completed", BIG)]))
    statements, problem = DISAGREEING[change]
    run(alter(url, schema, *statements))
    report = run(verified(url, schema))
    assert report.disagreements == (Disagreement("resp_done", 1, problem),)
    code, printed = cli_verify(url, schema)
    assert code == 1 and [d["problem"] for d in printed["disagreements"]] == [problem]


def test_a_cut_response_failed_may_end_cancelled(database: tuple[str, str | None]) -> None:
    """A cancel travels as ``response.failed`` (its payload's status says which): cut, either fits."""
    url, schema = database
    run(record(url, schema, [("resp_boom", "response.failed", BIG)]))
    run(
        alter(
            url,
            schema,
            update(transitions)
            .where((transitions.c.response_id == "resp_boom") & (transitions.c.idx == 1))
            .values(to_state="cancelled"),
            update(responses).where(responses.c.response_id == "resp_boom").values(status="cancelled"),
        )
    )
    assert run(verified(url, schema)).disagreements == ()


def _marker(**note: Any) -> dict[str, Any]:
    return {
        "_eventguard": {"truncated": True, "original_bytes": 5264, "type": "response.completed", **note},
        "head": '{"type":"response.completed"',
    }


#: Stored payloads of resp_look's response.completed (which has its payload_truncated anomaly) that
#: are not the sink's marker: each is validated as an event, as before.
LOOKALIKES: dict[str, dict[str, Any]] = {
    "an extra key": {**_marker(), "type": "response.completed"},
    "no head": {"_eventguard": _marker()["_eventguard"]},
    "a head that is not text": {**_marker(), "head": None},
    "truncated false": _marker(truncated=False),
    "truncated 1": _marker(truncated=1),
    "original_bytes a string": _marker(original_bytes="5264"),
    "original_bytes a bool": _marker(original_bytes=True),
    "another event's type": _marker(type="response.failed"),
    "an extra note": _marker(by="user"),
    "a note that is not an object": {**_marker(), "_eventguard": "truncated"},
}


@pytest.mark.parametrize("lookalike", list(LOOKALIKES))
def test_a_payload_that_only_looks_cut_is_still_validated(
    database: tuple[str, str | None], lookalike: str
) -> None:
    url, schema = database
    run(
        record(
            url, schema, [("resp_cut", "response.completed", BIG), ("resp_look", "response.completed", BIG)]
        )
    )
    run(
        alter(url, schema, update(events).where(cut_event("resp_look")).values(payload=LOOKALIKES[lookalike]))
    )
    report = run(verified(url, schema))
    # resp_cut, really cut, is no disagreement next to it
    assert [(d.response_id, d.attempt) for d in report.disagreements] == [("resp_look", 1)]
    assert report.disagreements[0].problem.startswith("event #2 response.completed does not validate: ")


def test_a_users_event_with_an_eventguard_key_is_validated_as_an_event(
    database: tuple[str, str | None],
) -> None:
    """The user's own "_eventguard" key, in an event small enough to be stored whole: an event."""
    url, schema = database
    mine = {**terminal("resp_mine", "response.completed", "hi"), **_marker()}
    broken = {**mine, "response": "not an object"}
    run(
        record(
            url, schema, [("resp_cut", "response.completed", BIG), ("resp_mine", "response.completed", "hi")]
        )
    )
    run(alter(url, schema, update(events).where(cut_event("resp_mine")).values(payload=mine)))
    assert run(verified(url, schema)).disagreements == ()
    run(alter(url, schema, update(events).where(cut_event("resp_mine")).values(payload=broken)))
    (found,) = run(verified(url, schema)).disagreements
    assert found.response_id == "resp_mine"
    assert found.problem.startswith("event #2 response.completed does not validate: ")


def test_a_terminal_the_sink_stored_as_its_repr_is_no_disagreement_unless_unsaid(
    database: tuple[str, str | None],
) -> None:
    """A terminal JSON cannot hold (an integer past 64 bits in its usage) is stored as the sink's
    stand-in, with a ``not_serialisable`` anomaly: like a cut one, it was reported as "does not
    validate" (exit 1). Without its anomaly, the stand-in is still reported."""
    url, schema = database
    rid = "resp_huge_usage"

    async def recorded() -> None:
        async def stream() -> AsyncIterator[Any]:
            started = {"id": rid, "object": "response", "status": "in_progress", "output": []}
            yield {"type": "response.created", "sequence_number": 0, "response": started}
            yield {"type": "response.in_progress", "sequence_number": 1, "response": started}
            done = terminal(rid, "response.completed", "hi")
            done["response"]["usage"] = {"input_tokens": 2**70, "output_tokens": 1, "total_tokens": 2**70}
            yield done

        sink = SqlSink(url, schema=schema, spool_path=Path("spool.jsonl"))
        async with sink, guard(stream(), _Signal(), sink=sink) as g:
            async for _ in g:
                pass

    run(recorded())
    report = run(verified(url, schema))
    assert report.ok, report.disagreements
    assert cli_verify(url, schema)[0] == 0
    run(alter(url, schema, delete(anomalies).where(anomalies.c.response_id == rid)))
    (disagreement,) = run(verified(url, schema)).disagreements
    assert "is stored as its repr, but no not_serialisable anomaly says so" in disagreement.problem
