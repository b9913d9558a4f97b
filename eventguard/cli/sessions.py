"""``eventguard sessions``: the host's agent sessions in SQL (``SqlAgentSessionStoreProvider``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    emit_json,
    out,
    quoted,
    say,
    store_command,
    table,
    when,
)
from eventguard.records import AgentSessionRecord
from eventguard.store import ResponseStore


def command(
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")] = 50,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """The host's stored agent sessions, last written first (one that does not read back says why)."""

    async def work(store: ResponseStore) -> list[AgentSessionRecord]:
        return await store.agent_sessions(limit=limit)

    records = store_command(database_url, work, schema)
    if json:
        emit_json([_as_json(r) for r in records])
        return
    if not records:
        say("no agent sessions")
        return
    # A session id is unbounded (a megabyte is storable): shown as an error quotes an argument,
    # cut to a few hundred characters and saying its length; the cells escape what is left.
    rows = [
        [
            quoted(r.session_id),
            r.partition[:12],
            r.version,
            when(r.updated_at),
            r.size,
            r.problem or "-",
        ]
        for r in records
    ]
    out.print(table(None, ["session", "partition", "version", "updated", "characters", "problem"], rows))


def _as_json(record: AgentSessionRecord) -> dict[str, Any]:
    """The record for ``--json``: pydantic's JSON mode refuses a lone surrogate, which a stored
    session id or session may hold (emit_json escapes it), so only the time goes through it."""
    shown = record.model_dump()
    shown["updated_at"] = record.model_dump(mode="json", include={"updated_at"})["updated_at"]
    return shown
