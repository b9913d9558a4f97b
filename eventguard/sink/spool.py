"""The local spool: batches the database did not take, kept in append-only files until replayed.

Entry format, version 1
------------------------
A spool file is a sequence of lines. Each entry is one line::

    EG1 <length> <crc32> <json>\\n

- ``EG1``: ``EG`` and the format version, ``1``, in ASCII.
- ``<length>``: the byte length of ``<json>``, in decimal ASCII digits.
- ``<crc32>``: the CRC-32 of the bytes of ``<json>`` (IEEE 802.3, as ``zlib.crc32``), as 8 lowercase
  hexadecimal digits.
- ``<json>``: the batch, one JSON object in UTF-8 with no newline in it (its fields:
  :mod:`eventguard.sink.batch`).

The four fields are separated by one space (0x20) and the entry ends with a newline (0x0A). For
example: ``EG1 271 5f0c2a9e {"response_id":"resp_1","attempt":1,...}\\n``.

Every append is one ``os.write`` on an ``O_APPEND`` descriptor, so concurrent appenders (tasks,
or processes sharing the file) never interleave inside an entry. Each append starts with a newline
of its own: an entry a crash cut short (it has no newline) ends there and never merges with the next
append's entries, and its length and checksum show it torn. Readers skip empty lines.

A line that starts with ``{`` is a version-0 entry: a plain JSON batch, as spools were written
before entries had a header. It still replays.

Anything else is a :class:`BadEntry`, with a reason a person can read: a torn or garbled line, a
checksum that does not match, JSON that is not a batch (``"row": null``...), an entry of a format
version this eventguard does not know. Every other entry of the file still loads.

Replay
------
:meth:`Spool.take` renames the live file aside (``<name>.replaying-<time>-<id>``), so new appends
start a fresh file, then claims each aside file with an exclusive ``flock`` held while it is being
replayed: a file another process holds is skipped, and a file left by a dead process is claimable
again (its lock died with it). Appenders hold a shared ``flock`` while they write and never start
writing into a file that has been set aside, so a claimed file no longer changes; an append that
began just before its file was set aside holds it for a moment, and that file is skipped too.
:meth:`Spool.take` never waits for a lock (it runs on the sink's event loop): a skipped file stays
pending and the next replay takes it. :meth:`Spool.done`
removes a file once it is applied (its bad entries included: the sink keeps those in the
database), :meth:`Spool.release` keeps it for the next replay.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import sys
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from eventguard.errors import BadSpoolPath
from eventguard.sink.batch import Batch, BatchFormatError

log = logging.getLogger("eventguard.sink")

#: The entry format this module writes; it reads this one and version 0.
FORMAT_VERSION = 1
_MAGIC = b"EG%d " % FORMAT_VERSION
_REPLAYING = ".replaying-"

# The header of a version-1 entry, and the version token of any entry.
_HEADER = re.compile(rb"EG1 (0|[1-9][0-9]{0,14}) ([0-9a-f]{8}) ")
_VERSION = re.compile(rb"EG([0-9]{1,9})(?: |$)")

#: Lines are read in pieces of this size; a line that is no entry keeps only this much of itself.
_CHUNK = 1 << 20
#: How often an append retries when the live file is set aside under it.
_APPEND_TRIES = 100


@dataclass(frozen=True, slots=True)
class BadEntry:
    """An entry that cannot be replayed: torn, garbled, the wrong shape, or of an unknown version."""

    path: Path
    #: Its line number in the file, from 1, counting the empty lines appends leave (``sed -n Np``).
    line: int
    #: Why, for a person to read.
    reason: str
    #: The line as it is in the file, without its newline (only the first MiB of a huge non-entry).
    raw: bytes


def encode_entry(batch: Batch) -> bytes:
    """One version-1 entry, newline included. Never raises for the batch's content."""
    body = batch.to_json()
    return b"%s%d %08x %s\n" % (_MAGIC, len(body), zlib.crc32(body), body)


def decode_entry(line: bytes) -> Batch | str:
    """The batch in one line (without its newline), or why it is not one."""
    return _decode(line, len(line))


