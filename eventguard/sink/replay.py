"""Replaying the spool: loading what the database did not take, once it takes writes again.

The sink replays by itself, in the background, beside new writes (chunk by chunk, each under the
write lock, so new writes go in between): when it starts, when the database is back after an
outage, and when a write succeeds after anything was spooled without one (an overflow spill, a
stream cut short), at most once a second while a file another process holds is left. A replay an
error stopped releases its file, kept whole, and the next is tried after a back-off of its own
(doubling, from a tenth of a second to half a minute). :meth:`Replayer.replay_spool` is the
explicit replay (``eventguard spool replay``): it joins a background one, then loads what is left.

A spool entry that cannot be read goes to the quarantine (origin ``spool``); a batch the database
refuses goes there as a write does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from eventguard.sink import quarantine
from eventguard.sink.apply import Refusal, Stopped, Tally
from eventguard.sink.batch import Batch
from eventguard.sink.commit import REPLAYING, Committer
from eventguard.sink.loops import Loops, LoopState
from eventguard.sink.quarantine import QuarantineRecord
from eventguard.sink.report import Reporter, log
from eventguard.sink.spool import Spool

__all__ = ["REPLAY_CHUNK", "ReplayResult", "ReplayTarget", "Replayer", "entries"]

#: Batches per transaction when replaying the spool.
REPLAY_CHUNK = 200
#: Spool entries read (and parsed) between two turns of the event loop while replaying.
_REPLAY_YIELD = 4
#: The least time between two replays started by successful writes, when a replay left files.
_REPLAY_RETRY = 1.0
#: After a replay an error stopped, the next waits this long, doubling up to the maximum.
_REPLAY_BACKOFF_FIRST = 0.1
_REPLAY_BACKOFF_MAX = 30.0


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay of the spool did."""

    files: int
    batches: int
    #: Events handed to the database (those already there are a no-op).
    events: int
    #: Spool entries that could not be read (each is in the quarantine, origin ``spool``).
    bad_lines: int
    refusals: tuple[Refusal, ...]
    #: Quarantine records written by this replay (refused batches, duplicates, bad entries).
    quarantined: int = 0


class ReplayTarget(Protocol):
    """What a replay asks of the writer whose spool it loads (:class:`~eventguard.sink.writer.Writer`)."""

    @property
    def spool(self) -> Spool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def report(self) -> Reporter: ...

    async def ensure_ready(self, *, replay: bool = True) -> None: ...
    def recovered(self) -> None: ...


