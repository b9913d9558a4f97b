"""Says what eventguard corrected: a log line, a span event and a metric for every anomaly and ending.

Every anomaly a lifecycle records (the guard's and the sink's alike: they all go through
:meth:`Lifecycle.note <eventguard.lifecycle.Lifecycle.note>`) is logged as one line on the
``eventguard.anomaly`` logger, with the response id, the attempt, the kind and the reason:

- at ``WARNING`` for a *correction*: the stream said something untrue and eventguard recorded (and,
  for a terminal, forwarded) the truth instead (:data:`eventguard.lifecycle.CORRECTIONS`: a terminal
  replaced or withheld, a status that contradicts its event type, a cancel nobody asked for, a
  completion kept unverified);
- at ``INFO`` for every other anomaly.

Both levels are settings (:class:`Reporting`, :func:`set_reporting`); the logger's own level and
handlers are the application's, as usual. Stored text is escaped (no control characters, escapes or
bidi overrides reach a log line) and cut to a bounded length.

When OpenTelemetry's API is installed (the host installs it; ``pip install opentelemetry-api``
otherwise) and a span is recording, each anomaly is also an event on its response's span:
``eventguard.correction`` or ``eventguard.anomaly``. For the guard's, that is the span current where
the guard noticed it (the host's span for the response); for the sink's, which its writer records
from a task of its own, the span that was current where the response's recorder was made (the
guard's); a batch read back from the spool reports on no span. And these metrics are reported, on
the meter ``eventguard`` (names follow OpenTelemetry's naming guidelines: dotted, lower case, the unit
apart, no ``_total``):

- ``eventguard.response.ended``: counter, ``{response}``; by ``eventguard.response.status`` and
  ``eventguard.response.cause``.
- ``eventguard.anomaly``: counter, ``{anomaly}``; by ``eventguard.anomaly.kind`` and
  ``eventguard.correction``.

And for each sink, by ``db.system.name`` (``sqlite``, ``postgresql``) and ``eventguard.sink.owner``:

- ``eventguard.sink.buffered``: observable up-down counter, ``{event}``: events buffered, waiting
  for the writer (the queue depth; at most ``max_buffered``).
- ``eventguard.sink.spool.size``: observable up-down counter, ``By``: bytes in the spool, waiting for
  a replay.
- ``eventguard.sink.batches``: observable counter, ``{batch}``; by ``eventguard.sink.outcome``
  (``written``, ``spooled``).
- ``eventguard.sink.events.written``: observable counter, ``{event}``.
- ``eventguard.sink.overflows``: observable counter: back-pressure, the buffer reached
  ``max_buffered`` and spilled to the spool.
- ``eventguard.sink.refusals``: observable counter: stream statuses the database refused (another
  stream or sink holds the response's terminal).
- ``eventguard.sink.quarantined``: observable counter, ``{record}``: records put in the quarantine.
- ``eventguard.sink.write.duration``: histogram, ``s``: one record per committed write transaction.

The sink metrics read each :class:`~eventguard.sink.SqlSink`'s own figures (its ``stats``, its
buffer, its spool file's size) when the application's reader collects, so the hot path pays
nothing for them; only the write-duration histogram records once per commit. A sink is reported
from when it is built until it is garbage-collected (sinks are held weakly); its
``eventguard.sink.owner`` (``SqlSink(owner=...)``) tells two sinks of one process apart. Without
OpenTelemetry nothing is imported and nothing is reported but the log lines. All of this runs a
handful of times per response, never per event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from eventguard._text import one_line

if TYPE_CHECKING:
    # Types only: lifecycle imports this module, and its anomaly kinds carry their own
    # ``correction`` flag (lifecycle.CORRECTIONS).
    from eventguard.lifecycle import Anomaly, AnomalyKind, Lifecycle, Transition
    from eventguard.sink import SqlSink

__all__ = ["Reporting", "report_anomaly", "reporting", "set_reporting", "watch_sink"]

log = logging.getLogger("eventguard.anomaly")


@dataclasses.dataclass(frozen=True, slots=True)
class Reporting:
    """How anomalies and endings are reported (one value for the process; see :func:`set_reporting`).

    :param correction_level: the log level of a correction (an anomaly whose kind is in
        :data:`eventguard.lifecycle.CORRECTIONS`); ``None`` logs none.
    :param anomaly_level: the log level of every other anomaly; ``None`` logs none.
    :param opentelemetry: report span events and metrics through OpenTelemetry when its API is
        installed; ``False`` never imports it.
    :param meter_provider: the OpenTelemetry ``MeterProvider`` to report metrics to; ``None`` is the
        global one (``opentelemetry.metrics.get_meter_provider()``, set by the application).
    """

    correction_level: int | None = logging.WARNING
    anomaly_level: int | None = logging.INFO
    opentelemetry: bool = True
    meter_provider: Any = None


_reporting = Reporting()
_UNSET: Final = object()
#: The built _Otel, None when OpenTelemetry is not importable, _UNSET before the first use.
_otel_state: Any = _UNSET
#: The sinks the observable instruments read, weakly: a sink nobody holds any more is not reported.
_sinks: weakref.WeakSet[SqlSink] = weakref.WeakSet()


def _failed(what: str) -> None:
    """Say, at DEBUG, that reporting failed (``what``); never raises. The handler that made it fail
    may be the one this line goes to: a second error from it must not reach the stream either."""
    with contextlib.suppress(Exception):  # nowhere left to say it; the stream goes on
        log.debug(what, exc_info=True)


def reporting() -> Reporting:
    """The settings in force."""
    return _reporting


def set_reporting(settings: Reporting) -> Reporting:
    """Put ``settings`` in force for every lifecycle from now on, and for the metrics of every sink
    already built; returns the settings it replaced."""
    global _reporting, _otel_state
    before, _reporting = _reporting, settings
    _otel_state = _UNSET  # the instruments are made again, for the provider now in force
    if settings.opentelemetry and len(_sinks):
        # ... at once where sinks are watched: their observable figures are read at the new
        # provider's first collection, not from the next anomaly or ending.
        try:
            _otel()
        except Exception:  # as watch_sink: telemetry never breaks the application
            _failed("eventguard: setting up the sink's metrics failed")
    return before


def anomaly_noted(lifecycle: Lifecycle, anomaly: Anomaly) -> None:
    """Report one anomaly a lifecycle recorded (see :func:`report_anomaly`)."""
    report_anomaly(
        lifecycle.info.response_id, anomaly.attempt, anomaly.kind, anomaly.reason, anomaly.event_type
    )


def response_span() -> object | None:
    """The span that is current and recording, to report a response's anomalies on later, from
    another task; None without one (or with OpenTelemetry off). Never raises.

    The sink's writer works for every response in a task of its own, whose current span is none of
    theirs: each recorder takes its response's span with this when it is made.
    """
    if not _reporting.opentelemetry:
        return None
    try:
        otel = _otel()
        return otel.recording_span() if otel is not None else None
    except Exception:  # as report_anomaly: telemetry never breaks a stream
        _failed("eventguard: reading the current span failed")
        return None


#: ``report_anomaly``'s default span: the one current where it is called.
CURRENT_SPAN: Final = object()


def report_anomaly(
    response_id: str | None,
    attempt: int,
    kind: AnomalyKind,
    reason: str,
    event_type: str | None = None,
    *,
    span: object | None = CURRENT_SPAN,
) -> None:
    """Report one anomaly: a log line, a span event, a count. Never raises.

    The guard's anomalies come here through :meth:`Lifecycle.note`, in the response's own task, and
    go on the current span. The sink's (a value escaped, a batch refused, a duplicate stream) are
    reported by the sink's writer when it records them, with the ``span`` its response had
    (:func:`response_span`; None: on no span, as for a batch read back from the spool).
    """
    settings = _reporting
    correction = kind.correction
    level = settings.correction_level if correction else settings.anomaly_level
    try:
        if level is not None and log.isEnabledFor(level):
            log.log(
                level,
                "eventguard: response %s (attempt %d): %s%s: %s",
                one_line(response_id or "(no id)", 200),
                attempt,
                "corrected, " if correction else "",
                kind.value,
                one_line(reason),
            )
        if settings.opentelemetry:
            otel = _otel()
            if otel is not None:
                otel.anomaly(response_id, attempt, kind, reason, event_type, correction, span)
    except Exception:  # reporting must never break a stream; CancelledError is not an Exception
        _failed("eventguard: reporting an anomaly failed")


def response_ended(lifecycle: Lifecycle, step: Transition) -> None:
    """Count one ending by its state and cause. Never raises."""
    if not _reporting.opentelemetry:
        return
    try:
        otel = _otel()
        if otel is not None:
            otel.ended(step)
    except Exception:  # as above
        _failed("eventguard: reporting an ending failed")


def watch_sink(sink: SqlSink) -> None:
    """Report ``sink``'s metrics (see the module's table). ``SqlSink`` calls it when it is built.

    Its figures are read when a metric reader collects; its commits are timed through
    ``sink.stats.on_write``. With OpenTelemetry off (:class:`Reporting`) nothing is reported.
    """
    _sinks.add(sink)
    attributes = {"db.system.name": _system_name(sink), "eventguard.sink.owner": one_line(sink.owner, 200)}
    sink.stats.on_write = lambda seconds: _wrote(seconds, attributes)
    if _reporting.opentelemetry:
        try:
            _otel()  # the observable instruments exist from now on, not from the first anomaly
        except Exception:  # as above: telemetry never breaks the sink
            _failed("eventguard: setting up the sink's metrics failed")


def _wrote(seconds: float, attributes: dict[str, str]) -> None:
    if not _reporting.opentelemetry:
        return
    try:
        otel = _otel()
        if otel is not None:
            otel.write_duration.record(seconds, attributes)
    except Exception:  # as above
        _failed("eventguard: reporting a write failed")


_WRITE_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)


def _system_name(sink: SqlSink) -> str:
    # OpenTelemetry's db.system.name values: "sqlite", "postgresql".
    return str(sink.url.get_backend_name())


class _Otel:
    """The OpenTelemetry side, built once, on first use, only when the API is importable."""

    def __init__(self, trace: Any, metrics: Any, meter_provider: Any) -> None:
        self._trace = trace
        meter = metrics.get_meter("eventguard", _version(), meter_provider=meter_provider)
        self._ended = meter.create_counter(
            "eventguard.response.ended", unit="{response}", description="Responses ended, by status and cause"
        )
        self._anomalies = meter.create_counter(
            "eventguard.anomaly", unit="{anomaly}", description="Anomalies recorded, by kind"
        )
        self._observation = metrics.Observation
        self.write_duration = meter.create_histogram(
            "eventguard.sink.write.duration",
            unit="s",
            description="Duration of the sink's write transactions",
            # OpenTelemetry's advice for durations in seconds, from a millisecond (the SDK's default
            # buckets are for milliseconds: every SQLite commit would fall in the first)
            explicit_bucket_boundaries_advisory=_WRITE_BUCKETS,
        )
        up_down, counter = meter.create_observable_up_down_counter, meter.create_observable_counter
        for make, name, unit, description, read in (
            (up_down, "buffered", "{event}", "Events buffered, waiting for the writer", _buffered),
            (up_down, "spool.size", "By", "Bytes in the spool, waiting for a replay", _spool_size),
            (counter, "batches", "{batch}", "Batches written or spooled", _batches),
            (counter, "events.written", "{event}", "Events written", _events_written),
            (
                counter,
                "overflows",
                "{overflow}",
                "Times the buffer was full and spilled to the spool",
                _overflows,
            ),
            (counter, "refusals", "{refusal}", "Stream statuses the database refused", _refusals),
            (counter, "quarantined", "{record}", "Records put in the quarantine", _quarantined),
        ):
            make(
                f"eventguard.sink.{name}", callbacks=[self._observe(read)], unit=unit, description=description
            )

    def _observe(
        self, read: Callable[[SqlSink], Iterator[tuple[float, dict[str, str]]]]
    ) -> Callable[[Any], list[Any]]:
        def callback(_options: Any) -> list[Any]:
            found: list[Any] = []
            if not _reporting.opentelemetry:  # turned off after these instruments were made
                return found
            for sink in list(_sinks):
                try:
                    base = {
                        "db.system.name": _system_name(sink),
                        "eventguard.sink.owner": one_line(sink.owner, 200),
                    }
                    found += [self._observation(value, {**base, **extra}) for value, extra in read(sink)]
                except Exception:  # one sink that cannot say does not hide the others
                    _failed("eventguard: reading a sink's figures failed")
            return found

        return callback

    def anomaly(
        self,
        response_id: str | None,
        attempt: int,
        kind: AnomalyKind,
        reason: str,
        event_type: str | None,
        correction: bool,
        span: Any,
    ) -> None:
        self._anomalies.add(1, {"eventguard.anomaly.kind": kind.value, "eventguard.correction": correction})
        if span is CURRENT_SPAN:
            span = self._trace.get_current_span()
        if span is not None and span.is_recording():
            attributes: dict[str, Any] = {
                "eventguard.anomaly.kind": kind.value,
                "eventguard.anomaly.reason": one_line(reason),
                "eventguard.attempt": attempt,
            }
            if response_id is not None:
                attributes["eventguard.response.id"] = one_line(response_id, 200)
            if event_type is not None:
                attributes["eventguard.event.type"] = one_line(event_type, 200)
            span.add_event("eventguard.correction" if correction else "eventguard.anomaly", attributes)

    def recording_span(self) -> Any:
        span = self._trace.get_current_span()
        return span if span.is_recording() else None

    def ended(self, step: Transition) -> None:
        cause = step.cause.value if step.cause is not None else "none"
        self._ended.add(
            1, {"eventguard.response.status": step.to_state.value, "eventguard.response.cause": cause}
        )


def _buffered(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.buffered, {}


def _spool_size(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.spool.size_bytes(), {}


def _batches(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.stats.batches_written, {"eventguard.sink.outcome": "written"}
    yield sink.stats.batches_spooled, {"eventguard.sink.outcome": "spooled"}


def _events_written(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.stats.events_written, {}


def _overflows(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.stats.overflows, {}


def _refusals(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield len(sink.stats.refusals), {}


def _quarantined(sink: SqlSink) -> Iterator[tuple[float, dict[str, str]]]:
    yield sink.stats.quarantined, {}


def _otel() -> _Otel | None:
    global _otel_state
    if _otel_state is _UNSET:
        try:
            from opentelemetry import metrics, trace
        except ImportError:
            _otel_state = None
        else:
            _otel_state = _Otel(trace, metrics, _reporting.meter_provider)
    return _otel_state  # type: ignore[no-any-return]


def _version() -> str:
    try:
        return importlib.metadata.version("eventguard")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"
