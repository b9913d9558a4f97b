"""A constructor's settings are checked where they are given: a wrong type is a TypeError, a value out
of range a ValueError, each naming the argument, before anything runs.

Unchecked, ``SqlSink(flush_interval="1")`` was built without a word and then ended the first stream
it recorded (the guard's hot path raised the event loop's TypeError); ``max_payload_bytes="x"`` sent
every event to the quarantine instead of the database; a ``nan`` duration compares false with
everything.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from eventguard import ResponseStore, SqlResponseProvider, SqlSink, guard
from eventguard.lifecycle import State
from eventguard.replicas import ReplicaOptions

#: Bound on each test's whole run: the smallest settings spool and replay, each step short.
STEP = 30.0

HUGE = 10**400  # an int no float holds
#: Values no duration, count or flag may take, with the error each is.
NOT_A_NUMBER: list[tuple[object, type[Exception]]] = [
    ("1", TypeError),
    (b"1", TypeError),
    (True, TypeError),
    ([1], TypeError),
    ("\x00", TypeError),
    ("\udcff", TypeError),
]
BAD_DURATIONS: list[tuple[object, type[Exception]]] = [
    *NOT_A_NUMBER,
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-math.inf, ValueError),
    (-1, ValueError),
    (-1e-9, ValueError),
    (HUGE, ValueError),
]
BAD_COUNTS: list[tuple[object, type[Exception]]] = [
    *NOT_A_NUMBER,
    (2.5, TypeError),
    (math.nan, TypeError),
    (1.0, TypeError),
    (0, ValueError),
    (-1, ValueError),
    (None, TypeError),
]
BAD_FLAGS: list[tuple[object, type[Exception]]] = [("false", TypeError), (0, TypeError), (1, TypeError)]


def _sink(tmp_path: Path) -> Callable[..., object]:
    return lambda **kw: SqlSink(f"sqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl", **kw)


def _store(tmp_path: Path) -> Callable[..., object]:
    def make(**kw: Any) -> object:
        store = ResponseStore(f"sqlite:///{tmp_path / 'eg.db'}", **kw)
        asyncio.run(store.aclose())
        return store

    return make


def _provider(tmp_path: Path) -> Callable[..., object]:
    return lambda **kw: SqlResponseProvider(f"sqlite:///{tmp_path / 'eg.db'}", **kw)


def _replicas(_tmp_path: Path) -> Callable[..., object]:
    # A heartbeat is checked against the lease too: a lease long enough for any heartbeat tried.
    return lambda **kw: ReplicaOptions(**({"lease": 1e10} if "heartbeat" in kw else {}), **kw)


def _guard(_tmp_path: Path) -> Callable[..., object]:
    async def empty() -> AsyncIterator[Any]:
        return
        yield

    return lambda **kw: guard(empty(), asyncio.Event(), **kw)


#: (what is built, the setting, whether zero is allowed, whether None is allowed)
DURATIONS = [
    (_sink, "flush_interval", True, False),
    (_sink, "close_timeout", False, False),
    (_sink, "busy_timeout", True, False),
    (_sink, "statement_timeout", False, True),
    (_sink, "connect_timeout", False, False),
    (_store, "busy_timeout", True, False),
    (_provider, "statement_timeout", False, True),
    (_provider, "busy_timeout", True, False),
    (_provider, "connect_timeout", False, False),
    (_guard, "cancel_grace", True, True),
    (_guard, "flush_timeout", True, False),
    (_replicas, "lease", False, False),
    (_replicas, "heartbeat", False, True),
    (_replicas, "reap_every", False, True),
    (_replicas, "cancel_poll", False, False),
    (_replicas, "cancel_wait", True, False),
    (_replicas, "settle_wait", True, True),
]
COUNTS = [(_sink, "flush_every"), (_sink, "max_buffered"), (_sink, "max_payload_bytes")]
FLAGS = [
    (_sink, "pooler_safe", False),
    (_sink, "auto_migrate", True),
    (_store, "pooler_safe", False),
    (_provider, "auto_migrate", True),
    (_guard, "strict", False),
    (_guard, "keep_shutdown_completion", False),
    (_guard, "recoverable", True),
]


def _refused(make: Callable[..., object], name: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        make(**{name: value})
    assert str(caught.value).startswith(f"{name} must be"), str(caught.value)
    assert str(caught.value).isprintable()


def _named(value: object) -> str:
    return str(getattr(value, "__name__", value))


@pytest.mark.parametrize(("build", "name", "zero", "none"), DURATIONS, ids=_named)
def test_a_duration_that_is_not_a_finite_number_of_seconds_is_refused_naming_it(
    build: Callable[[Path], Callable[..., object]], name: str, zero: bool, none: bool, tmp_path: Path
) -> None:
    make = build(tmp_path)
    for value, error in BAD_DURATIONS:
        _refused(make, name, value, error)
    if not zero:
        _refused(make, name, 0, ValueError)
    if not none:
        _refused(make, name, None, TypeError)
    # What is meant as a duration is taken, int or float, as small or as large as a float holds.
    for value in (*((0, 0.0) if zero else ()), *((None,) if none else ()), 1e-6, 1, 2.5, 1e9):
        make(**{name: value})


@pytest.mark.parametrize(("build", "name"), COUNTS, ids=_named)
def test_a_count_below_one_or_not_an_int_is_refused_naming_it(
    build: Callable[[Path], Callable[..., object]], name: str, tmp_path: Path
) -> None:
    make = build(tmp_path)
    for value, error in BAD_COUNTS:
        _refused(make, name, value, error)
    for value in (1, 2, 10**12):
        make(**{name: value})


@pytest.mark.parametrize(("build", "name", "none"), FLAGS, ids=_named)
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(
    build: Callable[[Path], Callable[..., object]], name: str, none: bool, tmp_path: Path
) -> None:
    """``"false"`` is truthy: taken as it is, it would mean the opposite of what was written."""
    make = build(tmp_path)
    for value, error in BAD_FLAGS:
        _refused(make, name, value, error)
    if not none:
        _refused(make, name, None, TypeError)
    for value in (True, False, *((None,) if none else ())):
        make(**{name: value})


def test_a_replicas_jitter_is_a_finite_share_from_zero_to_one() -> None:
    """``jitter=1e300`` was taken: the reaper would wait that many times its interval."""
    bad = [
        *NOT_A_NUMBER,
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-0.1, ValueError),
        (1.01, ValueError),
    ]
    for value, error in [*bad, (1e300, ValueError)]:
        _refused(_replicas(Path()), "jitter", value, error)
    for value in (0, 0.0, 0.5, 1, 1.0):
        assert ReplicaOptions(jitter=value).jitter == value


@pytest.mark.parametrize(("lease", "heartbeat"), [(1, 10), (10, 10), (5, 5.0), (0.3, None)])
def test_a_replicas_heartbeat_must_be_shorter_than_its_lease(lease: float, heartbeat: float | None) -> None:
    """Renewed less often than it lasts, a lease expires between renewals and the other replicas'
    reapers end this replica's live runs as owner_lost. (0.3 with the default heartbeat is fine.)"""
    if heartbeat is None:
        assert ReplicaOptions(lease=lease).heartbeat_every < lease
        return
    with pytest.raises(ValueError, match=r"^heartbeat must be shorter than lease"):
        ReplicaOptions(lease=lease, heartbeat=heartbeat)
    assert ReplicaOptions(lease=lease, heartbeat=lease * 0.99).heartbeat == lease * 0.99


