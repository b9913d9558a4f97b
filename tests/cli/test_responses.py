"""``eventguard responses list | show``."""

from __future__ import annotations

import json
import sqlite3

from .conftest import Cli


def test_list_json(filled: str) -> None:
    result = Cli(filled)("responses", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["response_id"] for r in rows] == ["resp_cancel", "resp_boom", "resp_done"]  # newest first
    assert {r["response_id"]: r["status"] for r in rows} == {
        "resp_done": "completed",
        "resp_boom": "failed",
        "resp_cancel": "cancelled",
    }


def test_list_filters(filled: str) -> None:
    cli = Cli(filled)
    cancelled = json.loads(cli("responses", "list", "--status", "cancelled", "--json").stdout)
    assert [(r["response_id"], r["cause"]) for r in cancelled] == [("resp_cancel", "client_cancel")]
    assert json.loads(cli("responses", "list", "--limit", "1", "--json").stdout)[0]["response_id"] == (
        "resp_cancel"
    )
    assert len(json.loads(cli("responses", "list", "--since", "1h", "--json").stdout)) == 3
    assert json.loads(cli("responses", "list", "--since", "2999-01-01T00:00", "--json").stdout) == []
    assert json.loads(cli("responses", "list", "--status", "in_progress", "--json").stdout) == []


def test_list_table(filled: str) -> None:
    result = Cli(filled)("responses", "list")
    assert result.exit_code == 0, result.output
    for text in ("resp_done", "resp_boom", "resp_cancel", "client_cancel", "completed"):
        assert text in result.stdout
    empty = Cli(filled)("responses", "list", "--status", "queued")
    assert empty.stdout.strip() == "no responses with status queued"


def test_show_timeline(filled: str) -> None:
    result = Cli(filled)("responses", "show", "resp_cancel")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "resp_cancel" in out and "cancelled" in out and "cause=client_cancel" in out
    assert "new -> in_progress" in out and "in_progress -> cancelled" in out
    assert "response.output_text.delta" in out and "2-3" in out  # two deltas, summarised as one run
    assert "terminal_withheld" in out  # the lie, as an anomaly: response.completed was not forwarded


def test_show_json(filled: str) -> None:
    result = Cli(filled)("responses", "show", "resp_done", "--json")
    history = json.loads(result.stdout)
    assert history["response"]["status"] == "completed"
    (attempt,) = history["attempts"]
    assert [t["to_state"] for t in attempt["transitions"]] == ["in_progress", "completed"]
    assert attempt["events"][-1]["type"] == "response.completed"
    assert attempt["anomalies"] == []


def _sql(db_url: str, *statements: str) -> None:
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
        for statement in statements:
            conn.execute(statement)


def test_show_after_recover_times_every_transition_from_the_earliest(filled: str) -> None:
    """Issue 14: recover's mark is listed first (numbered below zero) and offsets went negative."""
    _sql(
        filled,
        "DELETE FROM eventguard_transitions WHERE response_id = 'resp_done' AND to_state = 'completed'",
        "UPDATE eventguard_responses SET status = 'in_progress', cause = NULL, finished_at = NULL, "
        "updated_at = '2000-01-01 00:00:00.000000' WHERE response_id = 'resp_done'",
    )
    cli = Cli(filled)
    assert json.loads(cli("recover", "--older-than", "1h", "--json").stdout)["marked"] == ["resp_done"]
    shown = cli("responses", "show", "resp_done")
    assert shown.exit_code == 0, shown.output
    assert "+-" not in shown.stdout and "in_progress -> interrupted" in shown.stdout
    assert "+0 ms" in shown.stdout


def test_show_after_prune_says_the_history_was_pruned(filled: str) -> None:
    cli = Cli(filled)
    _sql(filled, "UPDATE eventguard_responses SET finished_at = '2000-01-01 00:00:00.000000'")
    assert cli("prune", "--older-than", "1d").exit_code == 0
    shown = cli("responses", "show", "resp_done")
    assert shown.exit_code == 0, shown.output
    assert "pruned: only this summary row is kept" in shown.stdout
    assert "transitions" not in shown.stdout and "no anomalies" not in shown.stdout


def test_show_counts_the_events_stored_when_the_rows_count_lags(filled: str) -> None:
    """Issue 14: ``events 3`` for a response in progress with 7 stored (the row counts at flushes)."""
    _sql(filled, "UPDATE eventguard_responses SET event_count = 3 WHERE response_id = 'resp_done'")
    shown = Cli(filled)("responses", "show", "resp_done")
    assert shown.exit_code == 0, shown.output
    stored = shown.stdout.split("events", 1)[1].split("\n", 1)[0].strip()
    assert stored == "5 stored (the row says 3)", shown.stdout
