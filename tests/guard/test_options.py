"""The guard's options: ``guard()``'s keywords and :class:`GuardOptions` agree, are checked and frozen."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import pytest

from eventguard import Guard, guard
from eventguard.guard import GuardOptions
from eventguard.testing.streams import (
    Scripted,
)


def test_the_documented_final_flush_bound_is_five_seconds() -> None:
    # README: "The final flush to the sink is shielded and time-bounded (`flush_timeout`, 5 s)".
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    assert inspect.signature(guard).parameters["flush_timeout"].default == 5.0
    assert GuardOptions().flush_timeout == 5.0


def test_guard_and_GuardOptions_agree_on_every_default() -> None:
    # guard() is the documented entry point; Guard(...) built with GuardOptions() must behave the same.
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    outer = inspect.signature(guard).parameters
    fields = {f.name: f.default for f in dataclasses.fields(GuardOptions)}
    assert {k: outer[k].default for k in fields} == fields
    assert inspect.signature(Guard).parameters["options"].default == GuardOptions()
    assert outer["cancel_grace"].default == 10.0  # README: cancel_grace=10.0


def test_options_are_keyword_only() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    params = inspect.signature(guard).parameters
    assert [n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY] == ["stream", "cancellation_signal"]
    params = inspect.signature(Guard).parameters
    assert [n for n, p in params.items() if p.kind is not p.KEYWORD_ONLY] == [
        "stream",
        "cancellation_signal",
        "options",
    ]


def test_the_options_object_is_frozen() -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        GuardOptions().cancel_grace = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("grace", [-1.0, -0.5])
def test_a_negative_cancel_grace_is_refused(grace: float) -> None:
    """Origin: a mutant that survived the run over guard.py (docs/mutation.md; test_guard_edges.py)."""
    with pytest.raises(ValueError, match="cancel_grace"):
        guard(Scripted([]), asyncio.Event(), cancel_grace=grace)
