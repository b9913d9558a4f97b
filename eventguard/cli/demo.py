"""``eventguard demo``: five real responses, and what each layer said about them."""

from __future__ import annotations

import asyncio
import shlex
from typing import TYPE_CHECKING

import typer
from rich.text import Text

from eventguard.cli import missing_extra
from eventguard.cli._common import (
    DatabaseUrl,
    Json,
    Schema,
    emit_json,
    err,
    fail,
    out,
    printable,
    resolve,
    say,
    table,
)
from eventguard.cli.responses import status_text

if TYPE_CHECKING:  # the demo pulls in the host, uvicorn and openai: only when it runs
    from eventguard.demo import DemoResult


def command(database_url: DatabaseUrl = None, schema: Schema = None, json: Json = False) -> None:
    """Serve a guarded ResponsesHostServer on loopback, call it with the openai client, show the lies.

    No model is needed. Five responses (completes; cancelled while suspended; cancelled after text
    streamed; executor raises; chat cut short by graceful shutdown) are stored in the database.
    """
    try:
        from eventguard.demo import run_demo
    except ModuleNotFoundError as exc:  # the demo's server and client are the `demo` extra
        message = missing_extra(exc, {"uvicorn": "demo", "openai": "demo"})
        if message is None:
            raise
        fail(message)

    url = resolve(database_url, schema)

    def progress(message: str) -> None:
        err.print(Text(printable(message), style="dim"))

    try:
        result = asyncio.run(run_demo(url, schema=schema, progress=progress))
    except TimeoutError as exc:  # a scenario step, not the database: say which
        fail(f"demo: {exc or 'a step timed out'}")
    if json:
        emit_json(
            {
                "database_url": result.url,
                "versions": result.versions,
                "seconds": round(result.seconds, 3),
                "ok": result.ok,
                "responses": [row.as_json() for row in result.rows],
            }
        )
    else:
        _print_table(result, schema)
    if not result.ok:
        err.print(Text("eventguard: error: eventguard's record and the public API disagree (see the table)"))
        raise typer.Exit(1)


def _print_table(result: DemoResult, schema: str | None) -> None:
    from eventguard.demo import lies

    rows = []
    for row in result.rows:
        recorded = row.recorded
        cause = f" ({recorded.cause})" if recorded is not None and recorded.cause else ""
        rows.append(
            [
                str(row.number),
                row.scenario,
                Text(printable(row.unguarded.shown), style="bold red" if row.lie else ""),
                Text.assemble(status_text(row.recorded_status), printable(cause)),
                status_text(row.public),
                Text(printable(row.verdict), style="bold red" if row.lie or not row.consistent else "green"),
            ]
        )
    columns = ["#", "scenario", "unguarded handler yielded", "eventguard recorded", "public API", "verdict"]
    out.print(table(None, columns, rows))
    versions = ", ".join(f"{name} {version}" for name, version in result.versions.items())
    caught = lies(result)
    say(f"{len(caught)} of {len(result.rows)} unguarded terminals lied; eventguard recorded what happened.")
    say("Flags when the handler yielded its terminal: S cancellation signal, C client cancelled, D shutdown.")
    say(f"Upstream: {versions}.")
    say(f"Stored in {result.url} in {result.seconds:.1f}s:")
    for row in result.rows:
        say(f"  {row.number} {row.response_id}")
    where = "" if schema is None else f" --schema {shlex.quote(schema)}"
    out.print(
        Text(
            printable(
                f"Next: eventguard responses list --status cancelled{where}; eventguard verify{where}; "
                f"eventguard responses show {result.rows[-1].response_id}{where}"
            )
        ),
        soft_wrap=True,
    )
