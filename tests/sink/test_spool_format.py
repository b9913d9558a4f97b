"""The spool's entry format: what a crash, garbage or a hostile string can do to a spool file.

Every test writes real files and reads them back through ``SpoolFile.entries()``: an entry that
cannot be loaded is a ``BadEntry`` with a reason, never an exception, and never takes another
entry with it.
"""

from __future__ import annotations

import gc
import json
import os
import tracemalloc
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from eventguard.sink.batch import Batch, BatchFormatError
from eventguard.sink.spool import BadEntry, Spool, SpoolFile, encode_entry
from eventguard.sql.engine import PreSerialised
from eventguard.sql.tables import responses

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def make_batch(rid: str = "resp_1", text: str = "boom", n_events: int = 3, payload_pad: int = 0) -> Batch:
    """A batch as a recorder makes one, every column filled; ``text`` in every free-text field."""
    row: dict[str, Any] = {
        "status": "failed",
        "cause": "error",
        "attempt": 1,
        "state_seq": 3,
        "created_at": T0,
        "started_at": T0 + timedelta(seconds=1),
        "finished_at": T0 + timedelta(seconds=2),
        "duration_ms": 1000.5,
        "input_tokens": 3,
        "output_tokens": 5,
        "total_tokens": 8,
        "error_code": f"code {text}",
        "error_message": text,
        "error_type": f"RuntimeError{text}",
        "conversation_id": f"conv {text}",
        "chain_id": None,
        "partition_key": text,
        "agent_name": f"agent {text}",
        "background": False,
        "stream": True,
        "store": None,
        "is_recovery": False,
        "is_steered_turn": False,
        "steering_cut_short": False,
        "unverified": False,
        "event_count": n_events,
        "owner": f"host:1:{text}",
        "updated_at": T0 + timedelta(seconds=2),
    }
    # Columns added to the schema since (nullable): a batch carries every column of the table.
    for column in responses.columns:
        if column.name not in ("pk", "version", "response_id"):
            row.setdefault(str(column.name), None)
    pad = "x" * payload_pad
    events = [
        (
            1,
            i,
            f"response.output_text.delta{text}",
            PreSerialised(json.dumps({"delta": text, "pad": pad}, ensure_ascii=False)),
        )
        for i in range(n_events)
    ]
    transitions = [
        {
            "response_id": rid,
            "attempt": 1,
            "idx": 0,
            "from_state": "in_progress",
            "to_state": "failed",
            "cause": "error",
            "reason": f"raised {text}",
            "at": T0 + timedelta(seconds=2),
        }
    ]
    anomalies = [
        {
            "response_id": rid,
            "attempt": 1,
            "source": "guard",
            "idx": 0,
            "kind": "status_mismatch",
            "reason": text,
            "at": T0,
            "event_type": text,
            "event_index": 2,
            "payload": PreSerialised(json.dumps({"why": text}, ensure_ascii=False)),
        },
        {
            "response_id": rid,
            "attempt": 1,
            "source": "sink",
            "idx": 0,
            "kind": "payload_truncated",
            "reason": "r",
            "at": T0,
            "event_type": None,
            "event_index": None,
            "payload": None,
        },
    ]
    return Batch(
        response_id=rid,
        attempt=1,
        owner=f"host:1:{text}",
        row=row,
        terminal=True,
        recorded_at=T0 + timedelta(seconds=3),
        events=events,
        transitions=transitions,
        anomalies=anomalies,
        refusal_idx=1,
        stream_id=f"stream {text}",
    )


def v0_line(batch: Batch) -> bytes:
    """The batch as the spool wrote it before records had a header (format version 0)."""
    return orjson.dumps(
        {
            "response_id": batch.response_id,
            "attempt": batch.attempt,
            "owner": batch.owner,
            "row": batch.row,
            "terminal": batch.terminal,
            "events": [
                {
                    "response_id": batch.response_id,
                    "attempt": a,
                    "seq": s,
                    "type": t,
                    "payload": p,
                    "recorded_at": batch.recorded_at,
                }
                for a, s, t, p in batch.events
            ],
            "transitions": batch.transitions,
            "anomalies": batch.anomalies,
            "refusal_idx": batch.refusal_idx,
            "stream_id": batch.stream_id,
        }
    )


