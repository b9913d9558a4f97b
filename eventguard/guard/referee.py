"""The referee: the guard's I/O-free core. Events in; decisions, anomalies and what to forward out.

It classifies the events the hot loop does not forward on its own (lifecycle events, terminals, bad
input, the first event of each output type), checks the lifecycle's transitions, decides endings
through the decision table (``decision.py``: every policy lives there), builds the terminals the guard
synthesises, and records every anomaly through one path (:meth:`Referee.anomaly`). It never awaits:
the cause flags come from the host adapter, records go to the recorder's buffer, and what needs I/O
(closing the inner stream, flushing, giving a task back its cancel) is done by the guard core, which
reads the referee's :class:`Stage` (``STOP*``: finish after this event, closing the inner stream in
the call or in the background). It knows nothing of the watchdog: the core tells it when the inner
stream swallowed the watchdog's cancel (:meth:`Referee.swallowed_cancel`), the watchdog when it
records an ending (:meth:`Referee.record_stuck`, :meth:`Referee.abandoned`).

Its stage, one value (as httpx's ``ClientState``), where booleans used to say it::

    OPEN ──terminal──► AFTER_TERMINAL
      │                     │
      ├──────own ending─────┴──► OWN_ENDING / OWN_ENDING_STUCK ──an event──► STOP / STOP_IN_BACKGROUND
      └──the inner stream swallowed the watchdog's cancel, from any stage──► STOP_STUCK
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Final

from eventguard.decision import NEEDS_START, Decision, Ending, Flags, Forward, decide, settle, unverified
from eventguard.errors import IllegalTransition, InvalidEvent
from eventguard.events import (
    LIFECYCLE_KINDS,
    TERMINAL_TYPES,
    Kind,
    LifecycleEventError,
    ResponseCompleted,
    ResponseFailed,
    ResponseIncomplete,
    ResponseSnapshot,
    event_type_of,
    json_of_model,
    parse_lifecycle_event,
    read_terminal,
)
from eventguard.guard.host import Host
from eventguard.guard.options import GuardOptions
from eventguard.lifecycle import AnomalyKind, ErrorInfo, Lifecycle, State
from eventguard.recording import Recorder

__all__ = ["DROP", "STUCK_MESSAGE", "Referee", "Stage"]

#: Returned for an event that is not forwarded.
DROP: Final = object()
STUCK_MESSAGE: Final = "eventguard: inner stream ignored the cancellation signal past cancel_grace"


class Stage(Enum):
    """Where the referee is in its stream (see the module docstring for the moves between stages)."""

    #: No terminal yet: events are forwarded.
    OPEN = "open"
    #: A terminal was forwarded, synthesised or withheld: anything more is an anomaly, not forwarded.
    AFTER_TERMINAL = "after_terminal"
    #: The guard recorded an ending of its own (:meth:`Referee.own`) because the host stopped iterating:
    #: final. Nothing the inner stream produces is forwarded; the terminal it calls for is, once.
    OWN_ENDING = "own_ending"
    #: The same, because the inner stream was stuck (the watchdog recorded it).
    OWN_ENDING_STUCK = "own_ending_stuck"
    #: The inner stream produced an event after the guard's own ending: finish after the event
    #: returned, closing the inner stream in the call.
    STOP = "stop"
    #: The same after an own ending for a stuck inner stream: its close may be as slow as it was to
    #: return, so it is closed in the background.
    STOP_IN_BACKGROUND = "stop_in_background"
    #: The inner stream swallowed the watchdog's cancel and produced an event: ended as stuck; finish
    #: after the event returned, closing the inner stream in the background.
    STOP_STUCK = "stop_stuck"

    @property
    def stops(self) -> bool:
        """The hot loop finishes after the event just returned."""
        return self in _STOPS

    @property
    def closes_in_background(self) -> bool:
        """The inner stream is closed in the background when the hot loop finishes here."""
        return self in _IN_BACKGROUND

    @property
    def owned(self) -> bool:
        """The guard recorded an ending of its own: final (see :meth:`Referee.own`)."""
        return self in _OWNED


_STOPS: Final = frozenset({Stage.STOP, Stage.STOP_IN_BACKGROUND, Stage.STOP_STUCK})
_IN_BACKGROUND: Final = frozenset({Stage.STOP_IN_BACKGROUND, Stage.STOP_STUCK})
_OWNED: Final = frozenset({Stage.OWN_ENDING, Stage.OWN_ENDING_STUCK, Stage.STOP, Stage.STOP_IN_BACKGROUND})
_PRIMITIVES: Final = (str, bytes, bytearray, int, float, bool, list, tuple, set, type(None))


class Referee:
    """The decisions of one guarded stream, with no I/O and no ``await``."""

    __slots__ = (
        "_host",
        "_owed",
        "_pending",
        "_snapshot",
        "hot",
        "lifecycle",
        "n",
        "options",
        "own_ending",
        "rec",
        "slow",
        "stage",
    )

    def __init__(self, lifecycle: Lifecycle, rec: Recorder | None, options: GuardOptions, host: Host) -> None:
        self.lifecycle = lifecycle
        self.rec = rec
        self.options = options
        self._host = host
        #: Events forwarded so far (the hot loop keeps its own count and writes it back here).
        self.n = 0
        #: Plain str types already seen to need nothing but forwarding: the hot loop forwards them.
        #: Emptied (go_slow) once every event must take the slow path.
        self.hot: set[str] = set()
        self.slow = False
        #: Where the referee is in its stream (see Stage).
        self.stage = Stage.OPEN
        #: The last response snapshot the stream carried: what a synthesised terminal is built on.
        self._snapshot: dict[str, Any] | None = None
        #: A terminal's decision, applied when the inner stream ends (see settle).
        self._pending: Decision | None = None
        #: The decision of the ending the guard recorded on its own (the watchdog: stuck, abandoned),
        #: kept for what it says; ``stage.owned`` says whether there is one.
        self.own_ending: Decision | None = None
        #: The own ending whose terminal is still to be forwarded (None once it was, or when the
        #: stream's own terminal had been forwarded before it).
        self._owed: Decision | None = None

    def flags(self) -> Flags:
        flags = self._host.flags()
        if self._host.unreadable:
            for name, exc in self._host.take_unreadable():
                self.anomaly(
                    AnomalyKind.FLAG_UNREADABLE,
                    f"{name} raised {type(exc).__name__} when read: taken as not set",
                )
        return flags

    def go_slow(self) -> None:
        """From now on every event takes the slow path."""
        self.slow = True
        self.hot.clear()

    def event(self, event: Any) -> Any:
        """An event the hot loop does not forward on its own: what to forward (the event, another
        terminal in its place, or DROP); ``stage`` says when the hot loop must finish after it."""
        etype = event_type_of(event)
        stage = self.stage
        if stage is not Stage.OPEN and stage is not Stage.AFTER_TERMINAL:
            return self._after_own_ending(event, etype)
        if stage is Stage.AFTER_TERMINAL:
            duplicate = isinstance(etype, str) and etype in TERMINAL_TYPES
            kind = AnomalyKind.DUPLICATE_TERMINAL if duplicate else AnomalyKind.EVENT_AFTER_TERMINAL
            self.anomaly(kind, f"{etype!r} after the terminal was not forwarded", etype, event)
            return DROP
        if not isinstance(etype, str) or not etype:
            return self._untyped_event(event, etype)
        kind_ = LIFECYCLE_KINDS.get(etype)
        if kind_ is Kind.TERMINAL:
            return self._on_terminal(event, etype)
        if kind_ is not None:
            self._on_lifecycle_event(event, etype, kind_)
        elif type(etype) is str and not self.slow:
            self.hot.add(etype)  # an output or delta type: the hot path forwards it from now on
        return self._forward(event, etype)

    def _forward(self, event: Any, etype: str | None) -> Any:
        n = self.n
        self.n = n + 1
        # The slow path runs for lifecycle events and terminals: keep the row's count exact there.
        self.lifecycle.events_forwarded = n + 1
        if self.rec is not None:
            self.rec.event(n, etype, event)
        return event

    def _untyped_event(self, event: Any, etype: object) -> Any:
        if isinstance(event, Mapping):
            reason = "event has no 'type'" if etype is None or etype == "" else f"event 'type' is {etype!r}"
            self.anomaly(
                AnomalyKind.MISSING_TYPE,
                f"{reason}; not forwarded: the host cannot accept it",
                None,
                event,
                strict=True,
            )
            return DROP
        if isinstance(event, _PRIMITIVES):
            self.anomaly(
                AnomalyKind.NOT_A_MAPPING,
                f"event is a {type(event).__name__}, not a mapping; not forwarded: the host cannot accept it",
                None,
                event,
                strict=True,
            )
            return DROP
        # An object the guard does not know (a ResponseCheckpointEvent, say): the host's business.
        return self._forward(event, None)

    def _after_own_ending(self, event: Any, etype: object) -> Any:
        """The inner stream produced an event after the guard recorded an ending of its own.

        That ending is final: the event is not forwarded (an anomaly keeps it), the terminal the
        ending calls for is forwarded in its place if none was, the inner stream is closed and the
        guard's stream ends. So the record and the forwarded stream never disagree: a shielded model
        call that returns after a stuck ending cannot forward a late delta and ``response.completed``.
        """
        decision = self.own_ending
        assert decision is not None
        duplicate = isinstance(etype, str) and etype in TERMINAL_TYPES
        self.anomaly(
            AnomalyKind.DUPLICATE_TERMINAL if duplicate else AnomalyKind.EVENT_AFTER_TERMINAL,
            f"{etype!r} produced after the guard recorded its ending ({decision.state.value}, "
            f"{decision.cause.value}); not forwarded",
            etype,
            event,
        )
        out = self.own_terminal()
        # A stuck inner stream may be as slow to close as it was to return: in the background.
        self.stage = Stage.STOP_IN_BACKGROUND if self.stage is Stage.OWN_ENDING_STUCK else Stage.STOP
        return out

    def swallowed_cancel(self, event: Any) -> Any:
        """The inner stream swallowed the cancel the watchdog sent it after ``cancel_grace`` and
        produced ``event`` (the core has given the task its cancel count back): it ends as stuck, the
        event is not forwarded; what to forward in its place (``stage`` is then ``STOP_STUCK``)."""
        etype = event_type_of(event)
        self.settle()
        self.anomaly(
            AnomalyKind.STUCK,
            f"{STUCK_MESSAGE}; it swallowed the cancel and produced {etype!r}, not forwarded",
            etype,
            event,
        )
        self.stage = Stage.STOP_STUCK
        out = DROP
        if not self.lifecycle.terminal:
            out = self.end_with(decide(Ending.STUCK, self.flags(), self.options))
        return out

    def _json_of(self, snapshot: ResponseSnapshot, etype: str, event: Any) -> dict[str, Any]:
        """The response snapshot as JSON values, for the terminal the guard may write in its place."""
        dumped, why = json_of_model(snapshot, exclude_none=True)
        if why is not None:
            self.anomaly(AnomalyKind.NOT_SERIALISABLE, f"{etype}: {why}", etype, event)
        return dict(dumped)

    def _on_lifecycle_event(self, event: Any, etype: str, kind: Kind) -> None:
        lc = self.lifecycle
        try:
            parsed = parse_lifecycle_event(event)
        except LifecycleEventError as exc:
            self.anomaly(AnomalyKind.INVALID_LIFECYCLE_EVENT, f"{etype}: {exc}", etype, event, strict=True)
            return
        snapshot = parsed.response
        if lc.info.response_id is None and snapshot.id:
            lc.info.response_id = snapshot.id
        self._snapshot = self._json_of(snapshot, etype, event)
        if kind is Kind.CREATED:
            target = State.QUEUED if snapshot.status == "queued" else State.IN_PROGRESS
        elif kind is Kind.QUEUED:
            target = State.QUEUED
        else:
            target = State.IN_PROGRESS
        if lc.state is target:
            return
        if target is State.QUEUED and lc.state is State.IN_PROGRESS:
            self.anomaly(
                AnomalyKind.OUT_OF_ORDER, f"{etype} after response.in_progress", etype, None, strict=True
            )
            return
        try:
            lc.transition(target, reason=etype)
        except IllegalTransition as exc:
            self.anomaly(AnomalyKind.ILLEGAL_TRANSITION, str(exc), etype, None, strict=True)
            return
        if self.rec is not None:
            self.rec.changed()

    def _on_terminal(self, event: Any, etype: str) -> Any:
        lc = self.lifecycle
        flags = self.flags()  # at this moment, not later: see the README
        self.stage = Stage.AFTER_TERMINAL
        self.go_slow()
        unreadable = False
        try:
            parsed = parse_lifecycle_event(event)
        except LifecycleEventError as exc:
            self.anomaly(AnomalyKind.INVALID_LIFECYCLE_EVENT, f"{etype}: {exc}", etype, event)
            unreadable = True
            ending = {"response.completed": Ending.COMPLETED, "response.incomplete": Ending.INCOMPLETE}.get(
                etype, Ending.FAILED
            )
        else:
            assert isinstance(parsed, ResponseCompleted | ResponseIncomplete | ResponseFailed)
            claim = read_terminal(parsed)
            if claim.mismatch:
                self.anomaly(
                    AnomalyKind.STATUS_MISMATCH,
                    claim.mismatch + "; the event type wins",
                    etype,
                    None,
                    strict=True,
                )
            if lc.info.response_id is None and parsed.response.id:
                lc.info.response_id = parsed.response.id  # a stream whose start was missing or unreadable
            if claim.usage is not None:
                lc.usage = claim.usage
            if claim.error is not None:
                lc.error = claim.error
            ending = Ending(claim.state.value)
            self._snapshot = self._json_of(parsed.response, etype, event)
        decision = decide(ending, flags, self.options)
        if unreadable:
            # Forwarded as it is, so recorded as it claims: never as a failure, but not verified.
            decision = unverified(decision, f"{etype} could not be read")
        if ending is Ending.CANCELLED and not flags.client_cancelled:
            self.anomaly(
                AnomalyKind.CANCEL_WITHOUT_CLIENT_CANCEL,
                "the inner stream reported a cancel the host did not ask for",
                etype,
                None,
            )
        if decision.state is State.CANCELLED or lc.ended:
            self.apply(decision)
        else:
            # Settled when the inner stream ends (see _settle): a client cancel that lands between
            # this terminal and the end of the stream still makes the host report cancelled.
            self._pending = decision
        forward = decision.forward
        if forward is Forward.PASS:
            return self._forward(event, etype)
        if forward is Forward.NOTHING:
            self.anomaly(AnomalyKind.TERMINAL_WITHHELD, f"{etype} withheld: {decision.reason}", etype, event)
            return DROP
        self.anomaly(AnomalyKind.TERMINAL_REPLACED, f"{etype} replaced: {decision.reason}", etype, event)
        if forward is Forward.CANCELLED:
            return self._forward(self._synthesise("cancelled", None, None), "response.failed")
        return self._forward(
            self._synthesise("failed", "server_shutdown", decision.reason), "response.failed"
        )

    def _synthesise(self, status: str, code: str | None, message: str | None) -> Any:
        """A ``response.failed`` terminal built on the last response snapshot; DROP if none exists."""
        if self._snapshot is None:
            # Without a created event the host would refuse any terminal: forward nothing, say so.
            self.anomaly(
                AnomalyKind.MISSING_TERMINAL,
                f"no response.{status} forwarded: the stream never produced response.created",
            )
            return DROP
        response = dict(self._snapshot)
        response["status"] = status
        if code is None:
            response.pop("error", None)
        else:
            response["error"] = {"code": code, "message": message or code}
        if self.stage is Stage.OPEN:
            self.stage = Stage.AFTER_TERMINAL
        self.go_slow()
        return {"type": "response.failed", "response": response}

    def anomaly(
        self,
        kind: AnomalyKind,
        reason: str,
        etype: object = None,
        event: Any = None,
        *,
        strict: bool = False,
    ) -> None:
        """Record an anomaly (the one path every anomaly takes): noted on the lifecycle at the current
        event index, with the event's type and the event itself when there is one; in strict mode, a
        ``strict`` one raises ``InvalidEvent`` instead of being let through."""
        self.lifecycle.note(
            kind,
            reason,
            event_type=etype if isinstance(etype, str) else None,
            event_index=self.n,
            payload=event,
        )
        if self.rec is not None:
            self.rec.changed()
        if strict and self.options.strict:
            raise InvalidEvent(reason)

    def settle(self) -> None:
        """Apply the terminal's decision, now that the inner stream has ended (or the guard has):
        by the flags at this end, as ``decision.settle`` says."""
        decision = self._pending
        if decision is None:
            return
        self._pending = None
        self.apply(settle(decision, self.flags()))

    def apply(self, decision: Decision) -> None:
        """Move the lifecycle to the decided ending, or explain why it could not."""
        lc = self.lifecycle
        lc.events_forwarded = self.n
        if decision.state in NEEDS_START and lc.state in (State.NEW, State.INTERRUPTED):
            # A completion the stream never started (its created event was missing or could not be
            # read): the record follows what was forwarded, through an implied start, unverified.
            lc.transition(
                State.IN_PROGRESS, reason="implied by the terminal: the stream never reported its start"
            )
            decision = unverified(decision, "the stream never reported its start")
        if decision.steering_cut_short:
            lc.steering_cut_short = True
        if decision.unverified:
            lc.unverified = True
            self.anomaly(AnomalyKind.UNVERIFIED_COMPLETION, decision.reason)
        if lc.state is not decision.state:
            try:
                lc.transition(decision.state, cause=decision.cause, reason=decision.reason)
            except IllegalTransition as exc:
                self.anomaly(AnomalyKind.ILLEGAL_TRANSITION, str(exc))
                if not lc.ended:
                    # Never leave a stream that is over looking as if it were still running.
                    lc.transition(State.FAILED, cause=decision.cause, reason=f"refused: {exc.reason}")
        if self.rec is not None:
            self.rec.changed()

    def end_with(self, decision: Decision) -> Any:
        """Apply a decision reached without a terminal from the inner stream; what to forward."""
        self.apply(decision)
        return self._terminal_for(decision)

    def own_terminal(self) -> Any:
        """The terminal the guard's own ending calls for, once, when the consumer is back to take it."""
        decision = self._owed
        if decision is None:
            return DROP
        self._owed = None
        return self._terminal_for(decision)

    def _terminal_for(self, decision: Decision) -> Any:
        """The terminal to forward for a decision reached without one from the inner stream."""
        synthesised: Any = DROP
        if decision.forward is Forward.FAILED_MISSING_TERMINAL:
            synthesised = self._synthesise("failed", decision.cause.value, decision.reason)
        elif decision.forward is Forward.CANCELLED:
            synthesised = self._synthesise("cancelled", None, None)
        if synthesised is not DROP:
            return self._forward(synthesised, "response.failed")
        if decision.cause.value == "missing_terminal":
            self.anomaly(AnomalyKind.MISSING_TERMINAL, decision.reason)
        return DROP

    def abandoned(self, grace: float) -> None:
        """``grace`` after the cause, with the guard between steps: a host that stopped iterating."""
        flags = self.flags()
        if flags.client_cancelled or flags.shutdown:
            self.settle()
        if not self.lifecycle.ended and (flags.client_cancelled or flags.shutdown):
            # The host stopped iterating and may never resume or close us: record the ending now.
            self.anomaly(
                AnomalyKind.ABANDONED,
                f"the host stopped iterating for {grace}s after the signal; ending recorded without it",
            )
            self.own(decide(Ending.ABANDONED, flags, self.options), stuck=False)

    def record_stuck(self, reason: str) -> None:
        """Record a stuck ending while the consumer is still blocked in the inner stream's await."""
        self.anomaly(AnomalyKind.STUCK, reason)
        self.settle()
        if not self.lifecycle.terminal:
            self.own(decide(Ending.STUCK, self.flags(), self.options), stuck=True)
        elif self.rec is not None:
            self.rec.changed()

    # -- endings: what the guard core asks when the inner stream, the consumer or the watchdog ends it --

    def finished(self) -> None:
        """The guard is ending: the terminal's decision settled, every event on the slow path, the
        count of forwarded events on the lifecycle."""
        self.settle()
        self.go_slow()
        self.lifecycle.events_forwarded = self.n

    def release(self) -> None:
        """The guard has ended and flushed: let go of the recorder and of the last response snapshot
        (a terminal's carries the whole output); the decisions and the lifecycle stay."""
        self.rec = None
        self._snapshot = None

    def ended_by(self, ending: Ending) -> None:
        """The guard ended by ``ending`` (the consumer closed it, a cancel reached it) before the
        inner stream ended: the ending decided, unless the lifecycle has one already."""
        self.settle()
        if not self.lifecycle.ended:
            self.apply(decide(ending, self.flags(), self.options))

    def stream_ended(self) -> Any:
        """The inner stream returned: the terminal to forward in its place, if any (or DROP)."""
        self.settle()
        if self.stage.owned:
            return self.own_terminal()
        if self.stage is Stage.OPEN and not self.lifecycle.terminal:
            return self.end_with(decide(Ending.NO_TERMINAL, self.flags(), self.options))
        return DROP

    def stuck(self) -> Any:
        """Our stuck-stream cancel reached the guard and was taken back: the terminal to forward."""
        self.settle()
        self.anomaly(AnomalyKind.STUCK, STUCK_MESSAGE)
        if self.stage is Stage.OPEN and not self.lifecycle.terminal:
            return self.end_with(decide(Ending.STUCK, self.flags(), self.options))
        return DROP

    def raised(self, exc: BaseException, ending: Ending) -> None:
        """The inner stream (or the guard itself) raised ``exc``, which ends the stream by ``ending``:
        the error noted and the ending decided, unless the guard's own ending or a terminal stands."""
        self.settle()
        lc = self.lifecycle
        if not self.stage.owned and (not lc.ended or lc.state is State.INTERRUPTED):
            decision = decide(ending, self.flags(), self.options)
            lc.error = ErrorInfo(code=None, message=_short(str(exc)), exception_type=_qualname(type(exc)))
            self.apply(decision)

    def own(self, decision: Decision, *, stuck: bool) -> None:
        """Record an ending the guard reached on its own, while the inner stream still runs: final.

        From now on nothing the inner stream produces is forwarded (see _after_own_ending), so
        that the recorded ending and the forwarded stream never disagree. ``stuck``: the inner stream
        was stuck (not a host that stopped iterating), so it is closed in the background.
        """
        self.apply(decision)
        self.own_ending = decision
        # The terminal this ending calls for is owed unless the stream's own was already forwarded.
        self._owed = decision if self.stage is Stage.OPEN else None
        self.stage = Stage.OWN_ENDING_STUCK if stuck else Stage.OWN_ENDING
        self.go_slow()


def _qualname(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