class Replayer:
    """Replays one sink's spool: ``target`` is the writer, ``committer`` writes the batches, on
    the loops of ``loops``; ``name``: the sink's name, for its task."""

    def __init__(
        self, target: ReplayTarget, committer: Committer, loops: Loops, name: Callable[[], str]
    ) -> None:
        self._target = target
        self._committer = committer
        self._loops = loops
        self._name = name
        #: Set whenever something is spooled: the next successful write replays the spool.
        self.spooled = False
        #: Before this (time.monotonic()), a successful write does not start a replay for
        #: ``spooled`` alone (a file another process replays must not be looked at every cycle).
        self.replay_after = 0.0
        self._backoff = _REPLAY_BACKOFF_FIRST

    def due(self) -> bool:
        """Whether a successful write should replay what was spooled without an outage."""
        return self.spooled and time.monotonic() >= self.replay_after

    def soon(self) -> None:
        """Replay the spool in the background (beside new writes, chunk by chunk), if it has anything."""
        st = self._loops.live
        if (
            st is None
            or self._target.closed
            or st.stopping
            or (st.replay is not None and not st.replay.done())
        ):
            return
        try:
            pending = self._target.spool.pending()
        except OSError:
            return
        self.spooled = False  # what is spooled from now on is replayed by the next call
        if pending:
            # In a context of its own, as the writer's task (writer.ensure_writer).
            st.replay = contextvars.Context().run(
                st.loop.create_task, self._background(), name=f"eventguard-replay {self._name()}"
            )

    async def _background(self) -> ReplayResult | None:
        target = self._target
        try:
            result = await self.run()
        except Exception as exc:
            # Its file is released, kept whole; run() set when to try again.
            log.warning(
                "eventguard sink: replaying %s stopped (%s); it goes on when the database is back",
                target.spool.path,
                target.report.why(exc),
            )
            return None
        try:
            left = target.spool.pending()
        except OSError:
            left = True
        if left:
            # Appended since it began, or a file another process holds (or an append was still
            # writing to): the next successful write replays again, at most once a second.
            self.spooled = True
            self.replay_after = time.monotonic() + _REPLAY_RETRY
        if result.batches or result.bad_lines:
            log.warning(
                "eventguard sink: replayed %d batches (%d events) from %s; %d quarantined",
                result.batches,
                result.events,
                target.spool.path,
                result.quarantined,
            )
        return result

    async def replay_spool(self) -> ReplayResult:
        """Load the spool into the database, idempotently; see ``SqlSink.replay_spool``."""
        st = self._loops.here()
        total = Tally()
        files = 0
        running = st.replay
        if running is not None and not running.done():
            await asyncio.wait([running])
            joined = None if running.cancelled() or running.exception() else running.result()
            if joined is not None:
                files += joined.files
                total.add(_tally_of(joined))
        own = await self.run()
        files += own.files
        total.add(_tally_of(own))
        return ReplayResult(
            files, total.batches, total.events, total.bad, tuple(total.refusals), total.quarantined
        )

    async def run(self) -> ReplayResult:
        """One replay of every spool file this process can claim, on the running loop."""
        target = self._target
        st = self._loops.here()
        tally = Tally()
        files = 0
        async with st.replay_lock:
            replaying = REPLAYING.set(True)
            try:
                async with st.lock:
                    await target.ensure_ready(replay=False)
                spool = target.spool
                taken = spool.take()
                try:
                    for file in taken:
                        try:
                            await self._file(st, file, tally)
                        except BaseException:
                            _release(spool, file)
                            raise
                        spool.done(file)
                        files += 1
                finally:
                    close = getattr(taken, "close", None)
                    if close is not None:
                        close()
            except BaseException:
                # Stopped (an outage, a cancelled task): what is left stays in the spool, and
                # the first write that goes through after a back-off of its own (doubling, from
                # a tenth of a second to half a minute) replays it again, not the next start.
                self.spooled = True
                self.replay_after = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, _REPLAY_BACKOFF_MAX)
                raise
            finally:
                REPLAYING.reset(replaying)
            self._backoff = _REPLAY_BACKOFF_FIRST
        target.report.refused(tally.refusals)
        return ReplayResult(
            files, tally.batches, tally.events, tally.bad, tuple(tally.refusals), tally.quarantined
        )

    async def _file(self, st: LoopState, file: Any, tally: Tally) -> None:
        chunk: list[Batch] = []
        bad: list[QuarantineRecord] = []
        for n, entry in enumerate(entries(file, tally), 1):
            if n % _REPLAY_YIELD == 0:
                # Each entry is read and parsed on the event loop the streams share: a turn
                # for them every few entries, not once per chunk of REPLAY_CHUNK.
                await asyncio.sleep(0)
            if isinstance(entry, Batch):
                chunk.append(entry)
                if len(chunk) >= REPLAY_CHUNK:
                    await self._chunk(st, chunk, tally)
                    chunk = []
                continue
            tally.bad += 1
            bad.append(_bad_entry(entry))
            if len(bad) >= REPLAY_CHUNK:
                tally.quarantined += await self._committer.quarantine(bad)
                bad = []
        if chunk:
            await self._chunk(st, chunk, tally)
        if bad:
            tally.quarantined += await self._committer.quarantine(bad)

    async def _chunk(self, st: LoopState, chunk: list[Batch], tally: Tally) -> None:
        target = self._target
        async with st.lock:  # taken per chunk: new writes go in between
            try:
                await self._committer.apply(chunk, tally)
            except Stopped as stop:
                target.report.stats.last_error = target.report.why(stop.cause)
                raise stop.cause from None
            target.recovered()


def _tally_of(result: ReplayResult) -> Tally:
    return Tally(result.batches, result.events, result.quarantined, result.bad_lines, [*result.refusals])


def entries(file: Any, tally: Tally) -> Iterator[Any]:
    """A spool file's entries, streaming (``SpoolFile.entries()``), or, from a spool module
    without it, its batches (unreadable lines counted in ``tally``, kept by the spool itself)."""
    read = getattr(file, "entries", None)
    if callable(read):
        yield from read()
        return
    yield from file.batches
    tally.bad += int(getattr(file, "bad_lines", 0))


def _release(spool: Spool, file: Any) -> None:
    release = getattr(spool, "release", None)
    if release is not None:
        with contextlib.suppress(Exception):
            release(file)


def _bad_entry(entry: Any) -> QuarantineRecord:
    raw = getattr(entry, "raw", b"")
    return quarantine.entry(
        "spool",
        f"unreadable spool entry: {getattr(entry, 'reason', entry)}",
        {
            "path": str(getattr(entry, "path", "")),
            "line": getattr(entry, "line", None),
            "raw": raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw,
        },
    )
