"""``eventguard spool replay``: load what the sink spooled while the database was away."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eventguard import _db
from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    check_schema,
    emit_json,
    ensure_exists,
    errors,
    handled,
    out,
    resolve,
    run,
)
from eventguard.sink import ReplayResult, SqlSink

app = typer.Typer(
    help="The local spool of batches the database did not take.", no_args_is_help=True, rich_markup_mode=None
)


@app.command()
@handled
def replay(
    spool: Annotated[
        Path | None,
        typer.Option(
            "--spool",
            help="The spool file (default: beside the SQLite file, else ./eventguard-spool.jsonl)",
            dir_okay=False,
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    json: Json = False,
) -> None:
    """Load the spool into the database, idempotently; each file is removed once loaded."""
    url = resolve(database_url)
    ensure_exists(url)

    async def work() -> tuple[Path, ReplayResult]:
        await check_schema(url)
        sink = SqlSink(url, spool_path=spool, auto_migrate=False)
        try:
            return sink.spool.path, await sink.replay_spool()
        finally:
            await sink.aclose()

    with errors(url):
        path, result = run(work)
    if json:
        emit_json(
            {
                "database_url": _db.safe_url(url),
                "spool": str(path),
                "files": result.files,
                "batches": result.batches,
                "events": result.events,
                "bad_lines": result.bad_lines,
                "refusals": [str(r) for r in result.refusals],
            }
        )
        return
    if result.files == 0:
        out.print(f"nothing to replay in {path}", markup=False)
        return
    out.print(
        f"replayed {result.files} file(s) from {path}: {result.batches} batches, {result.events} events",
        markup=False,
    )
    if result.bad_lines:
        out.print(f"{result.bad_lines} unreadable line(s) kept aside as .corrupt- files", markup=False)
    for refusal in result.refusals:
        out.print(f"refused: {refusal}", markup=False)
