"""Fixtures for the reliability suite: host state per test, quiet host logs, the figures summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._common import FIGURES

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")


@pytest.fixture(autouse=True)
def _real_host(real_host: Path) -> Path:
    """Host state per test, the resilient switch restored, quiet host logs (tests/conftest.py)."""
    return real_host


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("eventguard reliability figures")
    for line in FIGURES:
        terminalreporter.write_line(" ".join(f"{k}={v}" for k, v in line.items()))
