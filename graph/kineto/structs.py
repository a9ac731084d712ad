"""The parts of a Kineto trace that are decoded, as msgspec structs (every other key is skipped in C)."""

from __future__ import annotations

from typing import Any

import msgspec



_Num = int | float | str | None  # as written, strings tolerated ("stream": "0x0" on ROCm)
_Text = str | int | float | None


class Args(msgspec.Struct, frozen=True, gc=False):
    external_id: _Num = msgspec.field(name="External id", default=-1)
    old_external_id: _Num = msgspec.field(name="external id", default=-1)  # 2021 schema
    correlation: _Num = -1
    stream: _Num = -1
    device: _Num = -1
    coll_name: _Text = msgspec.field(name="Collective name", default=None)
    in_nelems: _Num = msgspec.field(name="In msg nelems", default=-1)
    out_nelems: _Num = msgspec.field(name="Out msg nelems", default=-1)
    group_size: _Num = msgspec.field(name="Group size", default=-1)
    dtype: _Text = None
    pg_name: _Text = msgspec.field(name="Process Group Name", default=None)
    pg_id: _Num = msgspec.field(name="Process Group ID", default=-1)  # older name of pg_name
    pg_desc: _Text = msgspec.field(name="Process Group Description", default=None)
    seq: _Num = msgspec.field(name="Seq", default=-1)
    seq_lower: _Num = msgspec.field(name="seq", default=-1)


NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: _Text = ""
    name: _Text = ""
    pid: _Num = -1
    tid: _Num = -1
    ts: int | float = 0
    dur: int | float = 0
    id: _Num = -1
    args: Args = NO_ARGS


class Header(msgspec.Struct):
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: int | float | None = None
    deviceProperties: Any = None
    distributedInfo: Any = None


class File(Header):
    traceEvents: list[Event] | None = None
    nodes: msgspec.Raw = msgspec.Raw()  # PyTorch execution traces (Chakra) have nodes instead


class ExactEvent(Event, gc=False):
    """An event whose ``ts`` is kept as written, for traces whose floats would lose nanoseconds."""

    ts: msgspec.Raw = msgspec.Raw(b"0")


class ExactFile(File):
    traceEvents: list[ExactEvent] | None = None


EVENTS_DECODER = {False: msgspec.json.Decoder(list[Event]), True: msgspec.json.Decoder(list[ExactEvent])}
FILE_DECODER = {False: msgspec.json.Decoder(File), True: msgspec.json.Decoder(ExactFile)}
FLOATS_DECODER = msgspec.json.Decoder(list[float])
