"""A database URL that is neither a ``str``, a SQLAlchemy ``URL`` nor None is a ``TypeError`` naming the
argument and the type it got, where it is given, by every constructor that takes one.

Unchecked, ``SqlResponseProvider(5)``, ``ResponseStore(5)``, ``SqlSink(5)`` and
``SqlAgentSessionStoreProvider(5)`` raised ``AttributeError: 'int' object has no attribute
'get_backend_name'`` from inside the URL handling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from eventguard import ResponseStore, SqlResponseProvider, SqlSink
from eventguard.agent_sessions import SqlAgentSessionStoreProvider
from eventguard.demo import run_demo

#: Bound on each awaited step.
STEP = 30.0


class NotAURL:
    """An object of no URL kind, whose str() happens to read as one."""

    def __str__(self) -> str:
        return "sqlite:///x.db"


#: (value, the type name the error must say)
WRONG: list[tuple[object, str]] = [
    (5, "int"),
    (1.5, "float"),
    (True, "bool"),
    (b"sqlite:///x.db", "bytes"),
    (bytearray(b"sqlite:///x.db"), "bytearray"),
    (["sqlite:///x.db"], "list"),
    (NotAURL(), "NotAURL"),
    (Path("x.db"), type(Path("x.db")).__name__),  # a file, not a URL: sqlite:///x.db is
]

#: (constructor, the name of the argument that takes the URL)
MAKERS: dict[str, tuple[Callable[[object, Path], object], str]] = {
    "SqlResponseProvider": (lambda url, _tmp: SqlResponseProvider(url), "url"),  # type: ignore[arg-type]
    "ResponseStore": (lambda url, _tmp: ResponseStore(url), "url"),  # type: ignore[arg-type]
    "SqlSink": (lambda url, tmp: SqlSink(url, spool_path=tmp / "spool.jsonl"), "url"),  # type: ignore[arg-type]
    "SqlAgentSessionStoreProvider": (lambda url, _tmp: SqlAgentSessionStoreProvider(url), "database"),  # type: ignore[arg-type]
}


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user's EVENTGUARD_DATABASE_URL, and no ./eventguard.db left anywhere but tmp_path."""
    monkeypatch.delenv("EVENTGUARD_DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("maker", sorted(MAKERS))
@pytest.mark.parametrize(("value", "type_name"), WRONG, ids=[name for _value, name in WRONG])
def test_a_url_of_the_wrong_type_is_a_type_error_naming_the_argument(
    maker: str, value: object, type_name: str, tmp_path: Path
) -> None:
    make, argument = MAKERS[maker]
    with pytest.raises(TypeError) as raised:
        make(value, tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{argument} must be "), message
    assert message.endswith(f"not {type_name}"), message
    assert not list(tmp_path.iterdir()), "nothing is created for a refused URL"


@pytest.mark.parametrize(("value", "type_name"), WRONG[:4], ids=[name for _value, name in WRONG[:4]])
async def test_the_demo_refuses_a_url_of_the_wrong_type_before_it_runs(value: object, type_name: str) -> None:
    async with asyncio.timeout(STEP):
        with pytest.raises(TypeError, match=rf"^url must be .*not {type_name}$"):
            await run_demo(value)  # type: ignore[arg-type]
