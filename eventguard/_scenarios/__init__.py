"""The earlier home of :mod:`eventguard.testing.host`; kept so existing imports work. Use that module."""

from eventguard.testing.host import (
    LONG_SLEEP,
    Probe,
    ScenarioExecutor,
    ScriptedChatClient,
    WorkflowBehaviour,
    chat_agent,
    text_update,
    trigger_shutdown,
    workflow_agent,
)

__all__ = [
    "LONG_SLEEP",
    "Probe",
    "ScenarioExecutor",
    "ScriptedChatClient",
    "WorkflowBehaviour",
    "chat_agent",
    "text_update",
    "trigger_shutdown",
    "workflow_agent",
]
