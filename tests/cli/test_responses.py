"""``eventguard responses list | show``."""

from __future__ import annotations

import json

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
