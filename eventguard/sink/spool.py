"""The local spool: an append-only JSON-lines file of batches the database did not take.

Appends are one ``os.write`` on an ``O_APPEND`` descriptor per call, so concurrent writers (tasks,
or processes sharing the file) never interleave inside a line. Replay first renames the file
aside, so new appends start a fresh file while the old one is loaded.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eventguard.sink.batch import Batch

_REPLAYING = ".replaying-"


@dataclass(slots=True)
class SpoolFile:
    path: Path
    batches: list[Batch]
    #: Lines that could not be parsed (a write torn by a crash): reported, skipped.
    bad_lines: int


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, batches: Iterable[Batch]) -> int:
        data = b"".join(b.to_json() + b"\n" for b in batches)
        if not data:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return data.count(b"\n")

    def pending(self) -> bool:
        return any(True for _ in self._files())

    def take(self) -> Iterator[SpoolFile]:
        """Each spooled file, renamed aside first; call :meth:`done` once one is applied."""
        if self.path.exists():
            aside = self.path.with_name(f"{self.path.name}{_REPLAYING}{uuid.uuid4().hex}")
            os.replace(self.path, aside)
        for path in sorted(self._files(replaying_only=True)):
            batches: list[Batch] = []
            bad = 0
            with path.open("rb") as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        batches.append(Batch.from_json(line))
                    except (ValueError, KeyError, TypeError):
                        bad += 1
            yield SpoolFile(path, batches, bad)

    @staticmethod
    def done(file: SpoolFile) -> None:
        if file.bad_lines:
            # Keep what could not be read for a person to look at; it is never replayed again.
            os.replace(file.path, file.path.with_name(file.path.name.replace(_REPLAYING, ".corrupt-")))
        else:
            file.path.unlink(missing_ok=True)

    def _files(self, replaying_only: bool = False) -> Iterator[Path]:
        if not self.path.parent.is_dir():
            return
        if not replaying_only and self.path.exists():
            yield self.path
        yield from self.path.parent.glob(f"{self.path.name}{_REPLAYING}*")
