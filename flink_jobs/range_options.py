"""A `LogRange` as options of Flink's Kafka connector, for bounded runs (backfill, evaluate, benchmarks).

At the end of bounded input Flink fires every remaining window, and the features reach Redis through
the newest-window-wins writer, so a backfill never overwrites newer live values.

>>> from core.log_range import LogRange
>>> connector_options(LogRange.parse("2023-11-14T22:13:20Z", "0:10,1:20"))["scan.startup.timestamp-millis"]
'1700000000000'
>>> sorted(connector_options(LogRange.parse("0:5", None)).items())  # doctest: +NORMALIZE_WHITESPACE
[('scan.bounded.mode', 'latest-offset'), ('scan.startup.mode', 'specific-offsets'),
 ('scan.startup.specific-offsets', 'partition:0,offset:5')]
"""

from __future__ import annotations

from core.log_range import AtOffsets, AtTime, Earliest, Latest, LogRange, Position


def _position(position: Position, kind: str) -> dict[str, str]:
    match position:
        case Earliest():
            return {f"scan.{kind}.mode": "earliest-offset"}
        case Latest():
            return {f"scan.{kind}.mode": "latest-offset"}
        case AtTime(epoch_ms=ms):
            return {f"scan.{kind}.mode": "timestamp", f"scan.{kind}.timestamp-millis": str(ms)}
        case AtOffsets(offsets=offsets):
            spec = ";".join(f"partition:{p},offset:{o}" for p, o in offsets)
            return {f"scan.{kind}.mode": "specific-offsets", f"scan.{kind}.specific-offsets": spec}
    raise TypeError(f"not a log position: {position!r}")


def connector_options(log_range: LogRange) -> dict[str, str]:
    """Kafka connector options that read exactly [start, end) and then end the job."""
    if isinstance(log_range.end, Earliest):
        raise ValueError("a range cannot end at the earliest offset")
    return {**_position(log_range.start, "startup"), **_position(log_range.end, "bounded")}
