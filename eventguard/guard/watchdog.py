"""The watchdog's search for the task to interrupt: the one whose await runs through the guard's step.

Read when the watchdog fires only, never on the hot path. A step may run in a task of its own (as under
``asyncio.wait_for(anext(it), t)`` or the host's wind-down loop): the task that took the first step is
looked at first, then every task of the loop; a task that merely awaits another task is not inside it.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncGenerator
from types import AsyncGeneratorType, CoroutineType, GeneratorType
from typing import Any, Final

__all__ = ["awaits_through", "waiting_task"]


async def _probe() -> AsyncGenerator[None, None]:
    yield None


def _step_wrapper_types() -> tuple[type, ...]:
    """The awaitables that stand for one step of an async generator: asend, athrow, anext(it, d)."""
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(None, None)  # a probe, not an async generator for the loop to finalise
    try:
        gen = _probe()
        made = [gen.asend(None), gen.athrow(GeneratorExit()), anext(gen, None)]
        kinds = tuple({type(m) for m in made})
        for m in made:
            close = getattr(m, "close", None)
            if close is not None:
                close()
    finally:
        sys.set_asyncgen_hooks(*hooks)
    return kinds


_STEP_WRAPPERS: Final = _step_wrapper_types()
_CHAIN_TYPES: Final = (AsyncGeneratorType, CoroutineType, GeneratorType, *_STEP_WRAPPERS)
_MAX_CHAIN: Final = 256


def waiting_task(
    gen: AsyncGeneratorType[Any, None], hint: asyncio.Task[Any] | None
) -> asyncio.Task[Any] | None:
    """The task whose current await runs through ``gen``: the one inside the guard's step, or None.

    Read at fire time only (never on the hot path): ``hint``, the task of the first step, is looked
    at first, then every task of the loop.
    """
    if hint is not None and not hint.done() and awaits_through(hint, gen):
        return hint
    for task in asyncio.all_tasks():
        if task is not hint and awaits_through(task, gen):
            return task
    return None


def awaits_through(task: asyncio.Task[Any], gen: object) -> bool:
    """Whether ``task``'s chain of awaits (coroutines, generators, async generator steps) reaches ``gen``.

    The chain stops at a future: a task that awaits another task is not inside that task's step.
    """
    obj: object = task.get_coro()
    for _ in range(_MAX_CHAIN):
        if obj is gen:
            return True
        if isinstance(obj, CoroutineType):
            obj = obj.cr_await
        elif isinstance(obj, AsyncGeneratorType):
            obj = obj.ag_await
        elif isinstance(obj, GeneratorType):
            obj = obj.gi_yieldfrom
        elif isinstance(obj, _STEP_WRAPPERS):
            # A step of an async generator (anext(it), it.asend(v)) keeps its generator to itself.
            obj = next((r for r in gc.get_referents(obj) if isinstance(r, _CHAIN_TYPES)), None)
        else:
            return False
    return False
