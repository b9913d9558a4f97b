"""``eventguard spool replay``: load what the sink spooled while the database was away."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    check_schema,
    command,
    emit_json,
    ensure_exists,
    fail,
    out,
    printable,
    progress,
    resolve,
    run,
)
from eventguard.errors import BadSpoolPath
from eventguard.sink import ReplayResult, SqlSink
from eventguard.sql import engine as _db

app = typer.Typer(
    help="The local spool of batches the database did not take.", no_args_is_help=True, rich_markup_mode=None
)


@command(app)
def replay(
    spool: Annotated[
        Path | None,
        typer.Option(
            "--spool",
            help="The spool file (default: beside the SQLite file, else "
            "./eventguard-spool-<target>.jsonl, one per database and schema)",
            dir_okay=False,
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    schema: Schema = None,
    json: Json = False,
) -> None:
    """Load the spool into the database, idempotently; each file is removed once loaded.

    Files are read an entry at a time, and each is claimed while it is loaded: two replays at once
    (two processes, a server starting) never load the same file, and each counts only its own.
    """
    url = resolve(database_url, schema)
    ensure_exists(url)
    try:  # the spool path is checked here (not the database): a file that is not a spool is refused
        sink = SqlSink(url, schema=schema, spool_path=spool, auto_migrate=False)
    except BadSpoolPath as exc:
        # Named as the user gave it: --spool, or the default (beside an SQLite file, else ./).
        fail(f"--spool: {exc}" if spool is not None else f"the default spool: {exc}")

    async def work() -> tuple[Path, ReplayResult, int]:
        await check_schema(url, schema)
        try:
            result = await sink.replay_spool()
            # What is still there: written meanwhile, kept after an outage, or another replay's.
            return sink.spool.path, result, sink.spool.size_bytes()
        finally:
            await sink.aclose()

    with progress("replaying the spool", quiet=json):
        path, result, waiting = run(work)
    quarantined = result.quarantined
    if json:
        emit_json(
            {
                "database_url": _db.safe_url(url),
                "spool": str(path),
                "files": result.files,
                "batches": result.batches,
                "events": result.events,
                "bad_entries": result.bad_lines,
                "bad_records": result.bad_lines,  # earlier names, kept for scripts that read them
                "bad_lines": result.bad_lines,
                "quarantined": quarantined,
                "pending_bytes": waiting,
                "refusals": [str(r) for r in result.refusals],
            }
        )
        return
    shown = printable(str(path))
    if result.files == 0:
        out.print(f"nothing to replay in {shown}", markup=False)
    else:
        out.print(
            f"replayed {result.files} file(s) from {shown}: {result.batches} batches, {result.events} events",
            markup=False,
        )
    if result.bad_lines:
        out.print(f"{_entries(result.bad_lines)} unreadable", markup=False)
    if quarantined:
        out.print(
            f"{quarantined} quarantined (unreadable entries, batches the database refused, duplicate "
            "streams): see the eventguard_quarantine table, or the quarantine file beside the spool",
            markup=False,
        )
    for refusal in result.refusals:
        out.print(f"refused: {refusal}", markup=False)
    if waiting:
        out.print(
            f"{waiting} bytes still in the spool (written meanwhile, or being replayed by another process)",
            markup=False,
        )


def _entries(count: int) -> str:
    """``count`` spool entries, in words: "1 spool entry", "2 spool entries"."""
    return f"{count} spool {'entry' if count == 1 else 'entries'}"
