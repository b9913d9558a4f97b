"""``eventguard stats`` and ``eventguard verify``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from .conftest import Cli


def test_stats(filled: str) -> None:
    cli = Cli(filled)
    data = json.loads(cli("stats", "--json").stdout)
    assert data["total"] == 3
    assert data["by_status"] == {"completed": 1, "failed": 1, "cancelled": 1}
    assert data["by_cause"] == {"normal": 1, "error": 1, "client_cancel": 1}
    assert data["duration_ms_p50"] is not None
    human = cli("stats", "--since", "1d")
    assert human.exit_code == 0, human.output
    assert (
        "3 responses since 1d" in human.stdout and "client_cancel" in human.stdout and "p99" in human.stdout
    )


def test_verify_clean(filled: str) -> None:
    result = Cli(filled)("verify")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "checked 3 responses: no disagreement"
    data = json.loads(Cli(filled)("verify", "--json").stdout)
    assert data == {
        "checked": 3,
        "without_history": 0,
        "disagreements": [],
        "agent_sessions": 0,
        "bad_agent_sessions": [],
        "ok": True,
    }


def sql(tmp_path: Path, statement: str) -> None:
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        conn.execute(statement)


def test_verify_finds_a_status_that_disagrees(filled: str, tmp_path: Path) -> None:
    # What an unguarded writer would have stored: the cancelled run as completed.
    sql(tmp_path, "UPDATE eventguard_responses SET status = 'completed' WHERE response_id = 'resp_cancel'")
    result = Cli(filled)("verify", "--json")
    assert result.exit_code == 1
    (found,) = json.loads(result.stdout)["disagreements"]
    assert found["response_id"] == "resp_cancel"
    assert found["problem"] == "status is completed, the history ends cancelled"
    human = Cli(filled)("verify")
    assert human.exit_code == 1 and "1 disagree" in human.stdout


def test_verify_finds_an_illegal_transition_and_a_terminal_event_that_disagrees(
    filled: str, tmp_path: Path
) -> None:
    sql(
        tmp_path,
        "UPDATE eventguard_transitions SET from_state = 'new' "
        "WHERE response_id = 'resp_done' AND to_state = 'completed'",
    )
    sql(
        tmp_path,
        "UPDATE eventguard_transitions SET to_state = 'failed' "
        "WHERE response_id = 'resp_boom' AND to_state = 'failed'",
    )
    sql(tmp_path, "DELETE FROM eventguard_transitions WHERE response_id = 'resp_boom' AND idx = 0")
    problems = {
        (d["response_id"], d["problem"])
        for d in json.loads(Cli(filled)("verify", "--json").stdout)["disagreements"]
    }
    assert ("resp_done", "transition #1 starts at new, but the history was at in_progress") in problems
    assert any(rid == "resp_done" and "new -> completed" in p for rid, p in problems)
    assert ("resp_boom", "transition #0 is missing (next stored is #1)") in problems


def test_verify_event_status_disagreement(filled: str, tmp_path: Path) -> None:
    sql(
        tmp_path,
        "UPDATE eventguard_events SET type = 'response.completed', "
        'payload = \'{"type":"response.completed","response":{"id":"resp_boom","status":"completed"}}\' '
        "WHERE response_id = 'resp_boom' AND type = 'response.failed'",
    )
    data = json.loads(Cli(filled)("verify", "--json").stdout)
    assert [d["problem"] for d in data["disagreements"]] == [
        "the stored terminal event #2 says completed, the transitions end failed"
    ]
