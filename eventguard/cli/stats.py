"""``eventguard stats``: counts by status and cause, duration percentiles."""

from __future__ import annotations

from typing import Annotated

import typer

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    emit_json,
    ms,
    out,
    parse_time,
    say,
    store_command,
    table,
)
from eventguard.records import Stats
from eventguard.store import ResponseStore


def command(
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only responses active since: an age (2h, 7d) or an ISO time."),
    ] = None,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Counts by status and by cause, and duration percentiles of ended responses."""
    since_at = parse_time(since, "--since") if since is not None else None

    async def work(store: ResponseStore) -> Stats:
        return await store.stats(since=since_at)

    stats = store_command(database_url, work, schema)
    if json:
        emit_json(stats.model_dump(mode="json"))
        return
    say(f"{stats.total} responses" + (f" since {since}" if since else ""))
    if stats.by_status:
        rows = sorted(stats.by_status.items(), key=lambda kv: (-kv[1], kv[0]))
        out.print(table("by status", ["status", "count"], rows))
    if stats.by_cause:
        rows = sorted(stats.by_cause.items(), key=lambda kv: (-kv[1], kv[0]))
        out.print(table("by cause", ["cause", "count"], rows))
    out.print(
        table(
            "duration of ended responses",
            ["p50", "p90", "p99"],
            [[ms(stats.duration_ms_p50), ms(stats.duration_ms_p90), ms(stats.duration_ms_p99)]],
        )
    )