@pytest.mark.parametrize("name", ["schema", "owner", "predicate", "redact"])
def test_a_sink_setting_of_the_wrong_kind_is_refused_naming_it(name: str, tmp_path: Path) -> None:
    make = _sink(tmp_path)
    _refused(make, name, 5, TypeError)
    _refused(make, name, b"x", TypeError)


@pytest.mark.parametrize("build", [_store, _provider], ids=_named)
def test_a_schema_that_is_not_a_str_is_refused_naming_it(
    build: Callable[[Path], Callable[..., object]], tmp_path: Path
) -> None:
    _refused(build(tmp_path), "schema", 5, TypeError)


def test_the_smallest_settings_a_sink_takes_still_record_every_event(tmp_path: Path) -> None:
    """The edges that are allowed work: a flush on every event and at once, one buffered event at a
    time (the rest spooled and replayed), payloads cut to the least: every event forwarded is
    stored, and the response ends completed."""
    url = f"sqlite:///{tmp_path / 'eg.db'}"
    sent = 40

    async def stream() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "response.created", "response": {"id": "resp_edges", "status": "in_progress"}}
        for i in range(sent):
            yield {"type": "response.output_text.delta", "delta": f"{i}\x00\udcff\x1b[2J"}
        yield {"type": "response.completed", "response": {"id": "resp_edges", "status": "completed"}}

    async def main() -> tuple[int, int, str]:
        sink = SqlSink(
            url,
            spool_path=tmp_path / "spool.jsonl",
            flush_every=1,
            flush_interval=0,
            max_buffered=1,
            max_payload_bytes=1,
            close_timeout=1e-3,
        )
        forwarded = 0
        async with asyncio.timeout(STEP):
            await sink.start()
            async with guard(stream(), asyncio.Event(), sink=sink, cancel_grace=0) as g:
                async for _ in g:
                    forwarded += 1
            await sink.aclose()
            spilled = sink.stats.batches_spooled
            sink = SqlSink(url, spool_path=tmp_path / "spool.jsonl")
            await sink.start()
            replayed = await sink.replay_spool()  # what the one-event buffer spilled
            await sink.aclose()
            assert replayed.events == spilled > 0 and replayed.quarantined == 0
            async with ResponseStore(url) as store:
                history = await store.history("resp_edges")
        assert history is not None
        stored = sum(len(attempt.events) for attempt in history.attempts)
        return forwarded, stored, history.response.status

    forwarded, stored, status = asyncio.run(main())
    assert forwarded == stored == sent + 2
    assert status == State.COMPLETED.value


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        ("cancel_grace", "10", TypeError),
        ("cancel_grace", math.nan, ValueError),
        ("on_cancel", "drop", ValueError),
        ("on_guard", 5, TypeError),
    ],
)
def test_a_guarded_server_refuses_a_bad_guard_setting_when_it_is_built(
    setting: str, value: Any, error: type[Exception], tmp_path: Path
) -> None:
    """Not at each request: every guard it builds would raise it, and every response fail."""
    from eventguard.foundry import GuardedResponsesHostServer
    from eventguard.testing import chat_agent

    agent, _probe = chat_agent()
    with pytest.raises(error, match=f"^{setting} must be"):
        GuardedResponsesHostServer(
            agent,
            database=f"sqlite:///{tmp_path / 'eg.db'}",
            configure_observability=None,
            **{setting: value},
        )
    assert not (tmp_path / "eg.db").exists()  # refused before anything was built


