"""The ``eventguard`` command: the demo, the schema, and what the sink recorded.

Every subcommand takes ``--database-url`` (or ``EVENTGUARD_DATABASE_URL``; default ``./eventguard.db``)
and ``--json``. Errors are one line on stderr (exit 2); ``verify`` exits 1 when it finds a disagreement.
"""

from __future__ import annotations

import typer

from eventguard.cli import db, demo, maintenance, responses, spool, stats, verify
from eventguard.cli._common import SafeGroup, register

__all__ = ["app", "main"]

app = typer.Typer(
    name="eventguard",
    help="Record what an agent server's response stream really did, and look at it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # usage errors as one plain line, like ours
    cls=SafeGroup,  # ... and never with a password or a raw control character in it
)
# Every command is registered through the scaffold (errors handled there); groups register their own.
register(app, demo.command, "demo")
app.add_typer(db.app, name="db")
app.add_typer(responses.app, name="responses")
register(app, stats.command, "stats")
register(app, verify.command, "verify")
app.add_typer(spool.app, name="spool")
register(app, maintenance.prune, "prune")
register(app, maintenance.recover, "recover")


def main() -> None:
    """The console script's entry point."""
    app()
