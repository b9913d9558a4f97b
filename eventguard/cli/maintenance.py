"""``eventguard prune`` and ``eventguard recover``: keep the store tidy and honest.

``prune`` expires, by one age, the recorded history, the host's stored responses and its agent
sessions."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Policy,
    RecoverPolicy,
    Schema,
    emit_json,
    parse_duration,
    progress,
    say,
    store_command,
)
from eventguard.records import EnvelopePruneResult, PruneResult
from eventguard.store import ResponseStore

OlderThan = Annotated[str, typer.Option("--older-than", help="An age: 30m, 12h, 7d, 2w.", show_default=False)]


def prune(
    older_than: OlderThan,
    drop_summary: Annotated[
        bool, typer.Option("--drop-summary", help="Delete the response rows too (default: keep them).")
    ] = False,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Delete the history (events, transitions, anomalies) of responses that ended before the age,
    and the host's stored responses and agent sessions last written before it."""
    age = parse_duration(older_than, "--older-than")

    async def work(store: ResponseStore) -> tuple[PruneResult, EnvelopePruneResult, int]:
        return (
            await store.prune(older_than=age, keep_summary=not drop_summary),
            await store.prune_envelopes(older_than=age),
            await store.prune_agent_sessions(older_than=age),
        )

    with progress(f"pruning history older than {older_than}", quiet=json):
        result, envelopes, sessions = store_command(database_url, work, schema)
    if json:
        emit_json(
            {
                **result.model_dump(mode="json"),
                "response_store": envelopes.model_dump(mode="json"),
                "agent_sessions": sessions,
            }
        )
        return
    say(
        f"pruned responses ended more than {older_than} ago: {result.events} events, "
        f"{result.transitions} transitions, {result.anomalies} anomalies, {result.responses} response rows"
    )
    say(
        f"pruned the host's response store: {envelopes.envelopes} envelopes, {envelopes.items} items, "
        f"{envelopes.history_nodes} history nodes"
    )
    say(f"pruned the host's agent sessions last written more than {older_than} ago: {sessions}")


def recover(
    older_than: OlderThan,
    policy: Policy = RecoverPolicy.INTERRUPTED,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")] = 1000,
    expired_leases: Annotated[
        bool,
        typer.Option(
            "--expired-leases", help="First end the responses of replicas whose lease expired (replicas=)."
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Mark responses nobody has written since before the age (a crashed replica) as ended."""
    age = parse_duration(older_than, "--older-than")
    chosen: Literal["interrupted", "failed"] = "failed" if policy is RecoverPolicy.FAILED else "interrupted"

    async def work(store: ResponseStore) -> list[str]:
        reaped: list[str] = []
        if expired_leases:  # eventguard.replicas: the reaper's pass, exactly once with the replicas'
            from eventguard.replicas.replica import reap

            reaped = await reap(store.engine, policy=chosen, limit=limit)
        return reaped + await store.recover(older_than=age, policy=chosen, limit=limit)

    with progress(f"recovering responses stuck for more than {older_than}", quiet=json):
        marked = store_command(database_url, work, schema)
    if json:
        emit_json({"policy": chosen, "marked": marked})
        return
    if not marked:
        say(f"no response stuck for more than {older_than}")
        return
    say(f"marked {len(marked)} response(s) {chosen}:")
    for response_id in marked:
        say(f"  {response_id}")
