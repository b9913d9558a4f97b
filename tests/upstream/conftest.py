"""Fixtures for tests that drive the real ``ResponsesHostServer`` in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")


@pytest.fixture(autouse=True)
def _real_host(real_host: Path) -> Path:
    """Host state per test, the resilient switch restored, quiet host logs (tests/conftest.py)."""
    return real_host
