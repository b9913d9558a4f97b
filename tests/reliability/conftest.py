"""Fixtures for the reliability suite: host state per test, quiet host logs, the figures summary."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ._common import FIGURES

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")


@pytest.fixture(autouse=True)
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "agentserver-state"
    root.mkdir()
    monkeypatch.setenv("AGENTSERVER_STATE_ROOT", str(root))
    monkeypatch.setenv("AGENTSERVER_SHUTDOWN_GRACE_SECONDS", "1")
    return root


@pytest.fixture(autouse=True)
def resilient_switch() -> Iterator[None]:
    from azure.ai.agentserver.core.tasks import _enablement

    before = _enablement._RESILIENT_TASKS_ENABLED
    try:
        yield
    finally:
        _enablement._RESILIENT_TASKS_ENABLED = before
        try:
            from azure.ai.agentserver.core.tasks._manager import set_task_manager

            set_task_manager(None)
        except ImportError:  # pragma: no cover - older cores
            pass


@pytest.fixture(autouse=True)
def quiet_host_logs() -> Iterator[None]:
    names = ("azure.ai.agentserver", "agent_framework", "agent_framework_foundry_hosting", "httpx", "uvicorn")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("eventguard reliability figures")
    for line in FIGURES:
        terminalreporter.write_line(" ".join(f"{k}={v}" for k, v in line.items()))
