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
otherwise) and a span is recording, each anomaly is also an event on the *current* span (the host's
span for the response, when the guard noticed it): ``eventguard.correction`` or
``eventguard.anomaly``. And these metrics are reported, on the meter ``eventguard`` (names follow
OpenTelemetry's naming guidelines: dotted, lower case, the unit apart, no ``_total``):

============================== ============== ==========================================================
name                           instrument     attributes
============================== ============== ==========================================================
``eventguard.response.ended``  counter        ``eventguard.response.status``, ``eventguard.response.cause``
``eventguard.anomaly``         counter        ``eventguard.anomaly.kind``, ``eventguard.correction``
============================== ============== ==========================================================

The sink's own metrics (queue depth, spool size, refusals, write latency) are in
:mod:`eventguard.sink`'s documentation. Without OpenTelemetry nothing is imported and nothing is
reported but the log lines. All of this runs a handful of times per response, never per event.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from typing import TYPE_CHECKING, Any, Final

from eventguard._text import one_line

if TYPE_CHECKING:
    # Types only: lifecycle imports this module, and its anomaly kinds carry their own
    # ``correction`` flag (lifecycle.CORRECTIONS).
    from eventguard.lifecycle import Anomaly, AnomalyKind, Lifecycle, Transition

__all__ = ["Reporting", "report_anomaly", "reporting", "set_reporting"]

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


def reporting() -> Reporting:
    """The settings in force."""
    return _reporting


def set_reporting(settings: Reporting) -> Reporting:
    """Put ``settings`` in force for every lifecycle from now on; returns the settings it replaced."""
    global _reporting, _otel_state
    before, _reporting = _reporting, settings
    _otel_state = _UNSET  # the instruments are made again, for the provider now in force
    return before


def anomaly_noted(lifecycle: Lifecycle, anomaly: Anomaly) -> None:
    """Report one anomaly a lifecycle recorded (see :func:`report_anomaly`)."""
    report_anomaly(
        lifecycle.info.response_id, anomaly.attempt, anomaly.kind, anomaly.reason, anomaly.event_type
    )


def report_anomaly(
    response_id: str | None,
    attempt: int,
    kind: AnomalyKind,
    reason: str,
    event_type: str | None = None,
) -> None:
    """Report one anomaly: a log line, a span event, a count. Never raises.

    The guard's anomalies come here through :meth:`Lifecycle.note`; the sink's (a value escaped, a
    batch refused, a duplicate stream) are reported by the sink when it records them.
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
                otel.anomaly(response_id, attempt, kind, reason, event_type, correction)
    except Exception:  # reporting must never break a stream; CancelledError is not an Exception
        log.debug("eventguard: reporting an anomaly failed", exc_info=True)


def response_ended(lifecycle: Lifecycle, step: Transition) -> None:
    """Count one ending by its state and cause. Never raises."""
    if not _reporting.opentelemetry:
        return
    try:
        otel = _otel()
        if otel is not None:
            otel.ended(step)
    except Exception:  # as above
        log.debug("eventguard: reporting an ending failed", exc_info=True)


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

    def anomaly(
        self,
        response_id: str | None,
        attempt: int,
        kind: AnomalyKind,
        reason: str,
        event_type: str | None,
        correction: bool,
    ) -> None:
        self._anomalies.add(1, {"eventguard.anomaly.kind": kind.value, "eventguard.correction": correction})
        span = self._trace.get_current_span()
        if span.is_recording():
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

    def ended(self, step: Transition) -> None:
        cause = step.cause.value if step.cause is not None else "none"
        self._ended.add(
            1, {"eventguard.response.status": step.to_state.value, "eventguard.response.cause": cause}
        )


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
