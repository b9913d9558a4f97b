"""``eventguard.verify.verify``: the report the ``verify`` command prints, from Python."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from eventguard.errors import InvalidQueryError
from eventguard.store import ResponseStore
from eventguard.verify import Disagreement, VerifyReport, check_history, verify

from .conftest import RUNS, STEP, record


async def test_a_clean_store_verifies_with_no_disagreement(filled: str) -> None:
    async with ResponseStore(filled) as store:
        report = await verify(store, batch=2)  # pages of two: every response is still read once
    assert report == VerifyReport(checked=3, without_history=0, disagreements=())
    assert report.ok and report.disagreeing == 0


async def test_a_status_that_disagrees_is_reported_the_same_each_time(filled: str, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        conn.execute("UPDATE eventguard_responses SET status = 'completed' WHERE response_id = 'resp_cancel'")
    async with ResponseStore(filled) as store:
        report = await verify(store)
        again = await verify(store)
    assert not report.ok and report.disagreeing == 1
    assert report.disagreements == (
        Disagreement("resp_cancel", 1, "status is completed, the history ends cancelled"),
    )
    assert again == report
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.checked = 0  # type: ignore[misc]


async def test_verify_reads_a_page_of_responses_at_a_time_not_one_query_per_response(db_url: str) -> None:
    """Issue 14: 43 of 45 s of a 10,000-response verify were one history query per response."""
    runs = [(f"resp_{i:03d}", "completed" if i % 3 else "failed") for i in range(30)]
    await asyncio.wait_for(record(db_url, runs), STEP)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    async with ResponseStore(db_url) as store:
        event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
        checked: list[int] = []
        report = await asyncio.wait_for(verify(store, batch=10, progress=checked.append), STEP)
    assert report.ok and report.checked == 30
    # three pages of ten (rows, events, transitions, anomalies each) and the empty page that ends it
    # three pages of ten (rows, events, transitions, anomalies each), the empty page that ends them,
    # one (empty) page of the host's stored envelopes, and one (empty) page of its agent sessions
    assert len(statements) == 3 * 4 + 1 + 1 + 1, statements
    assert checked == [10, 20, 30, 30]


async def test_histories_are_each_responses_history_in_insertion_order(filled: str) -> None:
    async with ResponseStore(filled) as store:
        paged = [h async for h in store.histories(batch=2)]
        one_by_one = [await store.history(rid) for rid, _ in RUNS]
        assert await store.count() == len(RUNS)
    assert [h.response.response_id for h in paged] == [rid for rid, _ in RUNS]
    assert paged == one_by_one


@pytest.mark.parametrize("batch", [0, 501, True, "10"])
async def test_histories_refuses_a_page_size_it_cannot_read(filled: str, batch: Any) -> None:
    async with ResponseStore(filled) as store:
        with pytest.raises(InvalidQueryError, match="batch must be an integer from 1 to 500"):
            [h async for h in store.histories(batch=batch)]


async def test_verify_finds_what_check_history_finds_in_each_typed_history(
    filled: str, tmp_path: Path
) -> None:
    """verify checks the rows as read (issue 14's speed-up); check_history checks typed records.

    Every kind of damage at once, a second attempt included: both must report the same.
    """
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        conn.executescript(
            "UPDATE eventguard_responses SET status = 'completed' WHERE response_id = 'resp_cancel';"
            "UPDATE eventguard_transitions SET from_state = 'new' "
            "WHERE response_id = 'resp_done' AND to_state = 'completed';"
            # resp_boom: a terminal event that does not validate, and a second attempt that
            # stores an event after its terminal and a transition to an unknown state
            'UPDATE eventguard_events SET payload = \'{"type": "response.failed"}\' '
            "WHERE response_id = 'resp_boom' AND type = 'response.failed';"
            "INSERT INTO eventguard_events (response_id, attempt, seq, type, payload, recorded_at) "
            "SELECT response_id, 2, seq, type, payload, recorded_at FROM eventguard_events "
            "WHERE response_id = 'resp_boom';"
            "INSERT INTO eventguard_events (response_id, attempt, seq, type, payload, recorded_at) "
            "SELECT response_id, 2, 9, 'response.output_text.delta', '{}', recorded_at "
            "FROM eventguard_events WHERE response_id = 'resp_boom' AND seq = 0 AND attempt = 2;"
            "INSERT INTO eventguard_transitions "
            "(response_id, attempt, idx, from_state, to_state, cause, reason, at) "
            "SELECT response_id, 2, idx, from_state, "
            "CASE WHEN to_state = 'failed' THEN 'exploded' ELSE to_state END, cause, reason, at "
            "FROM eventguard_transitions WHERE response_id = 'resp_boom';"
        )
    async with ResponseStore(filled) as store:
        report = await asyncio.wait_for(verify(store, batch=2), STEP)
        typed = [d async for h in store.histories(batch=2) for d in check_history(h)]
    assert len({d.response_id for d in typed}) == 3 and len(typed) >= 5, typed
    assert list(report.disagreements) == typed
