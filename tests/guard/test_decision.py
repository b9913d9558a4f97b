"""The terminal decision, row by row against the README's table."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from eventguard import Cause, State
from eventguard.decision import Ending, Flags, Forward, decide, settle, unverified
from eventguard.guard.options import GuardOptions

NONE = Flags()
STEERING = Flags(signal=True)
SHUTDOWN = Flags(shutdown=True)
SHUTDOWN_SIGNALLED = Flags(signal=True, shutdown=True)
CLIENT_CANCEL = Flags(signal=True, client_cancelled=True)
PROCESS_SHUTDOWN = Flags(process_shutdown=True)  # SIGTERM reached the process; the host did not tell this run
DEFAULT = GuardOptions()
EMIT = GuardOptions(on_cancel="emit")
KEEP = GuardOptions(keep_shutdown_completion=True)
RECOVERABLE = GuardOptions(recoverable=True)

ROWS = [
    # (inner ending, flags then, options, forwarded, lifecycle state, cause)
    # The process is shutting down: it explains an ending that is not a terminal, never replaces a terminal.
    (Ending.RAISED_CANCELLED, PROCESS_SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (
        Ending.RAISED_CANCELLED,
        PROCESS_SHUTDOWN,
        RECOVERABLE,
        Forward.NOTHING,
        State.INTERRUPTED,
        Cause.SHUTDOWN,
    ),
    (Ending.NO_TERMINAL, PROCESS_SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.STUCK, PROCESS_SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.ABANDONED, PROCESS_SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.CLOSED_EARLY, PROCESS_SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.COMPLETED, PROCESS_SHUTDOWN, DEFAULT, Forward.PASS, State.COMPLETED, Cause.NORMAL),
    (Ending.INCOMPLETE, PROCESS_SHUTDOWN, DEFAULT, Forward.PASS, State.INCOMPLETE, Cause.NORMAL),
    (Ending.FAILED, PROCESS_SHUTDOWN, DEFAULT, Forward.PASS, State.FAILED, Cause.ERROR),
    (
        Ending.RAISED_CANCELLED,
        Flags(signal=True, client_cancelled=True, process_shutdown=True),
        DEFAULT,
        Forward.NOTHING,
        State.CANCELLED,
        Cause.CLIENT_CANCEL,
    ),
    (Ending.COMPLETED, NONE, DEFAULT, Forward.PASS, State.COMPLETED, Cause.NORMAL),
    (Ending.INCOMPLETE, NONE, DEFAULT, Forward.PASS, State.INCOMPLETE, Cause.NORMAL),
    (Ending.COMPLETED, STEERING, DEFAULT, Forward.PASS, State.COMPLETED, Cause.STEERING),
    (Ending.INCOMPLETE, STEERING, DEFAULT, Forward.PASS, State.INCOMPLETE, Cause.STEERING),
    (Ending.COMPLETED, SHUTDOWN, DEFAULT, Forward.FAILED_SHUTDOWN, State.FAILED, Cause.SHUTDOWN),
    (Ending.COMPLETED, SHUTDOWN_SIGNALLED, DEFAULT, Forward.FAILED_SHUTDOWN, State.FAILED, Cause.SHUTDOWN),
    (Ending.COMPLETED, SHUTDOWN, KEEP, Forward.PASS, State.COMPLETED, Cause.SHUTDOWN),
    (Ending.COMPLETED, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.INCOMPLETE, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.FAILED, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.CANCELLED, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.COMPLETED, CLIENT_CANCEL, EMIT, Forward.CANCELLED, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.FAILED, NONE, DEFAULT, Forward.PASS, State.FAILED, Cause.ERROR),
    (Ending.FAILED, SHUTDOWN, DEFAULT, Forward.PASS, State.FAILED, Cause.SHUTDOWN),
    (Ending.NO_TERMINAL, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.NO_TERMINAL, SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.NO_TERMINAL, SHUTDOWN, RECOVERABLE, Forward.NOTHING, State.INTERRUPTED, Cause.SHUTDOWN),
    (
        Ending.NO_TERMINAL,
        NONE,
        DEFAULT,
        Forward.FAILED_MISSING_TERMINAL,
        State.FAILED,
        Cause.MISSING_TERMINAL,
    ),
    (
        Ending.NO_TERMINAL,
        STEERING,
        DEFAULT,
        Forward.FAILED_MISSING_TERMINAL,
        State.FAILED,
        Cause.MISSING_TERMINAL,
    ),
    (Ending.RAISED, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.RAISED, CLIENT_CANCEL, EMIT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.RAISED, NONE, DEFAULT, Forward.NOTHING, State.FAILED, Cause.ERROR),
    (Ending.RAISED_CANCELLED, NONE, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (
        Ending.RAISED_CANCELLED,
        CLIENT_CANCEL,
        DEFAULT,
        Forward.NOTHING,
        State.CANCELLED,
        Cause.CLIENT_CANCEL,
    ),
    (Ending.RAISED_CANCELLED, SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.RAISED_CANCELLED, SHUTDOWN, RECOVERABLE, Forward.NOTHING, State.INTERRUPTED, Cause.SHUTDOWN),
    (Ending.RAISED_BASE, NONE, DEFAULT, Forward.NOTHING, State.INTERRUPTED, Cause.RECOVERY),
    (Ending.RAISED_BASE, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.INTERRUPTED, Cause.RECOVERY),
    (Ending.RAISED_BASE, SHUTDOWN, DEFAULT, Forward.NOTHING, State.INTERRUPTED, Cause.RECOVERY),
    (Ending.ABANDONED, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.STUCK, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
    (Ending.STUCK, SHUTDOWN, DEFAULT, Forward.NOTHING, State.FAILED, Cause.SHUTDOWN),
    (Ending.STUCK, STEERING, DEFAULT, Forward.FAILED_MISSING_TERMINAL, State.FAILED, Cause.STUCK),
    (Ending.CLOSED_EARLY, NONE, DEFAULT, Forward.NOTHING, State.FAILED, Cause.CLOSED_EARLY),
    (Ending.CLOSED_EARLY, CLIENT_CANCEL, DEFAULT, Forward.NOTHING, State.CANCELLED, Cause.CLIENT_CANCEL),
]


@pytest.mark.parametrize(("ending", "flags", "options", "forward", "state", "cause"), ROWS)
def test_each_row_of_the_table_decides_what_to_forward_the_state_and_the_cause(
    ending: Ending, flags: Flags, options: GuardOptions, forward: Forward, state: State, cause: Cause
) -> None:
    d = decide(ending, flags, options)
    assert (d.forward, d.state, d.cause) == (forward, state, cause)


def test_steering_marks_the_turn_cut_short() -> None:
    assert decide(Ending.COMPLETED, STEERING).steering_cut_short
    assert not decide(Ending.COMPLETED, NONE).steering_cut_short


def test_kept_shutdown_completion_is_flagged_unverified() -> None:
    assert decide(Ending.COMPLETED, SHUTDOWN, KEEP).unverified
    assert not decide(Ending.COMPLETED, NONE, KEEP).unverified


def test_never_completed_after_a_client_cancel() -> None:
    for ending in Ending:
        for options in (GuardOptions(), EMIT, KEEP, RECOVERABLE):
            for flags in (CLIENT_CANCEL, Flags(signal=True, client_cancelled=True, shutdown=True)):
                assert decide(ending, flags, options).state is not State.COMPLETED


@pytest.mark.parametrize("value", [Flags(), GuardOptions(), decide(Ending.COMPLETED, NONE)])
def test_value_objects_are_frozen_and_slotted(value: object) -> None:
    # Flags are a snapshot of one moment; a decision is a verdict: neither may change afterwards.
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, dataclasses.fields(value)[0].name, None)  # type: ignore[arg-type]
    assert not hasattr(value, "__dict__")


def test_on_cancel_is_compared_by_value_not_identity() -> None:
    emit = "".join(["e", "mit"])  # equal to "emit", but not the interned literal
    assert decide(Ending.COMPLETED, CLIENT_CANCEL, GuardOptions(on_cancel=emit)).forward is Forward.CANCELLED


def test_a_terminal_is_settled_as_a_cancel_only_by_a_client_cancel_at_the_end() -> None:
    kept = decide(Ending.COMPLETED, NONE)
    for flags in (NONE, STEERING, SHUTDOWN, PROCESS_SHUTDOWN):
        assert settle(kept, flags) is kept
    settled = settle(kept, CLIENT_CANCEL)
    assert (settled.forward, settled.state, settled.cause) == (
        Forward.NOTHING,
        State.CANCELLED,
        Cause.CLIENT_CANCEL,
    )


def test_only_a_completion_is_marked_unverified() -> None:
    for ending in (Ending.COMPLETED, Ending.INCOMPLETE):
        marked = unverified(decide(ending, NONE), "why")
        assert marked.unverified
        assert marked.reason == f"inner stream {ending.value}; why: not verified"
    failed = decide(Ending.FAILED, NONE)
    assert unverified(failed, "why") is failed


def test_the_old_name_process_exiting_still_works_and_says_it_is_deprecated() -> None:
    """``Flags.process_exiting`` was renamed ``process_shutdown`` (one word for the process exit, as
    ``guard(process_shutdown=...)``); the old keyword and attribute still work, with a warning."""
    with pytest.warns(DeprecationWarning, match="process_shutdown"):
        old = Flags(process_exiting=True)
    assert old == Flags(process_shutdown=True)
    with pytest.warns(DeprecationWarning, match="process_shutdown"):
        assert Flags(False, False, False, True).process_exiting is True
    with pytest.warns(DeprecationWarning, match="process_shutdown"):
        assert Flags(process_exiting=False) == Flags()


def test_flags_built_by_the_new_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flags = dataclasses.replace(Flags(signal=True), process_shutdown=True)
    assert (flags.signal, flags.client_cancelled, flags.shutdown, flags.process_shutdown) == (
        True,
        False,
        False,
        True,
    )


def test_decide_without_options_is_decide_with_the_default_options() -> None:
    """Mutation run 2026-12-01 (decision.py): ``decide()`` with no options read ``keep=True`` or
    ``recoverable=True`` and no row said otherwise."""
    for ending in Ending:
        for bits in range(16):
            flags = Flags(bool(bits & 1), bool(bits & 2), bool(bits & 4), bool(bits & 8))
            assert decide(ending, flags) == decide(ending, flags, GuardOptions()), (ending, flags)
    # The two options that default off change at least one row each, so the check above can fail.
    shutdown = Flags(signal=True, shutdown=True)
    assert decide(Ending.COMPLETED, shutdown) != decide(
        Ending.COMPLETED, shutdown, GuardOptions(keep_shutdown_completion=True)
    )
    exiting = Flags(process_shutdown=True)
    assert decide(Ending.NO_TERMINAL, exiting) != decide(
        Ending.NO_TERMINAL, exiting, GuardOptions(recoverable=True)
    )


def test_the_deprecation_warnings_point_at_the_callers_line() -> None:
    """Mutation run 2026-12-01 (decision.py): ``stacklevel=2`` becoming 1 or 3 survived."""
    with pytest.warns(DeprecationWarning, match="process_shutdown") as built:
        flags = Flags(process_exiting=True)
    with pytest.warns(DeprecationWarning, match="process_shutdown") as read:
        assert flags.process_exiting is True
    assert [w.filename for w in (*built, *read)] == [__file__, __file__]


def test_a_cancel_terminal_is_forwarded_only_for_on_cancel_exactly_emit() -> None:
    """``decide()`` does not call ``GuardOptions.check()`` (the guard does, when it is built), so an
    options value the check would refuse can reach the table through the public API: anything but
    ``"emit"``, even a string that sorts before it, is ``"omit"``. Mutation run 2026-12-01
    (decision.py): ``on_cancel == "emit"`` becoming ``<=`` survived, called equivalent over the two
    accepted values; applied by hand, this test fails on it."""
    for unchecked in ("Emit", "cancel", "", "emi"):
        d = decide(Ending.COMPLETED, CLIENT_CANCEL, GuardOptions(on_cancel=unchecked))  # type: ignore[arg-type]
        assert d.forward is Forward.NOTHING, unchecked
    assert decide(Ending.COMPLETED, CLIENT_CANCEL, EMIT).forward is Forward.CANCELLED


def test_the_fields_of_flags_report_the_defaults_its_constructor_uses() -> None:
    """``Flags`` has its own ``__init__`` (for the deprecated keyword), so its dataclass field defaults
    are never used to build one; they are what ``dataclasses.fields()`` tells a tool that reads the
    dataclass (a serialiser, a form, a docs generator), so they must say what ``Flags()`` does.
    Mutation run 2026-12-01 (decision.py): each field default ``False`` becoming ``True`` survived;
    applied by hand, this test fails on each of the four."""
    built = Flags()
    reported = {f.name: f.default for f in dataclasses.fields(Flags)}
    assert reported == {name: getattr(built, name) for name in reported}
    assert reported == dict.fromkeys(("signal", "client_cancelled", "shutdown", "process_shutdown"), False)
