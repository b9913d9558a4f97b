"""What the sink tells its user: the counts in :class:`SinkStats`, and its log lines.

Every error text the sink shows (a log line, ``stats.last_error``, a quarantine reason) goes
through :meth:`Reporter.why` or :meth:`Reporter.traceback`: one line from the driver, storable,
with the database URL's password scrubbed (a driver may echo its DSN in an error) and, in a
traceback, the bound values SQLAlchemy prints after ``[parameters:`` (event payloads) left out.
An error of one kind is logged once; later ones are counted and logged only for debugging.
"""

from __future__ import annotations

import logging
import re
import traceback as _traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from eventguard.sink import quarantine
from eventguard.sink.apply import Refusal
from eventguard.sql import engine as _db
from eventguard.sql.classify import reason

__all__ = ["Reporter", "SinkStats", "log"]

#: The sink's logger (``eventguard.sink``).
log = logging.getLogger("eventguard.sink")

#: SQLAlchemy's rendering of a statement's bound values in an error (one line: a repr).
_PARAMETERS = re.compile(r"\[parameters: [^\n]*")


@dataclass(slots=True)
class SinkStats:
    """What a sink did so far; ``SqlSink.stats``. Counts only grow."""

    batches_written: int = 0
    events_written: int = 0
    batches_spooled: int = 0
    overflows: int = 0
    refusals: list[Refusal] = field(default_factory=list)
    last_error: str | None = None
    #: Records put in the quarantine (the table, or the file when the table could not be written).
    quarantined: int = 0
    #: Of those, the ones in the quarantine file.
    quarantine_file: int = 0
    #: Batches refused because another stream owns their response id and attempt.
    duplicates: int = 0
    #: Errors the writer did not expect (each kind logged once, with its traceback).
    unexpected_errors: int = 0
    #: Writes the database rolled back for meeting another writer (a deadlock, a serialization
    #: failure) and that were done again at once (after the last try: an outage, spooled).
    conflicts_retried: int = 0
    #: Batches that could be kept nowhere (spool and quarantine file both failed): logged.
    lost: int = 0
    #: Told the seconds each committed write transaction took (``eventguard.telemetry`` sets it:
    #: the ``eventguard.sink.write.duration`` histogram); None: not timed.
    on_write: Callable[[float], None] | None = field(default=None, repr=False, compare=False)


class Reporter:
    """Counts in ``stats`` and says what happened, once per kind, without the URL's secrets.

    ``stats``: the sink's counts; ``secrets``: every form the URL's password may take in a text.
    """

    def __init__(self, stats: SinkStats, secrets: Iterable[str]) -> None:
        self.stats = stats
        self._secrets = set(secrets)
        self._logged: set[str] = set()

    def why(self, exc: BaseException) -> str:
        """The driver's one-line reason for ``exc``, storable and without the URL's secrets."""
        return _db.scrub(quarantine.text(reason(exc)), self._secrets)

    def traceback(self, exc: BaseException) -> str:
        """``exc``'s traceback (its chain included) as text that is safe to show."""
        try:
            text = "".join(_traceback.format_exception(exc)).rstrip("\n")
        except Exception:  # pragma: no cover - a broken __str__ deep in the chain
            text = f"{type(exc).__qualname__} (its traceback could not be formatted)"
        text = _PARAMETERS.sub("[parameters: not logged]", text)
        return _db.scrub(quarantine.text(text), self._secrets)

    def say(self, key: str, msg: str, *args: object) -> None:
        """Log ``msg`` (``%``-style, with ``args``) as an error the first time for ``key``, then
        only for debugging: the counts are in ``stats``."""
        if key in self._logged:
            log.debug(msg, *args)
        else:
            self._logged.add(key)
            log.error(msg, *args)

    def unexpected(self, exc: BaseException, where: str) -> None:
        """An error the writer did not expect (``exc``, met in ``where``): counted, logged with
        its traceback once per kind."""
        self.stats.unexpected_errors += 1
        key = f"{where}:{type(exc).__qualname__}"
        if key in self._logged:
            log.debug("eventguard sink: unexpected error in %s again: %s", where, type(exc).__name__)
            return
        self._logged.add(key)
        # The traceback as text, scrubbed like every error text shown (the URL's secrets, and
        # the bound values SQLAlchemy prints after "[parameters:": event payloads), rather than
        # exc_info, which each handler would format from the raw exception.
        log.error(
            "eventguard sink: unexpected error in %s (%s); the writer carries on, nothing is dropped "
            "(later ones of this kind are only counted in stats.unexpected_errors)\n%s",
            where,
            self.why(exc),
            self.traceback(exc),
        )

    def refused(self, refusals: list[Refusal]) -> None:
        """Count and log each status the database refused (another sink or stream holds a terminal)."""
        for refusal in refusals:
            self.stats.refusals.append(refusal)
            log.warning("eventguard sink: response %r: %s", refusal.response_id, refusal.reason)
