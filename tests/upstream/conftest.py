"""Fixtures for tests that drive the real ``ResponsesHostServer`` in-process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("agent_framework_foundry_hosting", reason="the upstream host is not installed")


@pytest.fixture(autouse=True)
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own ``AGENTSERVER_STATE_ROOT`` (file response store, checkpoints)."""
    root = tmp_path / "agentserver-state"
    root.mkdir()
    monkeypatch.setenv("AGENTSERVER_STATE_ROOT", str(root))
    monkeypatch.setenv("AGENTSERVER_SHUTDOWN_GRACE_SECONDS", "1")
    return root


@pytest.fixture(autouse=True)
def resilient_switch() -> Iterator[None]:
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


@pytest.fixture(autouse=True)
def quiet_host_logs() -> Iterator[None]:
    """The host logs every expected failure with a traceback; keep test output readable."""
    names = ("azure.ai.agentserver", "agent_framework", "agent_framework_foundry_hosting", "httpx")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.fixture
def guard_api() -> object:
    """``eventguard.guard``; skips (with the reason) until the guard module exists."""
    try:
        from eventguard import guard
    except ImportError as exc:  # pragma: no cover - only while the guard is being written
        pytest.skip(f"eventguard.guard is not importable yet: {exc}")
    return guard