def _decode(line: bytes, length: int) -> Batch | str:
    """``line`` may be cut short of the ``length`` bytes it has in the file (see ``_lines``)."""
    if line.startswith(b"EG"):
        version = _VERSION.match(line)
        if version is None:
            return "not a spool entry: 'EG' is not followed by a format version and a space"
        number = int(version.group(1))
        if number > FORMAT_VERSION:
            return (
                f"entry format version {number} (written by a newer eventguard: replay it with that"
                f" one): this eventguard reads versions 0 and {FORMAT_VERSION}"
            )
        if number != FORMAT_VERSION:
            return f"unknown entry format version {number} (version 0 entries have no header)"
        header = _HEADER.match(line)
        if header is None:
            return "torn or garbled entry header: expected 'EG1 <length> <crc32> '"
        declared = int(header.group(1))
        found = length - header.end()
        if found < declared:
            return f"torn entry: {found} of its {declared} bytes (cut short: a crash, a full disk)"
        if found > declared:
            return f"garbled entry: {found} bytes where its header says {declared}"
        body = line[header.end() :]
        if zlib.crc32(body) != int(header.group(2), 16):
            return "checksum mismatch: the entry's bytes changed after it was written"
        try:
            return Batch.from_json(body)
        except BatchFormatError as exc:
            return f"not a batch: {exc}"
    if line.startswith(b"{"):  # read whole (see _keep)
        try:
            return Batch.from_json(line)
        except BatchFormatError as exc:
            return f"version-0 line that is not a batch: {exc}"
    return "not a spool entry: neither 'EG<version> ...' nor a version-0 JSON object"


def _keep(head: bytes) -> int:
    """How much of a line that starts with ``head`` is worth keeping in memory."""
    if head.startswith(b"{"):
        return sys.maxsize  # a version-0 entry: it has no length to check against
    header = _HEADER.match(head)
    if header is not None:
        # Anything beyond its declared length makes it bad anyway.
        return header.end() + int(header.group(1)) + 1
    return _CHUNK


