"""``eventguard prune``, ``eventguard recover`` and ``eventguard spool replay``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from eventguard import Lifecycle, ResponseInfo, State
from eventguard.sink import SqlSink

from .conftest import STEP, Cli, record


def test_prune_keeps_summaries(filled: str) -> None:
    cli = Cli(filled)
    nothing = json.loads(cli("prune", "--older-than", "1d", "--json").stdout)
    assert nothing == {
        "responses": 0,
        "events": 0,
        "transitions": 0,
        "anomalies": 0,
        "response_store": {"envelopes": 0, "items": 0, "history_nodes": 0},
        "agent_sessions": 0,
    }
    result = cli("prune", "--older-than", "0s")
    assert result.exit_code == 0, result.output
    assert "0 response rows" in result.stdout and "transitions" in result.stdout
    assert len(json.loads(cli("responses", "list", "--json").stdout)) == 3
    verify = cli("verify")
    assert verify.exit_code == 0, verify.output
    assert "3 without history" in verify.stdout


def test_prune_drop_summary(filled: str) -> None:
    cli = Cli(filled)
    data = json.loads(cli("prune", "--older-than", "0s", "--drop-summary", "--json").stdout)
    assert data["responses"] == 3
    assert json.loads(cli("responses", "list", "--json").stdout) == []


async def leave_running(url: str, response_id: str) -> None:
    """A writer that recorded in_progress and then vanished (a crashed replica)."""
    async with asyncio.timeout(STEP):
        sink = SqlSink(url, spool_path=Path("spool.jsonl"))
        await sink.start()
        lc = Lifecycle(info=ResponseInfo(response_id=response_id))
        rec = sink.recorder(lc)
        lc.transition(State.IN_PROGRESS, reason="response.created")
        rec.changed()
        await sink.flush()
        await sink.aclose()


def test_recover(filled: str) -> None:
    asyncio.run(leave_running(filled, "resp_orphan"))
    cli = Cli(filled)
    running = json.loads(cli("responses", "list", "--status", "in_progress", "--json").stdout)
    assert [r["response_id"] for r in running] == ["resp_orphan"]
    assert json.loads(cli("recover", "--older-than", "1h", "--json").stdout)["marked"] == []
    result = cli("recover", "--older-than", "0s", "--policy", "failed")
    assert result.exit_code == 0, result.output
    assert "marked 1 response(s) failed" in result.stdout and "resp_orphan" in result.stdout
    (row,) = json.loads(cli("responses", "list", "--status", "failed", "--json").stdout)[:1]
    assert row["response_id"] == "resp_orphan" and row["cause"] == "recover_policy"
    verify = cli("verify")
    assert verify.exit_code == 0, verify.output  # the recover mark replays as a legal transition


def test_spool_replay(db_url: str, tmp_path: Path) -> None:
    cli = Cli(db_url)
    # The sink is started against a database it may not migrate: everything goes to the spool.
    (tmp_path / "cli.db").touch()
    asyncio.run(spool_only(db_url))
    spool = tmp_path / "spool.jsonl"
    assert spool.exists()
    assert cli("db", "upgrade").exit_code == 0
    result = cli("spool", "replay", "--spool", str(spool), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["files"] == 1 and data["events"] >= 3
    assert not spool.exists()
    assert [r["status"] for r in json.loads(cli("responses", "list", "--json").stdout)] == ["completed"]
    again = cli("spool", "replay", "--spool", str(spool))
    assert again.exit_code == 0 and "nothing to replay" in again.stdout


async def spool_only(url: str) -> None:
    async with asyncio.timeout(STEP):
        sink = SqlSink(url, spool_path=Path("spool.jsonl"), auto_migrate=False)
        from eventguard import guard

        from .conftest import Ctx, script

        async def stream():  # type: ignore[no-untyped-def]
            for e in script("resp_spooled", "completed"):
                yield e

        async with guard(stream(), asyncio.Event(), context=Ctx(), sink=sink, cancel_grace=None) as g:
            async for _ in g:
                pass
        await sink.aclose()


def test_record_helper_is_idempotent_per_database(db_url: str) -> None:
    asyncio.run(record(db_url, [("resp_a", "completed")]))
    asyncio.run(record(db_url, [("resp_b", "failed")]))
    assert len(json.loads(Cli(db_url)("responses", "list", "--json").stdout)) == 2


def test_spool_replay_reports_an_unreadable_entry_as_quarantined(db_url: str, tmp_path: Path) -> None:
    cli = Cli(db_url)
    (tmp_path / "cli.db").touch()
    asyncio.run(spool_only(db_url))
    spool = tmp_path / "spool.jsonl"
    with spool.open("ab") as fh:
        fh.write(b'EG1 99 00000000 {"torn')  # a write a crash cut short
    assert cli("db", "upgrade").exit_code == 0
    result = cli("spool", "replay", "--spool", str(spool))
    assert result.exit_code == 0, result.output
    assert "1 spool entry unreadable" in result.stdout
    assert "1 quarantined (unreadable entries" in result.stdout
    assert "record" not in result.stdout  # a spool line is an entry (docs/design.md's vocabulary)
    assert [r["status"] for r in json.loads(cli("responses", "list", "--json").stdout)] == ["completed"]
