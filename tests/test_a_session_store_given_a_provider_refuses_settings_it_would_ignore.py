"""``SqlAgentSessionStoreProvider(provider, schema=..., auto_migrate=...)``: the provider's schema and
migration were settled when it was built, so these two are checked as everywhere else (a wrong type
is a ``TypeError`` naming the argument) and one that differs from the provider's own is a
``ValueError``; the provider's own value (what ``GuardedResponses(database=...)`` passes) is taken.

Unchecked, both were ignored without a word: ``schema=5`` and ``auto_migrate="x"`` were accepted,
and ``schema="app"`` beside a provider on the default schema wrote the sessions somewhere else than
asked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_framework import AgentSession
from azure.ai.agentserver.core import FoundryAgentRequestContext

from eventguard import SqlResponseProvider
from eventguard.agent_sessions import SqlAgentSessionStoreProvider

#: Bound on each awaited step.
STEP = 30.0
#: Constructing a provider opens nothing: this URL is never connected to.
PG_URL = "postgresql://127.0.0.1:5432/test"

WRONG_SCHEMAS: list[tuple[object, str]] = [
    (5, "int"),
    (b"app", "bytes"),
    (object(), "object"),
    (["app"], "list"),
]
WRONG_FLAGS: list[tuple[object, str]] = [
    ("x", "str"),
    ("false", "str"),
    (0, "int"),
    (1, "int"),
    (object(), "object"),
]


@pytest.fixture
def provider(tmp_path: Path) -> SqlResponseProvider:
    return SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}")


@pytest.mark.parametrize(("schema", "type_name"), WRONG_SCHEMAS, ids=[name for _v, name in WRONG_SCHEMAS])
def test_a_schema_of_the_wrong_type_is_refused_beside_a_provider(
    provider: SqlResponseProvider, schema: object, type_name: str
) -> None:
    with pytest.raises(TypeError, match=rf"^schema must be a str or None, not {type_name}$"):
        SqlAgentSessionStoreProvider(provider, schema=schema)  # type: ignore[arg-type]


@pytest.mark.parametrize(("flag", "type_name"), WRONG_FLAGS, ids=[f"{v!r}" for v, _name in WRONG_FLAGS])
def test_an_auto_migrate_of_the_wrong_type_is_refused_beside_a_provider(
    provider: SqlResponseProvider, flag: object, type_name: str
) -> None:
    with pytest.raises(TypeError, match=rf"^auto_migrate must be True or False or None, not {type_name}$"):
        SqlAgentSessionStoreProvider(provider, auto_migrate=flag)  # type: ignore[arg-type]


def test_an_empty_schema_is_refused_beside_a_provider(provider: SqlResponseProvider) -> None:
    with pytest.raises(ValueError, match=r"^schema must be a PostgreSQL name"):
        SqlAgentSessionStoreProvider(provider, schema="")


@pytest.mark.parametrize(
    ("built", "given"),
    [
        ({}, {"schema": "app"}),
        ({"schema": "app"}, {"schema": "other"}),
        ({}, {"auto_migrate": False}),
        ({"auto_migrate": True}, {"auto_migrate": False}),
        ({"auto_migrate": False}, {"auto_migrate": True}),
    ],
    ids=[
        "schema-beside-none",
        "schema-beside-another",
        "flag-beside-none",
        "true-then-false",
        "false-then-true",
    ],
)
def test_a_setting_that_differs_from_the_providers_is_refused_naming_it(
    built: dict[str, object], given: dict[str, object]
) -> None:
    provider = SqlResponseProvider(PG_URL, **built)  # type: ignore[arg-type]
    (name, value), *_ = given.items()
    with pytest.raises(ValueError, match=rf"^{name}={value!r} differs from the SqlResponseProvider's own"):
        SqlAgentSessionStoreProvider(provider, **given)  # type: ignore[arg-type]
    # The provider's own values are taken, as GuardedResponses(database=...) passes them.
    same = SqlAgentSessionStoreProvider(provider, schema=provider.schema, auto_migrate=provider.auto_migrate)
    assert same.provider is provider


async def test_the_providers_own_settings_are_taken_and_a_different_one_is_not(tmp_path: Path) -> None:
    provider = SqlResponseProvider(f"sqlite:///{tmp_path / 'p.db'}", auto_migrate=True)
    with pytest.raises(ValueError, match=r"^auto_migrate=False differs"):
        SqlAgentSessionStoreProvider(provider, auto_migrate=False)
    sessions = SqlAgentSessionStoreProvider(provider, schema=None, auto_migrate=True)
    assert sessions.provider is provider
    store = sessions.get_store(config=None, platform_context=FoundryAgentRequestContext(user_id="u1"))
    try:
        async with asyncio.timeout(STEP):
            await provider.start()
            await store.set("conv_1", AgentSession(session_id="s-1"))
            got = await store.get("conv_1")
            assert got is not None and got.session_id == "s-1"
    finally:
        async with asyncio.timeout(STEP):
            await provider.aclose()
