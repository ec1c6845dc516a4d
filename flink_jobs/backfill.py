"""Bounded runs of the same job over a historical range of the interactions topic.

A range end is an event-log position: a time (ISO-8601 with zone, or epoch ms, matched against the
Kafka record timestamps, which our producers set to the event time) or per-partition offsets
`0:120,1:98`. The job stops by itself at the end of the range; at the end of bounded input Flink
fires every remaining window, and the features reach Redis through the newest-window-wins writer,
so a backfill never overwrites newer live values.

>>> startup_options("2023-11-14T22:13:20Z", "0:10,1:20")["scan.startup.timestamp-millis"]
'1700000000000'
>>> startup_options("0:5", None)["scan.startup.specific-offsets"]
'partition:0,offset:5'
"""

from __future__ import annotations

import re

from rtrec.sources.replay import parse_time_ms

_OFFSETS = re.compile(r"^\d+:\d+(,\d+:\d+)*$")


def _position(value: str, kind: str) -> dict[str, str]:
    value = value.strip()
    if _OFFSETS.match(value):
        spec = ";".join(f"partition:{p},offset:{o}" for p, o in (pair.split(":") for pair in value.split(",")))
        return {f"scan.{kind}.mode": "specific-offsets", f"scan.{kind}.specific-offsets": spec}
    try:
        millis = parse_time_ms(value)
    except ValueError as exc:
        raise ValueError(f"{value!r} is neither a time (ISO-8601 with zone, epoch ms) nor offsets like 0:120,1:98")\
            from exc
    return {f"scan.{kind}.mode": "timestamp", f"scan.{kind}.timestamp-millis": str(millis)}


def startup_options(from_: str | None, to: str | None) -> dict[str, str]:
    """Kafka connector options for the range [from_, to): from the beginning / up to the latest when absent."""
    options = _position(from_, "startup") if from_ else {"scan.startup.mode": "earliest-offset"}
    options.update(_position(to, "bounded") if to else {"scan.bounded.mode": "latest-offset"})
    return options