def framed(body: bytes, version: int = 1) -> bytes:
    """``body`` in a well-formed entry header (length and checksum right)."""
    return b"EG%d %d %08x %s\n" % (version, len(body), zlib.crc32(body), body)


def read_all(path: Path) -> list[Batch | BadEntry]:
    spool = Spool(path.with_name("unused-live.jsonl"))
    file = _claim_one(spool, path)
    try:
        return list(file.entries())
    finally:
        spool.release(file)


def _claim_one(spool: Spool, path: Path) -> SpoolFile:
    # Read a file in place, through the same claim take() makes.
    from eventguard.sink.spool import _claim

    file = _claim(path)
    assert file is not None
    return file


def replay(spool: Spool) -> list[Batch | BadEntry]:
    """Everything take() hands out, each file done()."""
    found: list[Batch | BadEntry] = []
    for file in spool.take():
        found.extend(file.entries())
        spool.done(file)
    return found


def batches_of(records: list[Batch | BadEntry]) -> list[Batch]:
    return [r for r in records if isinstance(r, Batch)]


def bad_of(records: list[Batch | BadEntry]) -> list[BadEntry]:
    return [r for r in records if isinstance(r, BadEntry)]


# -- exact round trips ---------------------------------------------------------------------------

HOSTILE = {
    "lone_low_surrogate": "bad byte \udcff here",
    "lone_high_surrogate": "\ud800",
    "surrogates_that_pair_if_joined": "\ud83d\ude00",  # two code points, not the emoji
    "emoji_and_surrogate": "\U0001f600\udc80",
    "nul": "a\x00b\x00",
    "ansi": "\x1b[31mred\x1b[0m\x07\r\n\t",
    "line_separators": "\u2028\u2029\x85",
    "one_mib": "y" * (1 << 20) + "\udcff",
    "json_lookalike": '"}\n{"EG1 0 00000000 ',
    "marker_lookalike": 'strings"utf8-bytes\\u00ff',
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_every_string_round_trips_exactly(tmp_path: Path, text: str) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    batch = make_batch(rid=f"resp_{text[:20]}", text=text)
    assert spool.append([batch, make_batch("resp_plain")]) == 2
    # One line per record (plus the newline each append starts with): no raw newline inside.
    assert (tmp_path / "spool.jsonl").read_bytes().count(b"\n") == 3
    got = replay(spool)
    assert got == [batch, make_batch("resp_plain")]
    back = got[0]
    assert isinstance(back, Batch)
    assert back.row["error_message"] == text and back.anomalies[0]["reason"] == text
    assert back.events[0][2] == f"response.output_text.delta{text}"
    # Payloads come back as the JSON text they were, marked as such for the database.
    assert all(type(p) is PreSerialised for _, _, _, p in back.events)
    assert type(back.anomalies[0]["payload"]) is PreSerialised
    assert back.anomalies[1]["payload"] is None
    assert not spool.pending()


def test_a_recorders_batch_round_trips(tmp_path: Path) -> None:
    from eventguard.lifecycle import Lifecycle, ResponseInfo, State
    from eventguard.sink import SqlSink
    from eventguard.sink.recorder import SqlRecorder

    sink = SqlSink(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}", spool_path=tmp_path / "spool.jsonl")
    lc = Lifecycle(info=ResponseInfo(response_id="resp_rec"))
    rec = SqlRecorder(sink.writer, lc)
    lc.transition(State.IN_PROGRESS, reason="started \udcff")
    rec.event(0, "response.created", {"type": "response.created", "text": "\x00 nul"})
    rec.event(1, "odd", object())  # not a mapping: stored as a stand-in, with a sink anomaly
    lc.transition(State.FAILED, reason="boom \udcff")
    batch = rec.collect()
    assert batch is not None
    rec.encode_some(batch)  # serialised before it is spooled (a batch is plain data)
    sink.spool.append([batch])
    (back,) = replay(sink.spool)
    assert back == batch


def test_to_json_never_raises_for_content() -> None:
    from decimal import Decimal

    batch = make_batch()
    batch.row["total_tokens"] = 2**80  # beyond orjson's 64 bits
    batch.row["agent_name"] = Decimal("1.5")  # not JSON at all: kept as its text
    batch.anomalies[0]["reason"] = "\udcff"
    back = Batch.from_json(batch.to_json())
    assert back.row["total_tokens"] == 2**80
    assert back.row["agent_name"] == "1.5"
    assert back.anomalies[0]["reason"] == "\udcff"


def test_the_common_path_is_plain_orjson() -> None:
    body = make_batch(text="é ü \U0001f600").to_json()
    assert b'"strings"' not in body  # the rare form only for what orjson refuses
    assert orjson.loads(body)["row"]["error_message"] == "é ü \U0001f600"
    assert b'"strings":"utf8-bytes"' in make_batch(text="\udcff").to_json()


def test_version_0_spool_still_replays(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    old = [make_batch("resp_a"), make_batch("resp_b", n_events=0)]
    old[1].recorded_at = None  # version 0 keeps it per event: without events there is none
    path.write_bytes(b"".join(v0_line(b) + b"\n" for b in old))
    spool = Spool(path)
    new = make_batch("resp_c")
    spool.append([new])  # a new sink appends in version 1 to the old file
    assert replay(spool) == [*old, new]


# -- torn writes, garbage ------------------------------------------------------------------------


@pytest.mark.parametrize("old_format", [False, True], ids=["v1", "v0"])
@pytest.mark.parametrize("cut", [1, 5, 20, -2, -1])
def test_torn_last_line_then_a_new_append(tmp_path: Path, old_format: bool, cut: int) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    first = [make_batch("resp_1"), make_batch("resp_2")]
    if old_format:
        path.write_bytes(b"".join(v0_line(b) + b"\n" for b in first))
        whole = v0_line(make_batch("resp_torn"))
    else:
        spool.append(first)
        whole = encode_entry(make_batch("resp_torn"))[:-1]  # without its newline
    # The process died in the middle of its next write.
    torn = whole[:cut]
    with path.open("ab") as fh:
        fh.write(torn)
    # The restarted sink appends onto the fragment.
    after = make_batch("resp_after")
    spool.append([after])
    got = replay(spool)
    assert batches_of(got) == [*first, after]
    (bad,) = bad_of(got)
    assert bad.raw == torn
    if old_format:
        assert "not JSON" in bad.reason, bad.reason
    elif cut > 5 or cut < 0:  # a header and part of the batch: the length tells it torn
        assert "torn entry" in bad.reason, bad.reason
    else:
        assert "not a spool entry" in bad.reason or "header" in bad.reason, bad.reason
    assert not list(tmp_path.glob("spool.jsonl.*"))


def test_a_write_torn_before_its_newline_is_a_complete_entry(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    record = encode_entry(make_batch("resp_1"))
    path.write_bytes(b"\n" + record[:-1])  # everything but the newline: the record is whole
    assert read_all(path) == [make_batch("resp_1")]


def test_garbage_in_the_middle_takes_nothing_else_with_it(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    good = [make_batch(f"resp_{i}") for i in range(4)]
    flipped = bytearray(encode_entry(make_batch("resp_flipped")))
    flipped[-10] ^= 0x01  # one bit changed on disk
    lines = [
        encode_entry(good[0]),
        b"\x00\x00\x00\x00\n",  # a block of zeros (a crash on some file systems)
        bytes(flipped),
        encode_entry(good[1]),
        b"not a record at all\n",
        b"EG1 banana\n",
        b'{"half": "a version-0 line\n',
        encode_entry(good[2]),
        b"\xff\xfe\x80 binary \xc3\x28\n",
        encode_entry(good[3]),
    ]
    path.write_bytes(b"".join(lines))
    got = read_all(path)
    assert batches_of(got) == good
    bad = bad_of(got)
    assert [b.line for b in bad] == [2, 3, 5, 6, 7, 9]
    assert "checksum" in bad[1].reason
    assert bad[1].raw == bytes(flipped).rstrip(b"\n")
    assert all(b.path == path for b in bad)


# -- wrong shapes: a reason each, never an exception ---------------------------------------------


def _body(**changes: Any) -> bytes:
    data = orjson.loads(make_batch().to_json())
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return orjson.dumps(data)


_DROP = object()


def _nested(path: tuple[Any, ...], value: Any) -> bytes:
    data = orjson.loads(make_batch().to_json())
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return orjson.dumps(data)


WRONG_SHAPES: dict[str, tuple[bytes, str]] = {
    "row_null": (_body(row=None), "row: expected an object, got null"),
    "events_a_number": (_body(events=5), "events: expected an array, got a number"),
    "no_response_id": (_body(response_id=_DROP), "response_id: missing"),
    "no_row": (_body(row=_DROP), "row: missing"),
    "attempt_a_string": (_body(attempt="1"), "attempt: expected an integer, got a string ('1')"),
    "attempt_a_boolean": (_body(attempt=True), "attempt: expected an integer, got a boolean"),
    "terminal_null": (_body(terminal=None), "terminal: expected true or false, got null"),
    "event_too_short": (_body(events=[[1, 2, "t"]]), "events[0]: expected [attempt, seq, type, payload]"),
    "event_payload_null": (_body(events=[[1, 2, "t", None]]), "events[0].payload: expected a string"),
    "event_seq_a_float": (_body(events=[[1, 2.5, "t", "{}"]]), "events[0].seq: expected an integer"),
    "v0_event_without_payload": (
        _body(events=[{"attempt": 1, "seq": 0, "type": "t", "recorded_at": None}]),
        "events[0].payload: missing",
    ),
    "events_without_a_time": (_body(recorded_at=None), "recorded_at: missing, and the batch has events"),
    "bad_recorded_at": (_body(recorded_at="yesterday"), "recorded_at: expected an ISO 8601 time"),
    "transition_null": (_body(transitions=[None]), "transitions[0]: expected an object, got null"),
    "transitions_an_object": (_body(transitions={}), "transitions: expected an array, got an object"),
    "anomaly_time_garbled": (_nested(("anomalies", 0, "at"), "soon"), "anomalies[0].at: expected an ISO"),
    # PostgreSQL's jsonb refuses these; SQLite stored them, and reading the response back failed.
    "event_payload_not_json": (_nested(("events", 0, 3), "{not json"), "events[0].payload: not JSON text"),
    "anomaly_payload_not_json": (
        _nested(("anomalies", 0, "payload"), "[1, 2"),
        "anomalies[0].payload: not JSON text",
    ),
    # Python's json takes these, the store (orjson) does not: SQLite stored them, reading back failed.
    "event_payload_nan": (_nested(("events", 0, 3), "[1, NaN]"), "events[0].payload: not JSON text"),
    "event_payload_escaped_lone_surrogate": (
        _nested(("events", 0, 3), '"\\ud800"'),
        "events[0].payload: not JSON text",
    ),
    "anomaly_payload_infinity": (
        _nested(("anomalies", 0, "payload"), "Infinity"),
        "anomalies[0].payload: not JSON text",
    ),
    "anomaly_payload_an_object": (
        _nested(("anomalies", 0, "payload"), {"a": 1}),
        "anomalies[0].payload: expected JSON text (a string), got an object",
    ),
    "row_status_missing": (_nested(("row", "status"), _DROP), "row.status: missing"),
    "row_status_a_number": (_nested(("row", "status"), 7), "row.status: expected a string, got a number (7)"),
    "row_time_a_number": (_nested(("row", "updated_at"), 5), "row.updated_at: expected an ISO 8601 time"),
    "row_flag_a_string": (_nested(("row", "unverified"), "no"), "row.unverified: expected true or false"),
    "refusal_idx_a_string": (_body(refusal_idx="0"), "refusal_idx: expected an integer"),
    "a_json_array": (b"[1, 2, 3]", "an array, not a batch"),
    "a_json_string": (b'"hello"', "a string, not a batch"),
    "unknown_string_form": (_body(strings="utf-7"), "strings: unknown encoding 'utf-7'"),
    "not_in_the_bytes_form": (_body(strings="utf8-bytes", owner="\u20ac"), "not in the utf8-bytes form"),
    "not_json": (b"{nope", "not JSON"),
    "not_utf8": (b'{"response_id": "\xff\xfe"}', "not JSON"),
}


@pytest.mark.parametrize("framing", ["v1", "v0"])
@pytest.mark.parametrize("name", list(WRONG_SHAPES))
def test_wrong_shapes_are_bad_entries_with_a_reason(tmp_path: Path, name: str, framing: str) -> None:
    body, reason = WRONG_SHAPES[name]
    if framing == "v0" and not body.startswith(b"{"):
        reason = "not a spool entry"  # a version-0 line is a JSON object, or no entry at all
    path = tmp_path / "spool.jsonl"
    line = framed(body) if framing == "v1" else body + b"\n"
    path.write_bytes(encode_entry(make_batch("resp_before")) + line + encode_entry(make_batch("resp_after")))
    got = read_all(path)
    assert batches_of(got) == [make_batch("resp_before"), make_batch("resp_after")]
    (bad,) = bad_of(got)
    assert reason in bad.reason, bad.reason
    assert bad.line == 2 and bad.raw == line.rstrip(b"\n")
    with pytest.raises(BatchFormatError):
        Batch.from_json(body)


FILES: dict[str, tuple[bytes, list[str]]] = {
    "empty": (b"", []),
    "only_newlines": (b"\n\n\n", []),
    "only_a_fragment": (encode_entry(make_batch())[:40], ["torn entry"]),
    "only_a_header_fragment": (b"EG1 12", ["torn or garbled entry header"]),
    "a_future_version": (
        framed(b'{"whatever": "comes next"}', version=2) + encode_entry(make_batch()),
        ["entry format version 2 (written by a newer eventguard"],
    ),
    "version_zero_header": (framed(b"{}", version=0), ["unknown entry format version 0"]),
    "eg_without_version": (b"EGG 1 2 3\n", ["not a spool entry"]),
    "longer_than_declared": (b"EG1 2 00000000 {}}\n", ["garbled entry: 3 bytes where its header says 2"]),
    "non_utf8_bytes": (b"\xc3\x28\xa0\xa1\xff\n", ["not a spool entry"]),
    "nul_bytes": (b"\x00" * 4096, ["not a spool entry"]),
    "crlf_line": (encode_entry(make_batch()).replace(b"\n", b"\r\n"), ["garbled entry"]),
}


@pytest.mark.parametrize("name", list(FILES))
def test_odd_files_never_raise(tmp_path: Path, name: str) -> None:
    content, reasons = FILES[name]
    path = tmp_path / "spool.jsonl"
    path.write_bytes(content)
    got = read_all(path)
    found = [b.reason for b in bad_of(got)]
    assert [r for b in found for r in reasons if r in b] == reasons, found
    assert len(bad_of(got)) == len(reasons)
    if name == "a_future_version":
        assert batches_of(got) == [make_batch()]


# -- the file API --------------------------------------------------------------------------------


def test_done_removes_a_file_with_bad_entries_and_pending_and_size(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    assert not spool.pending() and spool.size_bytes() == 0
    spool.append([make_batch("resp_1")])
    with path.open("ab") as fh:
        fh.write(b"garbage\n")
    assert spool.pending() and spool.size_bytes() == path.stat().st_size
    got = replay(spool)
    assert len(batches_of(got)) == 1 and len(bad_of(got)) == 1
    # The caller keeps the bad record (the sink quarantines it); the file is gone.
    assert not spool.pending() and list(tmp_path.iterdir()) == []


def test_release_keeps_the_file_for_the_next_replay(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([make_batch("resp_1")])
    (file,) = spool.take()
    assert file.claimed and file.size_bytes() > 0
    spool.release(file)
    spool.release(file)  # idempotent
    assert not file.claimed
    with pytest.raises(ValueError, match="not claimed"):
        spool.done(file)
    with pytest.raises(ValueError, match="no longer claimed"):
        list(file.entries())
    assert spool.pending()
    spool.append([make_batch("resp_2")])
    assert [b.response_id for b in batches_of(replay(spool))] == ["resp_1", "resp_2"]
    assert not spool.pending()


def test_stopping_early_releases_the_file_being_replayed(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([make_batch("resp_1")])
    held: list[SpoolFile] = []

    def outage() -> None:
        for file in spool.take():
            held.append(file)  # the caller still holds it: only take() can release it
            next(iter(file.entries()))
            raise ConnectionError("the database went away again")

    with pytest.raises(ConnectionError):
        outage()
    assert not held[0].claimed
    assert [b.response_id for b in batches_of(replay(spool))] == ["resp_1"]


def test_older_batches_and_bad_lines_still_work(tmp_path: Path) -> None:
    # SpoolFile.batches / bad_lines: the whole file at once, for callers written before records().
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    spool.append([make_batch("resp_1"), make_batch("resp_2")])
    with path.open("ab") as fh:
        fh.write(b"garbage")
    (file,) = spool.take()
    assert [b.response_id for b in file.batches] == ["resp_1", "resp_2"]
    assert file.bad_lines == 1
    spool.done(file)
    # Such a caller hands out no bad records: the file is kept for a person, never replayed.
    (kept,) = tmp_path.iterdir()
    assert ".corrupt-" in kept.name and not spool.pending()


# -- bounded memory ------------------------------------------------------------------------------


def _write_big_spool(path: Path, size: int) -> int:
    one = encode_entry(make_batch("resp_big", n_events=200, payload_pad=200))
    count = size // len(one) + 1
    with path.open("wb") as fh:
        for _ in range(count):
            fh.write(one)
    return count


def _peak_while(iterator: Iterator[Batch | BadEntry]) -> tuple[int, int, int]:
    gc.collect()
    tracemalloc.start()
    try:
        good = bad = 0
        for record in iterator:
            if isinstance(record, Batch):
                good += 1
            else:
                bad += 1
            del record
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return good, bad, peak


def test_streaming_a_large_spool_takes_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    count = _write_big_spool(path, 50 << 20)
    size = path.stat().st_size
    assert size >= 50 << 20
    spool = Spool(path)
    (file,) = spool.take()
    good, bad, peak = _peak_while(file.entries())
    spool.done(file)
    assert (good, bad) == (count, 0)
    assert peak < size // 20, f"peak {peak} bytes while streaming {size}"


def test_a_huge_line_that_is_no_entry_is_not_held_whole(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    with path.open("wb") as fh:
        fh.write(encode_entry(make_batch("resp_1")))
        for _ in range(40):
            fh.write(b"\x01" * (1 << 20))  # 40 MiB of garbage, no newline
        fh.write(b"\n" + encode_entry(make_batch("resp_2")))
    spool = Spool(path)
    (file,) = spool.take()
    got = list(file.entries())
    assert batches_of(got) == [make_batch("resp_1"), make_batch("resp_2")]
    (bad,) = bad_of(got)
    assert len(bad.raw) == 1 << 20 and "a line of 41943040 bytes: its first 1048576 kept" in bad.reason
    _, _, peak = _peak_while(file.entries())
    spool.done(file)
    assert peak < 8 << 20, f"peak {peak} bytes"


def test_appends_are_one_write_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = os.write

    def counted(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", counted)
    spool = Spool(tmp_path / "spool.jsonl", fsync=True)
    assert spool.append([make_batch("resp_1"), make_batch("resp_2", text="\udcff")]) == 2
    assert spool.append([]) == 0
    assert len(writes) == 1
    assert (tmp_path / "spool.jsonl").stat().st_mode & 0o777 == 0o600


def test_a_file_that_cannot_be_opened_does_not_stop_the_others(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    (tmp_path / "spool.jsonl.replaying-0-unreadable").mkdir()  # cannot be opened as a file
    spool.append([make_batch("resp_1")])
    assert [b.response_id for b in batches_of(replay(spool))] == ["resp_1"]
    assert spool.pending()  # still there, for a person to look at


def test_a_batch_whose_events_are_not_serialised_yet_refuses_to_become_json(tmp_path: Path) -> None:
    """A batch is plain data: it cannot serialise its events itself (issue 12 removed its pointer
    to the recorder), so writing it before they are would lose them; it says so instead."""
    from eventguard.lifecycle import Lifecycle, ResponseInfo
    from eventguard.sink import SqlSink
    from eventguard.sink.recorder import SqlRecorder

    sink = SqlSink(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}", spool_path=tmp_path / "spool.jsonl")
    rec = SqlRecorder(sink.writer, Lifecycle(info=ResponseInfo(response_id="resp_raw")))
    rec.event(0, "response.created", {"type": "response.created"})
    batch = rec.collect()
    assert batch is not None and not batch.serialised()
    with pytest.raises(ValueError, match="not serialised yet"):
        batch.to_json()
    rec.encode_some(batch)
    assert Batch.from_json(batch.to_json()) == batch
