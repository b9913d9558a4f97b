"""Run upstream's own response-store tests against eventguard's SqlResponseProvider.

Usage (from the checkout, with the venv whose host you want to test)::

    .venv/bin/python scripts/upstream_store_tests.py [--postgres] [--contract] [-- pytest args]

It downloads the source distribution of the *installed* ``azure-ai-agentserver-responses``
(``pip download --no-binary``) into a temporary directory, removes the sdist's copy of the package
(so the tests run against the installed host), and runs upstream's provider tests with a plugin that
puts a fresh ``SqlResponseProvider`` wherever the tests build ``InMemoryResponseProvider()`` or
``FileResponseStore(storage_dir=...)``: a new SQLite file per provider (``--postgres``: a new
PostgreSQL schema per provider on 127.0.0.1:5432/test, dropped at the end). ``--contract`` adds
upstream's host contract tests (tests/contract), whose hosts then store through the SQL provider.
Nothing of upstream's is copied into this project; this is not part of CI (it needs the network).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

PACKAGE = "azure-ai-agentserver-responses"

#: Upstream's tests of the store itself (each builds InMemoryResponseProvider / FileResponseStore).
PROVIDER_TESTS = [
    "tests/unit/test_responses_provider_parity.py",
    "tests/unit/test_file_response_store_parity.py",
    "tests/unit/test_in_memory_provider_crud.py",
    "tests/unit/test_input_items_provider_behavior.py",
    "tests/unit/test_internal_metadata_provider_roundtrip.py",
    "tests/unit/test_file_store_item_normalization.py",
]

# The plugin the run loads (``-p``): it is written into the temporary directory, not imported here.
PLUGIN = '''
"""Swap the host's in-memory and file stores for eventguard's SqlResponseProvider."""
import asyncio
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

from azure.ai.agentserver.responses import store as _store_pkg
from azure.ai.agentserver.responses.store import _file, _memory
import azure.ai.agentserver.responses as _responses_pkg

from eventguard.provider import SqlResponseProvider

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
USE_PG = os.environ.get("EG_UPSTREAM_DB") == "postgres"
# A pool keeps asyncpg connections of the event loop that opened them; upstream's synchronous tests
# call asyncio.run() several times on one provider. --pg-null-pool borrows the provider an engine
# without a pool (eventguard's pooler_safe engine) to tell that apart from the store's behaviour.
NULL_POOL = os.environ.get("EG_UPSTREAM_PG_NULL_POOL") == "1"


def _pg_store(schema: str):
    if not NULL_POOL:
        return (PG_URL,), {"schema": schema}
    from sqlalchemy.engine import make_url

    from eventguard.sql.engine import create_engine

    return (create_engine(make_url(PG_URL), schema=schema, pooler_safe=True),), {}
_ROOT = Path(tempfile.mkdtemp(prefix="eg-upstream-db-"))
_SCHEMAS: list[str] = []


def _pg(sql: str) -> None:
    """One statement on a connection of its own, on a loop of its own (the caller may be in one)."""
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _catch(errors, lambda: asyncio.run(run())))
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]


def _catch(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:
        errors.append(exc)


def _fresh_schema() -> str:
    schema = f"eg_upstream_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE SCHEMA "{schema}"')
    _SCHEMAS.append(schema)
    return schema


def _default_dir() -> Path:
    """Where ``FileResponseStore()`` would write: upstream's conftest points it at each test's tmp_path."""
    try:
        from azure.ai.agentserver.core import resolve_state_subdir
    except ImportError:  # an older core: one directory for the run
        return _ROOT / "default"
    return Path(resolve_state_subdir("responses"))


class SqlInPlaceOfMemory(SqlResponseProvider):
    """``InMemoryResponseProvider()``: a provider on an empty database of its own."""

    def __init__(self, *args, **kwargs) -> None:
        if USE_PG:
            args, kwargs = _pg_store(_fresh_schema())
            super().__init__(*args, **kwargs)
        else:
            super().__init__(f"sqlite:///{_ROOT / (uuid.uuid4().hex + '.db')}")


class SqlInPlaceOfFile(SqlResponseProvider):
    """``FileResponseStore(storage_dir=d)``: one database per directory, so reopening sees the data."""

    _by_dir: dict[str, str] = {}

    def __init__(self, storage_dir=None, *args, **kwargs) -> None:
        key = str(storage_dir if storage_dir is not None else _default_dir())
        if USE_PG:
            schema = self._by_dir.get(key) or _fresh_schema()
            self._by_dir[key] = schema
            args, kwargs = _pg_store(schema)
            super().__init__(*args, **kwargs)
        else:
            folder = Path(storage_dir) if storage_dir is not None else _default_dir()
            folder.mkdir(parents=True, exist_ok=True)
            super().__init__(f"sqlite:///{folder / 'eventguard-store.db'}")


for module in (_memory, _store_pkg, _responses_pkg):
    if hasattr(module, "InMemoryResponseProvider"):
        module.InMemoryResponseProvider = SqlInPlaceOfMemory
for module in (_file, _store_pkg, _responses_pkg):
    if hasattr(module, "FileResponseStore"):
        module.FileResponseStore = SqlInPlaceOfFile


def pytest_report_header(config):
    where = "PostgreSQL (a schema per provider)" if USE_PG else "SQLite (a file per provider)"
    return f"eventguard: the in-memory and file stores replaced by SqlResponseProvider on {where}"


def pytest_unconfigure(config):
    for schema in _SCHEMAS:
        _pg(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    shutil.rmtree(_ROOT, ignore_errors=True)
'''


def _sdist(into: Path, release: str) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{PACKAGE}=={release}",
            "-d",
            str(into),
        ],
        check=True,
    )
    archive = next(into.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    root = next(p for p in into.iterdir() if p.is_dir())
    # The sdist's own copy of the package would shadow the installed host (its pytest pythonpath
    # is "."): the tests must run against what eventguard is installed with.
    shutil.rmtree(root / "azure")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument(
        "--pg-null-pool", action="store_true", help="PostgreSQL through an engine without a pool"
    )
    parser.add_argument("--contract", action="store_true", help="also upstream's tests/contract")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    release = version(PACKAGE)
    project = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="eg-upstream-") as tmp:
        root = _sdist(Path(tmp), release)
        (root / "eventguard_upstream_plugin.py").write_text(PLUGIN)
        targets = PROVIDER_TESTS + (["tests/contract"] if args.contract else [])
        env = {
            **os.environ,
            "PYTHONPATH": f"{root}:{project}",
            "EG_UPSTREAM_DB": "postgres" if args.postgres or args.pg_null_pool else "sqlite",
            "EG_UPSTREAM_PG_NULL_POOL": "1" if args.pg_null_pool else "0",
        }
        print(f"{PACKAGE} {release} tests from the sdist in {root}", flush=True)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "eventguard_upstream_plugin",
                "-p",
                "no:cacheprovider",
                "-q",
                "-rfE",
                *targets,
                *args.pytest_args,
            ],
            cwd=root,
            env=env,
        ).returncode


if __name__ == "__main__":
    sys.exit(main())
