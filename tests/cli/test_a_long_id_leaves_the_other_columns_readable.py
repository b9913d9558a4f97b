"""``responses list`` keeps an id unwrapped so it can be copied whole, but not one wider than half
the console: a 250-character id (stored as it is, under the column's 255) squeezed every other
column to nothing, for every row, at any width (no status, no cause, no header to read)."""

from __future__ import annotations

import asyncio
import json

import pytest

from .conftest import Cli, record

LONG = "resp_" + "x" * 245


@pytest.mark.parametrize("columns", ["100", "160", "300"])
def test_a_long_id_leaves_every_rows_status_readable(
    cli: Cli, db_url: str, columns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(record(db_url, [("resp_short", "completed"), (LONG, "failed")]))
    monkeypatch.setenv("COLUMNS", columns)
    result = cli("responses", "list")
    assert result.exit_code == 0, result.output
    assert "status" in result.stdout and "events" in result.stdout
    assert "completed" in result.stdout and "failed" in result.stdout
    listed = json.loads(cli("responses", "list", "--json").stdout)
    assert LONG in [r["response_id"] for r in listed]  # whole, where it is to be copied from
