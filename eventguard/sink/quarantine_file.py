"""The quarantine file: where quarantine records go when the quarantine table cannot be written.

The file is ``<spool>.quarantine.jsonl`` (:func:`eventguard.sink.quarantine.file_path`), one JSON
object per line, fsync'd (:func:`eventguard.sink.quarantine.append_file`). An fsync must hold up
neither the hot path (an overflow spill, from ``Recorder.event``) nor the event loop: while the
writer runs on the loop, records are left in a backlog that the writer appends in a thread at
the end of its turn (:meth:`QuarantineFile.drain`); without a writer they are appended at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from eventguard.sink import quarantine
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.report import Reporter

__all__ = ["QuarantineFile"]


class QuarantineFile:
    """Appends quarantine records to the file beside the spool, counted in the reporter's stats.

    ``path``: where the file is (read at each append: the spool may be moved); ``report``: the
    sink's counts and log; ``writing``: whether a writer runs on this loop (then appends wait
    for its turn, and ``wake`` tells it there is one to do).
    """

    def __init__(
        self,
        path: Callable[[], Path],
        report: Reporter,
        writing: Callable[[], bool],
        wake: Callable[[], None],
    ) -> None:
        self._path = path
        self._report = report
        self._writing = writing
        self._wake = wake
        #: Appends left for the writer to do, in a thread: (records, why they are not in the table).
        self.backlog: list[tuple[list[QuarantineRecord], str]] = []

    @property
    def path(self) -> Path:
        """Where quarantine records go when the quarantine table cannot be written."""
        return self._path()

    def keep(self, records: list[QuarantineRecord], why: str) -> None:
        """Append ``records`` (fsync'd); ``why`` they are not in the table. Left to the writer's
        turn while it runs on this loop (see the module's docstring), else done here."""
        if self._writing():
            self.backlog.append((records, why))
            self._wake()
            return
        self._append(records, why)

    async def keep_async(self, records: list[QuarantineRecord], why: str) -> None:
        """:meth:`keep`, its write and fsync in a thread, off the event loop."""
        path = self.path
        try:
            n = await asyncio.to_thread(quarantine.append_file, path, records)
        except Exception as exc:
            self._lost(records, path, exc)
            return
        self._filed(n, path, why)

    async def drain(self) -> None:
        """Append what the hot path left in the backlog (the writer's turn)."""
        while self.backlog:
            records, why = self.backlog.pop(0)
            await self.keep_async(records, why)

    def drain_now(self) -> None:
        """The same, synchronously: the writer is ending."""
        backlog, self.backlog = self.backlog, []
        for records, why in backlog:
            self._append(records, why)

    def _append(self, records: list[QuarantineRecord], why: str) -> None:
        path = self.path
        try:
            n = quarantine.append_file(path, records)
        except Exception as exc:
            self._lost(records, path, exc)
            return
        self._filed(n, path, why)

    def _filed(self, n: int, path: Path, why: str) -> None:
        self._report.stats.quarantine_file += n
        self._report.say(
            "quarantine file",
            "eventguard sink: %s; %d records kept in %s (stats.quarantine_file counts them)",
            why,
            n,
            path,
        )

    def _lost(self, records: list[QuarantineRecord], path: Path, exc: Exception) -> None:
        self._report.stats.lost += len(records)
        self._report.say(
            "lost",
            "eventguard sink: %d quarantine records could be written neither to the database nor to "
            "%s (%s); they are lost (stats.lost counts them)",
            len(records),
            path,
            self._report.why(exc),
        )
