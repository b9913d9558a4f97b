"""``--load N`` starts N busy processes for the block and leaves none behind."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # benchmarks/ is not part of the installed package

_load = importlib.import_module("benchmarks._load")


def test_busy_processes_run_during_the_block_and_are_gone_after() -> None:
    with _load.busy_processes(2) as procs:
        assert len(procs) == 2
        assert all(p.poll() is None and psutil.pid_exists(p.pid) for p in procs)
    assert all(p.returncode is not None for p in procs)


def test_no_load_starts_nothing() -> None:
    with _load.busy_processes(0) as procs:
        assert procs == []
