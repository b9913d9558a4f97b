"""``eventguard.verify.verify``: the report the ``verify`` command prints, from Python."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from eventguard.store import ResponseStore
from eventguard.verify import Disagreement, VerifyReport, verify


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
