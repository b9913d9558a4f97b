"""The benchmark command runs end to end at tiny sizes. No timing is asserted: figures are not tests."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The benchmark quiets eventguard's logger for its table (propagate off, a counting handler):
    # undone after this test, so later tests' caplog still sees eventguard's records.
    lg = logging.getLogger("eventguard")
    monkeypatch.setattr(lg, "propagate", lg.propagate)
    monkeypatch.setattr(lg, "handlers", list(lg.handlers))
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package
    main = importlib.import_module("benchmarks.__main__").main
    out = tmp_path / "RESULTS.md"
    code = main(["--quick", "--only", "overhead", "--only", "sqlite", "--only", "latency", "--out", str(out)])
    assert code in (0, 1)  # 1 only says a target was missed, at sizes too small to mean anything
    text = out.read_text()
    assert "## Machine" in text and "| 1 overhead |" in text and "| 2 SQLite |" in text
    # The A/A row (a second bare layer against the first) is reported with no verdict.
    twin = next(line for line in text.splitlines() if "A/A" in line)
    assert twin.endswith("| - | reported |"), twin
