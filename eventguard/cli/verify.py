"""``eventguard verify``: print what :func:`eventguard.verify.verify` found; exit 1 on a disagreement."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from eventguard.cli._common import (
    EXIT_FOUND,
    DatabaseUrl,
    Json,
    Schema,
    emit_json,
    out,
    progress,
    quoted,
    say,
    store_command,
    table,
)
from eventguard.store import ResponseStore
from eventguard.verify import VerifyReport, verify


def command(
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
    limit: Annotated[int, typer.Option("--show", min=1, help="Print at most this many disagreements.")] = 100,
) -> None:
    """Re-check every stored history against the state machine, and that every stored agent session
    reads back; exit 1 if any disagrees."""
    with progress("verifying stored histories", quiet=json) as bar:

        async def work(store: ResponseStore) -> VerifyReport:
            total = await store.count()
            bar.update(0, total)
            return await verify(store, progress=bar.update)

        report = store_command(database_url, work, schema)
    if json:
        emit_json(
            {
                "checked": report.checked,
                "without_history": report.without_history,
                "disagreements": [asdict(d) for d in report.disagreements],
                "agent_sessions": report.agent_sessions,
                "bad_agent_sessions": [asdict(b) for b in report.bad_agent_sessions],
                "ok": report.ok,
            }
        )
    else:
        _print(report, limit)
    if not report.ok:
        raise typer.Exit(EXIT_FOUND)


def _print(report: VerifyReport, limit: int) -> None:
    note = f" ({report.without_history} without history: pruned)" if report.without_history else ""
    if not report.disagreements:
        say(f"checked {report.checked} responses{note}: no disagreement")
    else:
        rows = [[d.response_id, d.attempt or "", d.problem] for d in report.disagreements[:limit]]
        out.print(table("disagreements", ["response", "attempt", "problem"], rows))
        say(f"checked {report.checked} responses{note}: {report.disagreeing} disagree")
    bad = report.bad_agent_sessions
    if not bad:
        if report.agent_sessions:  # (none stored: the host keeps its sessions elsewhere; nothing to say)
            say(f"checked {report.agent_sessions} agent sessions: all read back")
        return
    # A session id is unbounded (a megabyte is storable): shown cut, as an error quotes an argument.
    rows = [[quoted(b.session_id), b.partition[:12], b.problem] for b in bad[:limit]]
    out.print(table("agent sessions that do not read back", ["session", "partition", "problem"], rows))
    say(f"checked {report.agent_sessions} agent sessions: {len(bad)} do not read back")
