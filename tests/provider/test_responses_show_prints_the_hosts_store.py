"""``eventguard responses show`` prints the envelope, input items and output items the host's SQL
response store serves, beside the recorded history; ``eventguard prune`` expires that store too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from eventguard import SqlResponseProvider, SqlSink, guard
from eventguard.cli import app
from eventguard.testing import Scripted, stream_events

from .test_parity_with_the_hosts_store import envelope, item, out


async def _fill(url: str, spool: Path) -> None:
    async with asyncio.timeout(60):
        events = [
            {**e, "response": {**e["response"], "id": "resp_show"}} if "response" in e else e
            for e in stream_events(2, "completed")
        ]
        async with (
            SqlSink(url, spool_path=spool) as sink,
            guard(Scripted(events), asyncio.Event(), sink=sink) as g,
        ):
            async for _ in g:
                pass
        provider = SqlResponseProvider(url)
        await provider.create_response(envelope("resp_show"), [item("in_1", "what is \x1b[31mred")], None)
        await provider.update_response(
            envelope("resp_show", status="completed", output=[out("out_1", "an answer")])
        )
        await provider.aclose()


def test_show_prints_the_envelope_and_its_items_escaped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'show.db'}"
    asyncio.run(_fill(url, tmp_path / "spool.jsonl"))
    runner = CliRunner()
    shown = runner.invoke(
        app, ["responses", "show", "resp_show", "--database-url", url], catch_exceptions=False
    )
    assert shown.exit_code == 0, shown.output
    assert "host's store  completed" in shown.stdout
    assert "input  message user 'what is \\x1b[31mred'" in shown.stdout  # escaped, never an ANSI code
    assert "\x1b" not in shown.stdout
    assert "output message assistant 'an answer'" in shown.stdout
    as_json = json.loads(
        runner.invoke(app, ["responses", "show", "resp_show", "--json", "--database-url", url]).stdout
    )
    (stored,) = as_json["envelopes"]
    assert stored["envelope"]["status"] == "completed"
    assert [i["id"] for i in stored["input_items"]] == ["in_1"]
    assert [i["id"] for i in stored["output_items"]] == ["out_1"]
    pruned = runner.invoke(app, ["prune", "--older-than", "0s", "--json", "--database-url", url])
    assert json.loads(pruned.stdout)["response_store"] == {"envelopes": 1, "items": 2, "history_nodes": 0}
