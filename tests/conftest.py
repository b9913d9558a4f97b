"""Fixtures shared by the suites that drive the real ResponsesHostServer (tests/upstream, tests/reliability).

Each suite's own conftest turns them on for its tests with one autouse fixture.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

HOST_LOGGERS = (
    "azure.ai.agentserver",
    "agent_framework",
    "agent_framework_foundry_hosting",
    "httpx",
    "uvicorn",
)


@pytest.fixture
def host_state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ``AGENTSERVER_STATE_ROOT`` (file response store, checkpoints)."""
    root = tmp_path / "agentserver-state"
    root.mkdir()
    monkeypatch.setenv("AGENTSERVER_STATE_ROOT", str(root))
    monkeypatch.setenv("AGENTSERVER_SHUTDOWN_GRACE_SECONDS", "1")
    return root


@pytest.fixture
def host_resilient_switch() -> Iterator[None]:
    """The resilient-task switch is process-wide: restore it (and the task manager) after each test."""
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


@pytest.fixture
def quiet_host_logs() -> Iterator[None]:
    """The host logs every expected failure with a traceback; keep test output readable."""
    levels = {name: logging.getLogger(name).level for name in HOST_LOGGERS}
    for name in HOST_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.fixture
def real_host(host_state_root: Path, host_resilient_switch: None, quiet_host_logs: None) -> Path:
    """Everything a test of the real host needs; returns the state root."""
    return host_state_root
