"""The one results table: printed, and written to benchmarks/RESULTS.md with the machine."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from ._common import Row, fmt, machine

HEADER = ("item", "measurement", "eventguard", "baseline (same run)", "ratio", "target", "verdict")


class LogCounter(logging.Handler):
    """Keeps the sink's warnings off the table and counts them for a footnote."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.getMessage().split(";")[0][:90]] += 1


def quiet_eventguard_logs() -> LogCounter:
    handler = LogCounter()
    lg = logging.getLogger("eventguard")
    lg.addHandler(handler)
    lg.propagate = False
    return handler


def _cells(r: Row) -> tuple[str, ...]:
    if r.skipped:
        return (r.item, r.what, "skipped", "-", "-", "-", r.skipped)
    base = f"{fmt(r.baseline, r.unit)} ({r.baseline_what})" if r.baseline_what else "-"
    if r.absolute:
        ratio = "-"
        target = f"{r.direction} {fmt(r.target, r.unit)}" if r.target is not None else "-"
    else:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        target = f"{r.direction} {r.target:g}x" if r.target is not None else "-"
    verdict = {True: "ok", False: "MISS", None: "reported"}[r.ok]
    return (r.item, r.what, fmt(r.value, r.unit), base, ratio, target, verdict)


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def notes(rows: list[Row]) -> list[str]:
    return [f"{r.item}, {r.what}: {r.note}" for r in rows if r.note]


def text(rows: list[Row]) -> str:
    cells = [HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    out = ["  ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))).rstrip() for c in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_results(path: Path, rows: list[Row], command: str, seconds: float, logs: LogCounter) -> None:
    parts = [
        "# Benchmark results",
        "",
        f"Produced by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {seconds:.0f} s. "
        "Each figure is the median over the repetitions, beside its baseline measured in the same run.",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in machine()),
        "",
        "## Results",
        "",
        markdown(rows),
        "",
        "## Notes",
        "",
        *(f"- {n}" for n in notes(rows)),
    ]
    if logs.counts:
        parts += ["", "## What the sink logged during the run (warnings and errors, counted)", ""]
        parts += [f"- {n} x {msg}" for msg, n in logs.counts.most_common(10)]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
