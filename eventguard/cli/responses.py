"""``eventguard responses list | show``: what was recorded, one response or many."""

from __future__ import annotations

from itertools import groupby
from typing import Annotated, Any

import typer
from rich.text import Text

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    Status,
    command,
    emit_json,
    ensure_exists,
    fail,
    ms,
    out,
    parse_time,
    printable,
    quoted,
    resolve,
    run,
    say,
    table,
    when,
    with_store,
)
from eventguard.records import Attempt, EnvelopeRecord, History, ResponseRecord
from eventguard.store import ResponseStore

app = typer.Typer(
    help="List recorded responses, or show one's timeline.", no_args_is_help=True, rich_markup_mode=None
)

STATUS_STYLE = {
    "completed": "green",
    "incomplete": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "interrupted": "yellow",
    "in_progress": "cyan",
    "queued": "cyan",
    "new": "cyan",
}


def status_text(status: str | None) -> Text:
    return Text(printable(status or "-"), style=STATUS_STYLE.get(status or "", ""))


@command(app, "list")
def list_(
    status: Status = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Active since: an age (30m, 2h, 7d) or an ISO time.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")] = 50,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Recorded responses, newest first."""
    url = resolve(database_url, schema)
    since_at = parse_time(since, "--since") if since is not None else None

    async def work(store: ResponseStore) -> list[ResponseRecord]:
        return await store.recent(
            status=None if status is None else status.value, since=since_at, limit=limit
        )

    records = run(lambda: with_store(url, work, schema))
    if json:
        emit_json([r.model_dump(mode="json") for r in records])
        return
    if not records:
        say("no responses" + (f" with status {status}" if status else ""))
        return
    rows = [
        [
            r.response_id,
            status_text(r.status),
            r.cause or "-",
            r.agent_name or "-",
            when(r.created_at),
            ms(r.duration_ms),
            r.event_count,
        ]
        for r in records
    ]
    out.print(
        table(
            None,
            ["response", "status", "cause", "agent", "created", "duration", "events"],
            rows,
            keep=["response"],
        )
    )


@command(app)
def show(
    response_id: Annotated[str, typer.Argument(help="The response id (resp_... / caresp_...).")],
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """One response's timeline: its transitions, its events summarised, its anomalies."""
    url = resolve(database_url, schema)

    async def work(store: ResponseStore) -> tuple[History | None, list[EnvelopeRecord]]:
        return await store.history(response_id), await store.envelopes(response_id)

    ensure_exists(url)
    history, envelopes = run(lambda: with_store(url, work, schema))
    if history is None:
        fail(f"unknown response id {quoted(response_id)}")
    if json:
        shown = history.model_dump(mode="json")
        if envelopes:  # the host's SQL response store has it too
            shown["envelopes"] = [e.model_dump(mode="json") for e in envelopes]
        emit_json(shown)
        return
    r = history.response
    head = Text.assemble(
        printable(r.response_id), "  ", status_text(r.status), printable(f"  cause={r.cause or '-'}")
    )
    out.print(head)
    details = [
        ("agent", r.agent_name),
        ("mode", _mode(r)),
        ("conversation", r.conversation_id),
        ("chain", r.chain_id),
        ("partition key", r.partition_key),
        ("created", when(r.created_at)),
        ("finished", when(r.finished_at)),
        ("duration", ms(r.duration_ms)),
        ("tokens", _tokens(r)),
        ("error", _error(r)),
        ("flags", _flags(r)),
        ("attempts", str(r.attempt)),
        ("events", _events(history)),
    ]
    for name, value in details:
        if value:
            say(f"  {name:<14}{value}")
    for envelope in envelopes:
        _print_envelope(envelope)
    if not any(a.transitions or a.events or a.anomalies for a in history.attempts):
        say("  history       pruned: only this summary row is kept (eventguard prune)")
        return
    for attempt in history.attempts:
        _print_attempt(attempt, len(history.attempts) > 1)


def _events(history: History) -> str:
    """How many events: those stored, which the row's count (kept at flushes and the end) can lag;
    the row's count alone once the history is pruned."""
    stored = sum(len(a.events) for a in history.attempts)
    count = history.response.event_count
    if stored == 0 or stored == count:
        return str(count)
    return f"{stored} stored" + (f" (the row says {count})" if count else "")


def _print_envelope(e: EnvelopeRecord) -> None:
    """What the host's response store serves for this response, beside the recorded history."""
    state = "deleted" if e.deleted else (e.status or "-")
    say(f"  host's store  {state} (partition {e.partition[:12]}, updated {when(e.updated_at)})")
    for title, items in (("input", e.input_items), ("output", e.output_items)):
        for item in items:
            say(f"    {title:<7}{_item_summary(item)}")


def _item_summary(item: Any) -> str:
    if not isinstance(item, dict):
        return type(item).__name__
    parts = [str(item.get("type", "?")), str(item.get("role", "") or "")]
    content = item.get("content")
    if isinstance(content, list):
        text = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(repr(text[:60] + ("..." if len(text) > 60 else "")))
    return " ".join(p for p in parts if p)


def _print_attempt(attempt: Attempt, numbered: bool) -> None:
    suffix = f" (attempt {attempt.attempt})" if numbered else ""
    # The earliest, not the first listed: recover's mark (numbered below zero) is listed first but
    # comes last in time, and offsets from it were negative ("+-2531 ms").
    start = min((t.at for t in attempt.transitions), default=None)
    rows: list[list[Any]] = []
    for t in sorted(attempt.transitions, key=lambda t: (t.idx < 0, t.idx if t.idx >= 0 else -t.idx)):
        offset = f"+{(t.at - start).total_seconds() * 1000:.0f} ms" if start is not None else ""
        rows.append([t.idx, offset, f"{t.from_state} -> {t.to_state}", t.cause or "", t.reason])
    out.print(table(f"transitions{suffix}", ["#", "after", "transition", "cause", "reason"], rows))
    out.print(table(f"events{suffix}", ["seq", "type", "count"], summarise_events(attempt)))
    if attempt.anomalies:
        anomaly_rows = [
            [a.source, a.kind, a.event_type or "", "" if a.event_index is None else a.event_index, a.reason]
            for a in attempt.anomalies
        ]
        out.print(
            table(f"anomalies{suffix}", ["source", "kind", "event", "at event", "reason"], anomaly_rows)
        )
    else:
        say(f"no anomalies{suffix}")


def summarise_events(attempt: Attempt) -> list[list[Any]]:
    """Runs of consecutive events of one type, as (seq range, type, count)."""
    rows: list[list[Any]] = []
    for etype, run_ in groupby(attempt.events, key=lambda e: e.type):
        items = list(run_)
        first, last = items[0].seq, items[-1].seq
        seq = str(first) if first == last else f"{first}-{last}"
        rows.append([seq, etype or "(untyped)", len(items)])
    return rows


def _mode(r: ResponseRecord) -> str:
    parts = []
    if r.background:
        parts.append("background")
    if r.stream:
        parts.append("stream")
    if r.store is False:
        parts.append("no-store")
    return ",".join(parts) or "foreground"


def _tokens(r: ResponseRecord) -> str | None:
    if r.total_tokens is None and r.input_tokens is None and r.output_tokens is None:
        return None

    # A count not stored (NULL: not reported, or past what the column holds) is unknown, not 0.
    def count(n: int | None) -> str:
        return "-" if n is None else str(n)

    return f"in {count(r.input_tokens)} / out {count(r.output_tokens)} / total {count(r.total_tokens)}"


def _error(r: ResponseRecord) -> str | None:
    parts = [p for p in (r.error_code, r.error_type, r.error_message) if p]
    return ": ".join(parts) if parts else None


def _flags(r: ResponseRecord) -> str | None:
    flags = [
        name
        for name, on in (
            ("recovery", r.is_recovery),
            ("steered turn", r.is_steered_turn),
            ("cut short by steering", r.steering_cut_short),
            ("unverified", r.unverified),
        )
        if on
    ]
    return ", ".join(flags) if flags else None
