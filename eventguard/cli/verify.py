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
    """Re-check every stored history against the state machine; exit 1 if any disagrees."""
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
                "ok": report.ok,
            }
        )
    else:
        _print(report, limit)
    if not report.ok:
        raise typer.Exit(EXIT_FOUND)


def _print(report: VerifyReport, limit: int) -> None:
    note = f" ({report.without_history} without history: pruned)" if report.without_history else ""
    if report.ok:
        say(f"checked {report.checked} responses{note}: no disagreement")
        return
    rows = [[d.response_id, d.attempt or "", d.problem] for d in report.disagreements[:limit]]
    out.print(table("disagreements", ["response", "attempt", "problem"], rows))
    say(f"checked {report.checked} responses{note}: {report.disagreeing} disagree")
