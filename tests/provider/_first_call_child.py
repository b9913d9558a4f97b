"""One process's first calls on a shared empty database, for test_first_calls_create_the_schema_once.

Usage: python -m tests.provider._first_call_child URL SCHEMA|- TAG

Imports everything, says ``ready``, waits for a line on stdin (so every process's first call starts
at once), then makes four concurrent ``create_response`` calls on a provider that was never started
(as the host calls one) and reads them back. Exits 0 and says ``ok`` only if all of them succeeded;
otherwise prints each failure and exits 1.
"""

from __future__ import annotations

import asyncio
import sys

from eventguard.provider import SqlResponseProvider
from tests.provider.test_parity_with_the_hosts_store import envelope, item


async def main(url: str, schema: str | None, tag: str) -> int:
    provider = SqlResponseProvider(url, schema=schema)
    ids = [f"resp_{tag}_{n}" for n in range(4)]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    try:
        async with asyncio.timeout(120):
            made = await asyncio.gather(
                *(provider.create_response(envelope(r), [item(f"{r}_in")], []) for r in ids),
                return_exceptions=True,
            )
            failures = [f"{type(m).__name__}: {m}" for m in made if isinstance(m, BaseException)]
            if not failures:
                got = [(await provider.get_response(r))["id"] for r in ids]
                if got != ids:
                    failures.append(f"read back {got}, not {ids}")
    finally:
        async with asyncio.timeout(30):
            await provider.aclose()
    for failure in failures:
        print(failure, flush=True)
    print("ok" if not failures else "failed", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    _url, _schema, _tag = sys.argv[1:4]
    sys.exit(asyncio.run(main(_url, None if _schema == "-" else _schema, _tag)))
