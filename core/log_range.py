"""Positions in a partitioned event log and ranges between them, typed once and parsed in one place.

A position is the earliest or latest offset, a time (epoch ms, matched against the Kafka record
timestamps, which our producers set to the event time) or offsets per partition. The Flink job turns
a range into connector options; the backfill resolves it to offsets; neither parses the other's text.

>>> LogRange.parse("2023-11-14T22:13:20Z", "0:10,1:20")
LogRange(start=AtTime(epoch_ms=1700000000000), end=AtOffsets(offsets=((0, 10), (1, 20))))
>>> LogRange.parse(None, None)
LogRange(start=Earliest(), end=Latest())
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Earliest:
    pass


@dataclass(frozen=True)
class Latest:
    pass


@dataclass(frozen=True)
class AtTime:
    epoch_ms: int


@dataclass(frozen=True)
class AtOffsets:
    offsets: tuple[tuple[int, int], ...]  # (partition, offset), sorted by partition

    def as_dict(self) -> dict[int, int]:
        return dict(self.offsets)


Position = Earliest | Latest | AtTime | AtOffsets

_OFFSETS = re.compile(r"^\d+:\d+(,\d+:\d+)*$")


def parse_position(text: str) -> AtTime | AtOffsets:
    """A time (ISO-8601 with zone, epoch s/ms/us) or offsets `0:120,1:98`.

    >>> parse_position("0:5,1:7")
    AtOffsets(offsets=((0, 5), (1, 7)))
    >>> parse_position("yesterday")
    Traceback (most recent call last):
    ValueError: 'yesterday' is neither a time (ISO-8601 with zone, epoch ms) nor offsets like 0:120,1:98
    """
    value = text.strip()
    if _OFFSETS.match(value):
        pairs = sorted((int(p), int(o)) for p, o in (pair.split(":") for pair in value.split(",")))
        return AtOffsets(tuple(pairs))
    try:
        return AtTime(parse_time_ms(value))
    except ValueError as exc:
        raise ValueError(f"{value!r} is neither a time (ISO-8601 with zone, epoch ms) nor offsets like 0:120,1:98")\
            from exc


@dataclass(frozen=True)
class LogRange:
    """[start, end): from the beginning and up to the latest offsets (at the time of reading) by default."""

    start: Position = Earliest()
    end: Position = Latest()

    @classmethod
    def parse(cls, start: str | None, end: str | None) -> LogRange:
        return cls(parse_position(start) if start else Earliest(), parse_position(end) if end else Latest())


def parse_time_ms(value: str) -> int:
    """Epoch seconds, milliseconds or microseconds (by magnitude), or an ISO-8601 timestamp.

    >>> parse_time_ms("2019-11-24 00:00:34.762830+00:00")
    1574553634762
    >>> parse_time_ms("1659304800")
    1659304800000
    """
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise ValueError(f"timestamp {text!r} has no time zone") from None
        return int(parsed.timestamp() * 1000)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"timestamp {text!r} is not a number")
    if abs(number) >= 1e14:
        return int(number // 1000)  # microseconds
    if abs(number) >= 1e11:
        return int(number)  # milliseconds
    return int(number * 1000)  # seconds