async def _async_answer(*_args: object) -> bool:
    return False


class _AsyncCall:
    async def __call__(self, *_args: object) -> bool:
        return False


@pytest.mark.parametrize("name", ["predicate", "redact"])
@pytest.mark.parametrize("value", [_async_answer, _AsyncCall()], ids=["async-def", "async-call"])
def test_an_async_callback_is_refused_naming_it(name: str, value: object, tmp_path: Path) -> None:
    """Called for its answer at once: an async predicate's coroutine is always true (every event
    kept), an async redactor's is stored as its repr (every payload lost)."""
    with pytest.raises(TypeError, match=f"^{name} must answer at once, not be async$"):
        _sink(tmp_path)(**{name: value})


class _AsyncSignal:
    async def is_set(self) -> bool:
        return False


@pytest.mark.parametrize("where", ["cancellation_signal", "process_shutdown"])
def test_a_signal_whose_is_set_is_async_is_refused_at_guard(where: str) -> None:
    """Its coroutine is always true: every response was recorded cancelled by the client and its
    completion withheld, with only a RuntimeWarning to say why."""

    async def empty() -> AsyncIterator[Any]:
        return
        yield

    signal: Any = _AsyncSignal() if where == "cancellation_signal" else asyncio.Event()
    extra = {"process_shutdown": _AsyncSignal()} if where == "process_shutdown" else {}
    with pytest.raises(TypeError, match=f"^{where}.is_set\\(\\) must answer at once with a bool"):
        guard(empty(), signal, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argument", "value"),
    [("sink", "sqlite:///x.db"), ("sink", object()), ("info", {"response_id": "resp_1"}), ("info", "resp_1")],
)
def test_guard_refuses_a_sink_or_info_of_another_kind_naming_it(argument: str, value: object) -> None:
    """Before, an AttributeError from inside (``'str' object has no attribute 'recorder'``)."""

    async def empty() -> AsyncIterator[Any]:
        return
        yield

    with pytest.raises(TypeError, match=f"^{argument} must be a "):
        guard(empty(), asyncio.Event(), **{argument: value})


@pytest.mark.parametrize("options", [{"cancel_grace": 1}, None, "omit"])
def test_a_guard_built_with_options_of_another_kind_is_refused_naming_them(options: Any) -> None:
    from eventguard import Guard

    async def empty() -> AsyncIterator[Any]:
        return
        yield

    with pytest.raises(TypeError, match=r"^options must be a GuardOptions, not "):
        Guard(empty(), asyncio.Event(), options)


@pytest.mark.parametrize("lifecycle", [None, "x", {"state": "new"}])
def test_a_sink_refuses_to_record_something_that_is_not_a_lifecycle(lifecycle: Any, tmp_path: Path) -> None:
    """Before, it was taken, and the writer task failed on it later in the background."""
    sink = SqlSink(f"sqlite:///{tmp_path / 'eg.db'}", spool_path=tmp_path / "spool.jsonl")
    with pytest.raises(TypeError, match=r"^lifecycle must be a Lifecycle, not "):
        sink.recorder(lifecycle)
    assert sink.stats.unexpected_errors == 0
