"""Event objects whose fields can be read are recorded as what was sent.

The guard forwards event objects as they are; it must also read them, for classification and for the
lifecycle (response id, state, usage, error), whatever they are made of: pydantic models, dataclasses,
attrs classes, ``types.SimpleNamespace``, slotted classes, plain classes (properties, class
attributes), Mappings, and any of these nested inside another (a dict event whose ``response`` is an
object, an object whose ``usage`` is a dict). When a terminal cannot be read at all, the record still
follows what was forwarded: ``completed`` / ``incomplete`` flagged ``unverified``, never ``failed``.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from eventguard import Cause, Lifecycle, State, guard
from eventguard.testing.streams import host_context

BOUND = 5.0
RID = "resp_obj"
USAGE = {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}


# -- one builder per way of making an object: build(**fields) -> object --------------------------


@dataclass
class DC:
    type: str | None = None
    response: Any = None
    delta: str | None = None
    id: str | None = None
    status: str | None = None
    usage: Any = None
    error: Any = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    code: str | None = None
    message: str | None = None


def dataclass_(**kw: Any) -> Any:
    return DC(**kw)


class Slotted:
    __slots__ = ("code", "delta", "error", "id", "input_tokens", "message", "output_tokens", "response")
    __slots__ += ("status", "total_tokens", "type", "usage")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)  # the other slots stay empty: reading them raises AttributeError


def slotted(**kw: Any) -> Any:
    return Slotted(**kw)


class Plain:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def plain(**kw: Any) -> Any:
    return Plain(**kw)


def namespace(**kw: Any) -> Any:
    return SimpleNamespace(**kw)


def properties(**kw: Any) -> Any:
    """An object whose fields are read-only properties: listed in no __dict__, no __slots__."""
    cls = type("Props", (), {k: property(lambda self, v=v: v) for k, v in kw.items()})
    return cls()


class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


def pydantic_(**kw: Any) -> Any:
    return Model(**kw)


class FrozenMapping(Mapping[str, Any]):
    """A Mapping that is not a dict."""

    def __init__(self, **kw: Any) -> None:
        self._data = kw

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def mapping(**kw: Any) -> Any:
    return FrozenMapping(**kw)


def attrs_(**kw: Any) -> Any:
    attrs = pytest.importorskip("attrs", reason="attrs is not installed in this environment")
    cls = attrs.make_class("AttrsEvent", {k: attrs.field(default=None) for k in kw}, slots=True)
    return cls(**kw)


def dict_(**kw: Any) -> Any:
    return dict(kw)


BUILDERS: dict[str, Callable[..., Any]] = {
    "dataclass": dataclass_,
    "SimpleNamespace": namespace,
    "attrs": attrs_,
    "slotted": slotted,
    "plain object": plain,
    "properties": properties,
    "pydantic": pydantic_,
    "Mapping": mapping,
}


def run_events(make: Callable[..., Any], inner: Callable[..., Any] | None = None) -> list[Any]:
    """created -> delta -> completed, every level (event, response, usage) built by ``make``."""
    inner = inner or make
    return [
        make(type="response.created", response=inner(id=RID, status="in_progress")),
        make(type="response.output_text.delta", delta="hi"),
        make(
            type="response.completed",
            response=inner(id=RID, status="completed", usage=inner(**USAGE)),
        ),
    ]


async def guarded(events: list[Any], **kw: Any) -> tuple[list[Any], Lifecycle]:
    async def source() -> AsyncIterator[Any]:
        for e in events:
            yield e

    g = guard(source(), asyncio.Event(), **kw)
    async with asyncio.timeout(BOUND), g:
        out = [e async for e in g]
    return out, g.lifecycle


def assert_completed(out: list[Any], events: list[Any], lc: Lifecycle) -> None:
    assert len(out) == len(events) and all(a is b for a, b in zip(out, events, strict=True))
    assert (lc.state, lc.cause) == (State.COMPLETED, Cause.NORMAL)
    assert lc.info.response_id == RID
    assert lc.usage is not None and (lc.usage.input_tokens, lc.usage.total_tokens) == (3, 8)
    assert not lc.unverified
    assert lc.anomalies == []
    assert [t.to_state for t in lc.transitions] == [State.IN_PROGRESS, State.COMPLETED]


@pytest.mark.parametrize("kind", list(BUILDERS))
async def test_an_object_stream_is_recorded_as_completed_with_its_id_and_usage(kind: str) -> None:
    events = run_events(BUILDERS[kind])
    out, lc = await guarded(events)
    assert_completed(out, events, lc)


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        ("dict", "dataclass"),
        ("dict", "SimpleNamespace"),
        ("dict", "pydantic"),
        ("dataclass", "dict"),
        ("SimpleNamespace", "slotted"),
        ("pydantic", "plain object"),
        ("slotted", "Mapping"),
        ("properties", "SimpleNamespace"),
    ],
)
async def test_nested_objects_of_another_kind_are_read_at_every_level(outer: str, inner: str) -> None:
    builders = {**BUILDERS, "dict": dict_}
    events = run_events(builders[outer], builders[inner])
    out, lc = await guarded(events)
    assert_completed(out, events, lc)


@pytest.mark.parametrize("kind", ["dataclass", "SimpleNamespace", "slotted", "pydantic"])
async def test_a_failed_object_terminal_records_its_error_object(kind: str) -> None:
    make = BUILDERS[kind]
    events = [
        make(type="response.created", response=make(id=RID, status="in_progress")),
        make(
            type="response.failed",
            response=make(id=RID, status="failed", error=make(code="boom", message="it broke")),
        ),
    ]
    out, lc = await guarded(events)
    assert out[-1] is events[-1]
    assert (lc.state, lc.cause) == (State.FAILED, Cause.ERROR)
    assert lc.error is not None and (lc.error.code, lc.error.message) == ("boom", "it broke")


@pytest.mark.parametrize("kind", ["dataclass", "SimpleNamespace"])
async def test_an_object_cancel_and_an_object_incomplete_are_read_by_status(kind: str) -> None:
    make = BUILDERS[kind]
    created = make(type="response.created", response=make(id=RID, status="in_progress"))
    _, lc = await guarded([created, make(type="response.failed", response=make(id=RID, status="cancelled"))])
    assert lc.state is State.CANCELLED
    _, lc = await guarded(
        [created, make(type="response.incomplete", response=make(id=RID, status="incomplete"))]
    )
    assert (lc.state, lc.unverified) == (State.INCOMPLETE, False)


async def test_a_queued_object_stream_goes_through_queued() -> None:
    events = [
        namespace(type="response.created", response=namespace(id=RID, status="queued")),
        namespace(type="response.in_progress", response=namespace(id=RID, status="in_progress")),
        namespace(type="response.completed", response=namespace(id=RID, status="completed")),
    ]
    _, lc = await guarded(events)
    assert [t.to_state for t in lc.transitions] == [State.QUEUED, State.IN_PROGRESS, State.COMPLETED]


class EventType(enum.Enum):
    CREATED = "response.created"
    DELTA = "response.output_text.delta"
    COMPLETED = "response.completed"


class Status(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


async def test_enum_types_and_statuses_are_read_by_their_value() -> None:
    events = [
        namespace(type=EventType.CREATED, response=namespace(id=RID, status=Status.IN_PROGRESS)),
        namespace(type=EventType.DELTA, delta="x"),
        namespace(type=EventType.COMPLETED, response=namespace(id=RID, status=Status.COMPLETED, usage=USAGE)),
    ]
    out, lc = await guarded(events)
    assert_completed(out, events, lc)


async def test_a_synthesised_terminal_is_built_on_an_object_snapshot() -> None:
    # Shutdown before the completion: the guard replaces it with a response.failed built on the last
    # snapshot, which came from an object.
    ctx = host_context()
    ctx.shutdown.set()
    events = run_events(namespace)
    out, lc = await guarded(events, context=ctx)
    assert out[-1]["type"] == "response.failed"
    assert out[-1]["response"]["id"] == RID
    assert out[-1]["response"]["error"]["code"] == "server_shutdown"
    assert json.dumps(out[-1])  # plain data: the host can send it
    assert lc.state is State.FAILED


# -- what cannot be read is recorded as forwarded, flagged unverified, never failed ----------------


@pytest.mark.parametrize(
    ("terminal", "state"),
    [
        (namespace(type="response.completed"), State.COMPLETED),  # no response at all
        (namespace(type="response.completed", response=42), State.COMPLETED),
        ({"type": "response.completed", "response": "not an object"}, State.COMPLETED),
        (namespace(type="response.incomplete", response=namespace(id=[1])), State.INCOMPLETE),
    ],
    ids=["no response", "a number", "a string (dict event)", "an unreadable id"],
)
async def test_an_unreadable_completion_is_recorded_as_forwarded_and_unverified(
    terminal: Any, state: State
) -> None:
    created = namespace(type="response.created", response=namespace(id=RID, status="in_progress"))
    out, lc = await guarded([created, terminal])
    assert out[-1] is terminal
    assert lc.state is state
    assert lc.unverified
    assert [a.kind for a in lc.anomalies] == ["invalid_lifecycle_event", "unverified_completion"]


@pytest.mark.parametrize("terminal", ["completed", "incomplete"])
async def test_a_completion_whose_start_was_never_read_is_completed_unverified(terminal: str) -> None:
    # created could not be read (or never came): the forwarded completion is still what is recorded.
    bad_created = {"type": "response.created", "response": "not an object"}
    end = {"type": f"response.{terminal}", "response": {"id": RID, "status": terminal}}
    for events in ([bad_created, end], [end]):
        out, lc = await guarded(events)
        assert out[-1] is end
        assert lc.state is State(terminal)
        assert lc.unverified
        assert "unverified_completion" in [a.kind for a in lc.anomalies]
        assert "illegal_transition" not in [a.kind for a in lc.anomalies]
        assert lc.info.response_id == RID


async def test_a_recovered_run_that_never_replays_its_start_is_completed_unverified() -> None:
    ctx = host_context()
    ctx.is_recovery = True
    end = {"type": "response.completed", "response": {"id": RID, "status": "completed"}}
    out, lc = await guarded([end], context=ctx)
    assert out == [end]
    assert (lc.state, lc.unverified) == (State.COMPLETED, True)


async def test_a_readable_failed_terminal_without_a_start_stays_failed() -> None:
    end = {"type": "response.failed", "response": {"id": RID, "status": "failed"}}
    _, lc = await guarded([end])
    assert (lc.state, lc.unverified) == (State.FAILED, False)
