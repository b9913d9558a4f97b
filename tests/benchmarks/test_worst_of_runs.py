"""``--runs K`` keeps each figure's worst run: lowest of a floor, highest of a ceiling, median of the rest."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package

_common = importlib.import_module("benchmarks._common")
_runs = importlib.import_module("benchmarks._runs")
Row = _common.Row


def run(rps: float, cpu: float, lost: float, reported: float) -> list[object]:
    return [
        Row("7 host", "rps", rps, "/s", "base", 10.0, ">=", 0.95),
        Row("7 host", "cpu", None, "ms", direction="<=", target=1.1, paired=cpu),
        Row("7 host", "lost", lost, "events", direction="<=", target=0.0, absolute=True),
        Row("7 host", "p50", reported, "ms", "base", 1.0),
    ]


def test_the_worst_run_of_each_figure_is_kept_in_the_first_runs_order() -> None:
    merged = _runs.worst([run(9.9, 1.05, 0, 2.0), run(9.0, 1.20, 3, 1.0), run(10.0, 1.00, 0, 3.0)])
    assert [r.what for r in merged] == ["rps", "cpu", "lost", "p50"]
    rps, cpu, lost, p50 = merged
    assert rps.value == 9.0 and rps.ok is False  # the lowest of a floor
    assert cpu.ratio == 1.20 and cpu.ok is False  # the highest of a ceiling (a paired ratio)
    assert lost.value == 3  # an absolute bound judged by its value
    assert p50.value == 2.0 and p50.ok is None  # reported only: the median run
    assert "worst of 3 runs" in rps.note and "median of 3 runs" in p50.note


def test_a_figure_without_a_baseline_keeps_its_median_run_by_value() -> None:
    runs = [[Row("7 host", "unguarded rps", v, "/s")] for v in (91.0, 80.0, 107.0, 85.0, 99.0)]
    (row,) = _runs.worst(runs)
    assert row.value == 91.0  # the median of five values, not whichever run sorted there
    assert "median of 5 runs (all: 91, 80, 107, 85, 99)" in row.note, row.note


def test_a_single_run_is_returned_unchanged() -> None:
    rows = run(9.9, 1.05, 0, 2.0)
    assert _runs.worst([rows]) is rows


def test_a_figure_skipped_in_any_run_stays_skipped() -> None:
    skipped = [Row("3 PostgreSQL", "throughput", None, "ev/s", skipped="no PostgreSQL")]
    kept = [Row("3 PostgreSQL", "throughput", 5.0, "ev/s", "raw", 10.0, ">=", 0.5)]
    (row,) = _runs.worst([kept, skipped])
    assert row.skipped == "no PostgreSQL"