def _lines(fh: BinaryIO) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, the line without its newline, its length in the file)``, streaming.

    A line is held in memory whole only when it can be an entry (up to its declared length);
    any other line keeps its first ``_CHUNK`` bytes and the rest is skipped as it is read.
    """
    number = 0
    while True:
        part = fh.readline(_CHUNK)
        if not part:
            return
        number += 1
        if part.endswith(b"\n"):
            yield number, part[:-1], len(part) - 1
            continue
        limit = _keep(part)
        parts = [part]
        kept = length = len(part)
        while True:
            more = fh.readline(_CHUNK)
            if not more:
                break
            ended = more.endswith(b"\n")
            if ended:
                more = more[:-1]
            length += len(more)
            if kept < limit:
                piece = more[: limit - kept]
                parts.append(piece)
                kept += len(piece)
            if ended:
                break
        yield number, b"".join(parts), length


class SpoolFile:
    """One spool file, claimed by this process until :meth:`Spool.done` or :meth:`Spool.release`."""

    __slots__ = ("_bad", "_batches", "_fh", "path")

    def __init__(self, path: Path, fh: BinaryIO) -> None:
        self.path = path
        self._fh: BinaryIO | None = fh
        self._batches: list[Batch] | None = None
        self._bad = 0

    def __repr__(self) -> str:
        return f"SpoolFile({str(self.path)!r}, claimed={self.claimed})"

    @property
    def claimed(self) -> bool:
        return self._fh is not None

    def entries(self) -> Iterator[Batch | BadEntry]:
        """Every entry of the file, in order, streaming: one line in memory at a time.

        Never raises for the file's content: what cannot be loaded is a :class:`BadEntry`.
        One iteration at a time (each starts from the beginning of the file).
        """
        fh = self._claimed()
        fh.seek(0)
        for number, line, length in _lines(fh):
            if not line or line.isspace():
                continue
            found = _decode(line, length)
            if isinstance(found, str):
                if length > len(line):
                    found = f"{found} (a line of {length} bytes: its first {len(line)} kept)"
                yield BadEntry(self.path, number, found, line)
            else:
                yield found

    def size_bytes(self) -> int:
        return os.fstat(self._claimed().fileno()).st_size

    # Kept for callers written before entries(): the whole file in memory, read once.
    @property
    def batches(self) -> list[Batch]:
        """Every batch of the file (loads it whole; prefer :meth:`entries`)."""
        if self._batches is None:
            batches: list[Batch] = []
            bad = 0
            for entry in self.entries():
                if isinstance(entry, BadEntry):
                    bad += 1
                else:
                    batches.append(entry)
            self._batches, self._bad = batches, bad
        return self._batches

    @property
    def bad_lines(self) -> int:
        """How many entries of the file are bad (loads it whole; prefer :meth:`entries`)."""
        self.batches  # noqa: B018  # loads the file, counting the bad entries
        return self._bad

    def _claimed(self) -> BinaryIO:
        if self._fh is None:
            raise ValueError(f"{self.path} is no longer claimed (done or released)")
        return self._fh

    def _close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            fh.close()  # releases the lock


class Spool:
    """The spool at ``path`` and the files set aside from it for replay.

    ``fsync=True`` makes each append durable against power loss (the page cache already survives
    the process crashing) at the cost of a disk flush per append.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        problem = not_a_spool(path)
        if problem is not None:
            # Taken as the spool, the file would be appended to, then set aside by the replay, read
            # as bad entries and removed: a database file or a config file given by mistake, gone.
            raise BadSpoolPath(f"spool_path {str(path)!r} is not a spool file: {problem}")
        if path.is_symlink():
            # The spool is the file the link names (a mounted volume's, say): setting it aside renames
            # it, and a rename of the link would move the link, leave the replayed entries in the
            # target, and send the next appends to a new file where the link was.
            path = Path(os.path.realpath(path))
        self.path = path
        self.fsync = fsync

    def append(self, batches: Iterable[Batch]) -> int:
        """Append ``batches`` as entries, in one write; how many. Raises OSError only."""
        entries = [encode_entry(b) for b in batches]
        if not entries:
            return 0
        data = b"\n" + b"".join(entries)  # the newline first: see "Entry format" above
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open_live()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)  # releases the shared lock
        return len(entries)

    def pending(self) -> bool:
        """Whether anything waits for replay (claimed by another process included)."""
        return self.path.exists() or any(True for _ in self._aside())

    def size_bytes(self) -> int:
        """The bytes waiting for replay: the live file and every file set aside."""
        total = 0
        for path in (self.path, *self._aside()):
            with contextlib.suppress(FileNotFoundError):  # replayed meanwhile
                total += path.stat().st_size
        return total

    def take(self) -> Iterator[SpoolFile]:
        """Each spool file this process could claim, oldest first, the live one set aside first.

        Call :meth:`done` once a file is applied, or :meth:`release` to keep it for the next
        replay. A file still claimed when the iteration is closed early (``break``, an exception)
        is released; one left claimed otherwise is released when it is garbage-collected.
        """
        self._set_aside()
        for path in sorted(self._aside()):
            file = _claim(path)
            if file is None:
                # Another process is replaying it, an append is still writing to it (the file
                # just set aside, for a moment), or it is gone: pending() still sees it, and the
                # next replay takes it. Never waited for: take() runs on the sink's event loop.
                continue
            try:
                yield file
            except GeneratorExit:
                self.release(file)
                raise

    def done(self, file: SpoolFile) -> None:
        """``file`` is applied: remove it and release the claim.

        Its bad entries go with it: :meth:`SpoolFile.entries` handed each to the caller to keep.
        Only a file read through the older :attr:`SpoolFile.batches`, which hands out no bad
        entries, is kept as ``<name>.corrupt-...`` when it had some, for a person to look at.
        """
        if not file.claimed:
            raise ValueError(f"{file.path} is not claimed (already done or released)")
        try:
            # While still holding the claim: no other replay can take it in between.
            if file._bad and file._batches is not None:
                os.replace(file.path, file.path.with_name(file.path.name.replace(_REPLAYING, ".corrupt-")))
            else:
                file.path.unlink(missing_ok=True)
        finally:
            file._close()

    def release(self, file: SpoolFile) -> None:
        """Release the claim on ``file`` and keep it for the next replay (idempotent)."""
        file._close()

    def _set_aside(self) -> Path | None:
        if not self.path.exists():
            return None
        aside = self.path.with_name(
            f"{self.path.name}{_REPLAYING}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        )
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return None  # another replay set it aside first
        return aside

    def _aside(self) -> Iterator[Path]:
        if not self.path.parent.is_dir():
            return
        yield from self.path.parent.glob(f"{_glob_escape(self.path.name)}{_REPLAYING}*")

    def _open_live(self) -> int:
        """The live file, open for appending, under a shared lock, and still the live file.

        A replay may set the file aside between ``open`` and ``flock``: then this writes to the
        new live file instead, so nothing lands in a file that is being (or has been) replayed.
        """
        for _ in range(_APPEND_TRIES):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if _lock(fd, exclusive=False) and _same(fd, self.path):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        # Set aside over and over by replays: append anyway (the next replay takes it).
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # pragma: no cover


def not_a_spool(path: Path) -> str | None:
    """Why the file at ``path`` cannot be a spool, or None (no file there, an empty one, or one
    that starts as a spool does: an entry's ``EG<version> `` header or a version-0 ``{"response_id":``,
    or a first append torn anywhere in them, after the newline each append begins with). A file that
    cannot be read is left to the first append or replay to say so."""
    if "\0" in str(path):  # (os.stat's "embedded null byte" named no argument)
        return "it cannot be a file (a path has no NUL character)"
    try:
        st = path.stat()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # no file can ever be there
            return f"it cannot be a file ({exc.strerror})"
        return None  # not there (yet): the first append says what stops it, and spools meanwhile
    if stat.S_ISDIR(st.st_mode):
        return "it is a directory"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError:
        return None
    head = head.lstrip(b"\r\n")
    # An entry's header (its version, or its first letters: a first append torn there), or a
    # version-0 entry (or its start, torn).
    if not head or _VERSION.match(head) or b"EG".startswith(head) or _V0.startswith(head[: len(_V0)]):
        return None
    return (
        "it holds something else (a spool starts with an entry: 'EG1 ...', or "
        "'{\"response_id\":' in the oldest format)"
    )


#: How a version-0 entry begins: it was always a batch written as JSON, ``response_id`` first. A file
#: that merely starts with ``{`` or ``EG`` (a JSON config, a JSON-lines log, "EGG recipes") is not a
#: spool: taken as one, its replay set it aside, quarantined each line and deleted it.
_V0 = b'{"response_id":'


#: Enough of a file's start to tell a spool from anything else (its leading newlines skipped).
_HEAD_BYTES = 4096


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _same(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _claim(path: Path) -> SpoolFile | None:
    """``path`` open and locked for this process, or None when it cannot be right now (held by
    another open file, or gone). Never waits."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable: the others are still replayed; this one stays pending
        log.error("eventguard sink: cannot open the spool file %s: %s", path, exc)
        return None
    try:
        if not _lock(fh.fileno(), exclusive=True) or not _same(fh.fileno(), path):
            # Held: by another replay, or by an append still writing to the file a replay has just
            # set aside. Or done by another process between our open and our lock.
            fh.close()
            return None
    except BaseException:
        fh.close()
        raise
    return SpoolFile(path, fh)


if sys.platform == "win32":  # pragma: no cover

    def _lock(fd: int, *, exclusive: bool) -> bool:
        return True  # no flock: one replaying process at a time is up to the operator

else:
    import fcntl

    _unlocked_warned = False

    def _lock(fd: int, *, exclusive: bool) -> bool:
        """Take ``flock`` without waiting; False when another open file holds it."""
        global _unlocked_warned
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:  # a file system without flock: carry on, unlocked
            if not _unlocked_warned:
                _unlocked_warned = True
                log.warning(
                    "eventguard sink: cannot lock the spool (%s); replay it from one process only", exc
                )
        return True
