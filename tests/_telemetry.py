"""eventguard's metrics read by OpenTelemetry's in-memory reader, for the tests that count them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from eventguard import telemetry


@contextlib.contextmanager
def reading_metrics() -> Iterator[InMemoryMetricReader]:
    """While inside, eventguard reports its metrics to the reader it yields; then as it was before."""
    reader = InMemoryMetricReader()
    before = telemetry.set_reporting(
        telemetry.Reporting(meter_provider=MeterProvider(metric_readers=[reader]))
    )
    try:
        yield reader
    finally:
        telemetry.set_reporting(before)
