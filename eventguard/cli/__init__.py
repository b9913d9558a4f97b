"""The ``eventguard`` command: the demo, the schema, and what the sink recorded.

Every subcommand takes ``--database-url`` (or ``EVENTGUARD_DATABASE_URL``; default ``./eventguard.db``)
and ``--json``. Errors are one line on stderr (exit 2); ``verify`` exits 1 when it finds a disagreement.

The command needs the ``cli`` extra (typer, rich), which the core does not install: this module
imports neither until the command runs, so :func:`main` can say in one line which extra is missing.
The typer application is :data:`app` (built in :mod:`eventguard.cli.root` on first use).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

    app: typer.Typer

__all__ = ["app", "main"]

#: What each extra brings, by the top-level module whose absence means it is not installed.
_EXTRA_OF = {"typer": "cli", "click": "cli", "rich": "cli", "shellingham": "cli"}


def missing_extra(error: ModuleNotFoundError, extra_of: dict[str, str]) -> str | None:
    """The one-line message for ``error`` when it is a missing optional dependency, else None.

    Args:
        error: what ``import`` raised.
        extra_of: top-level module name -> the eventguard extra that installs it.
    """
    module = (error.name or "").partition(".")[0]
    extra = extra_of.get(module)
    if extra is None:
        return None
    return f"this needs {module}, which is not installed: pip install 'eventguard[{extra}]'"


def main() -> None:
    """The console script's entry point: run the command, or say which extra to install (exit 2)."""
    try:
        from eventguard.cli.root import app
    except ModuleNotFoundError as exc:
        message = missing_extra(exc, _EXTRA_OF)
        if message is None:
            raise
        sys.stderr.write(f"eventguard: error: {message}\n")
        raise SystemExit(2) from None
    app()


def __getattr__(name: str) -> object:
    """``app``, imported on first use (it needs typer)."""
    if name == "app":
        from eventguard.cli.root import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
