"""The ``eventguard`` typer application: every command registered on one root (see :mod:`eventguard.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer

import eventguard
from eventguard.cli import db, demo, maintenance, responses, sessions, spool, stats, verify
from eventguard.cli._common import SafeGroup, register, say

__all__ = ["app"]

app = typer.Typer(
    name="eventguard",
    help="Record what an agent server's response stream really did, and look at it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # usage errors as one plain line, like ours
    cls=SafeGroup,  # ... and never with a password or a raw control character in it
)


def _show_version(value: bool) -> None:
    if value:
        say(f"eventguard {eventguard.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print eventguard's version and exit."
        ),
    ] = False,
) -> None:
    """Record what an agent server's response stream really did, and look at it."""


# Every command is registered through the scaffold (errors handled there); groups register their own.
register(app, demo.command, "demo")
app.add_typer(db.app, name="db")
app.add_typer(responses.app, name="responses")
register(app, sessions.command, "sessions")
register(app, stats.command, "stats")
register(app, verify.command, "verify")
app.add_typer(spool.app, name="spool")
register(app, maintenance.prune, "prune")
register(app, maintenance.recover, "recover")
