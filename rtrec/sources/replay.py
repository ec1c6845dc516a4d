"""Turning an interaction log (CSV or Parquet) into InteractionEvents in event-time order.

Parsing is pure: `read_log` returns the events and the rejected rows (line number, reason); the
CLI produces the events and dead-letters the rejects. Nothing is dropped silently. A file that
cannot be replayed at all (unreadable, no data rows, a mapped column missing) raises `ReplayError`
before anything is produced. CSV may start with a UTF-8 BOM and end lines with CRLF; Parquet ids
must be strings or integers (an integral float such as 7.0 counts as 7).

>>> mapping = ColumnMapping(user="u", item="i", time="t", type="k")
>>> parse_row({"u": "7", "i": "9", "t": "1700000000000", "k": "clicks"}, mapping, 2, "log")[0]["event_type"]
'click'
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.log_range import parse_time_ms
from schemas.dead_letter import Reject

Event = dict[str, Any]

EVENT_TYPES = {"impression", "click", "like", "cart", "order", "share"}
TYPE_ALIASES = {"clicks": "click", "carts": "cart", "orders": "order", "likes": "like", "views": "impression",
                "view": "impression", "impressions": "impression", "shares": "share"}
# Event times outside this range cannot be an event time at all (1970 .. 2100): a malformed row. The
# range the pipeline accepts is narrower and a setting (flink.min_event_time_ms, ...): `check_time_range`.
MIN_TIME_MS, MAX_TIME_MS = 0, 4_102_444_800_000


class ReplayError(ValueError):
    """A log that cannot be replayed at all; the message names the file and what to change."""


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns hold what. `user` may join several columns with '+' (hashed user features).

    `click` names a 0/1 column for logs where each row is an impression (Open Bandit Dataset): the
    row becomes an impression plus, when the flag is 1, a click 1 ms later.
    """

    user: str = "user_id"
    item: str = "item_id"
    time: str = "timestamp"
    type: str | None = "event_type"
    default_type: str = "impression"
    dwell: str | None = None
    position: str | None = None
    session: str | None = None
    event_id: str | None = None
    click: str | None = None
    type_map: Mapping[str, str] = field(default_factory=dict)

    def required(self) -> dict[str, str]:
        """Column -> the `produce replay` option that names it, for every column the rows must have
        (the type column may be absent: every row then has `default_type`)."""
        wanted = {c: "--user-col" for c in self.user.split("+")}
        wanted[self.item] = "--item-col"
        wanted[self.time] = "--time-col"
        optional = {"--click-col": self.click, "--dwell-col": self.dwell, "--position-col": self.position,
                    "--session-col": self.session, "--event-id-col": self.event_id}
        wanted.update({column: option for option, column in optional.items() if column is not None})
        return wanted

    def id_columns(self) -> set[str]:
        return {*self.user.split("+"), self.item, *(c for c in (self.session, self.event_id) if c)}


@dataclass
class RejectedRow:
    line: int
    reason: str
    raw: str
    source: str = ""  # which file, when several are replayed together

    def as_reject(self) -> Reject:
        return Reject(f"{self.source}:{self.line}: {self.reason}", value=self.raw.encode())


def _required(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None or str(value).strip() == "":
        raise ValueError(f"missing {column}")
    return str(value).strip()


def _optional_int(row: Mapping[str, Any], column: str | None) -> int | None:
    if column is None:
        return None
    value = row.get(column)
    if value is None or str(value).strip() == "":
        return None
    number = float(value)
    if number != number:
        return None
    return int(number)


def parse_row(row: Mapping[str, Any], m: ColumnMapping, line: int, source: str) -> list[Event]:
    """One log row as one or two events; raises ValueError with the reason when malformed."""
    user = "+".join(_required(row, c) for c in m.user.split("+"))
    item = _required(row, m.item)
    t_ms = parse_time_ms(_required(row, m.time))
    if not MIN_TIME_MS <= t_ms <= MAX_TIME_MS:
        raise ValueError(f"timestamp {row.get(m.time)!r} is out of range")
    raw_type = str(row.get(m.type) or "").strip().lower() if m.type and m.type in row else ""
    etype = (m.type_map.get(raw_type) or TYPE_ALIASES.get(raw_type, raw_type)) if raw_type else m.default_type
    if etype not in EVENT_TYPES:
        raise ValueError(f"unknown event type {raw_type!r}")
    event_id = str(row[m.event_id]).strip() if m.event_id and row.get(m.event_id) else f"{source}:{line}"
    session = str(row[m.session]).strip() if m.session and row.get(m.session) not in (None, "") else None
    base = {"user_id": user, "item_id": item, "event_time": t_ms, "dwell_ms": _optional_int(row, m.dwell),
            "position": _optional_int(row, m.position), "session_id": session}
    events = [{"event_id": event_id, "event_type": etype, **base}]
    if m.click is not None:
        flag = _optional_int(row, m.click)
        if flag not in (0, 1):
            raise ValueError(f"click flag {row.get(m.click)!r} is not 0 or 1")
        if flag == 1:
            events.append({**base, "event_id": f"{event_id}:click", "event_type": "click", "event_time": t_ms + 1,
                           "dwell_ms": None})
    return events


def _id_text(value: Any, column: str) -> str:
    """A typed (Parquet) id as text; ValueError for values that are no id.

    >>> _id_text(7.0, "u"), _id_text(12, "u"), _id_text("a", "u")
    ('7', '12', 'a')
    >>> _id_text(1.5, "u")
    Traceback (most recent call last):
    ValueError: u 1.5 is not an id: ids are strings or integers
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    raise ValueError(f"{column} {value!r} is not an id: ids are strings or integers")


def _parquet_rows(path: Path, id_columns: set[str]) -> tuple[list[str], Iterator[tuple[int, Mapping[str, Any], str]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ReplayError(f"{path} is not a readable Parquet file: {exc}") from exc

    def rows() -> Iterator[tuple[int, Mapping[str, Any], str]]:
        for i, row in enumerate(table.to_pylist(), start=1):
            try:
                cells = {k: _id_text(v, k) if k in id_columns else ("" if v is None else str(v))
                         for k, v in row.items()}
            except ValueError as exc:
                cells = {"__error__": str(exc)}
            yield i, cells, str(row)

    return table.column_names, rows()


def _csv_rows(path: Path) -> tuple[list[str], Iterator[tuple[int, Mapping[str, Any], str]]]:
    # utf-8-sig: a BOM written by spreadsheet tools would otherwise become part of the first column's name
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        header = [name.strip() for name in next(csv.reader(fh), [])]

    def rows() -> Iterator[tuple[int, Mapping[str, Any], str]]:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
            lines = csv.reader(fh)
            next(lines, None)
            for values in lines:
                raw = ",".join(values)
                if len(values) != len(header):
                    yield lines.line_num, {"__error__": f"expected {len(header)} columns, found {len(values)}"}, raw
                    continue
                yield lines.line_num, dict(zip(header, values, strict=True)), raw

    return header, rows()


def _rows(path: Path, mapping: ColumnMapping) -> tuple[list[str], Iterator[tuple[int, Mapping[str, Any], str]]]:
    """The header and (line number, row, raw text) per data row; CSV line numbers count the header as line 1."""
    if path.suffix.lower() in (".parquet", ".pq"):
        return _parquet_rows(path, mapping.id_columns())
    return _csv_rows(path)


def read_log(path: Path, mapping: ColumnMapping, source: str | None = None,
             item_prefix: str = "") -> tuple[list[Event], list[RejectedRow], int]:
    """Events sorted by event time (stable), the rejected rows, and the number of rows read.
    `source` names the file in default event ids (its name); `item_prefix` is put before item ids."""
    if not path.is_file():
        raise FileNotFoundError(f"log file {path} does not exist")
    source = source or path.name
    events: list[Event] = []
    rejected: list[RejectedRow] = []
    n_rows = 0
    header, rows = _rows(path, mapping)
    if not header:
        raise ReplayError(f"{path}: the file is empty (no header, no data rows); nothing was produced")
    missing = {column: option for column, option in mapping.required().items() if column not in header}
    if missing:
        named = ", ".join(f"{c!r} ({o})" for c, o in missing.items())
        raise ReplayError(f"{path}: no column {named}; its columns are {header}. Name the right ones with those "
                          "options; nothing was produced")
    for line, row, raw in rows:
        n_rows += 1
        if "__error__" in row:
            rejected.append(RejectedRow(line, str(row["__error__"]), raw, source))
            continue
        try:
            events.extend(parse_row(row, mapping, line, source))
        except (ValueError, KeyError, OverflowError) as exc:
            rejected.append(RejectedRow(line, str(exc) or type(exc).__name__, raw, source))
    if n_rows == 0:
        raise ReplayError(f"{path}: no data rows (the file is empty or holds a header only); nothing was produced")
    if item_prefix:
        for e in events:
            e["item_id"] = item_prefix + e["item_id"]
    events.sort(key=lambda e: e["event_time"])
    return events, rejected, n_rows


def check_time_range(events: Sequence[Event], min_ms: int, max_ms: int, settings_hint: str) -> None:
    """ReplayError naming the rows whose event time the pipeline would refuse, before any is produced.

    >>> check_time_range([{"event_id": "log.csv:2", "event_time": 5}], 10, 20, "SOME_SETTING")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    rtrec.sources.replay.ReplayError: 1 events fall outside the accepted event-time range [...]: log.csv:2 at ...
    """
    outside = [e for e in events if not min_ms <= e["event_time"] <= max_ms]
    if not outside:
        return
    shown = ", ".join(f"{e['event_id']} at {_iso(e['event_time'])}" for e in outside[:5])
    more = f" and {len(outside) - 5} more" if len(outside) > 5 else ""
    raise ReplayError(f"{len(outside)} events fall outside the accepted event-time range [{_iso(min_ms)}, "
                      f"{_iso(max_ms)}]: {shown}{more}. Nothing was produced; to replay them, change {settings_hint}")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_logs(paths: Sequence[Path], mapping: ColumnMapping,
              items_by_file: bool = False) -> tuple[list[Event], list[RejectedRow], int]:
    """Several logs merged into one event-time order (replaying them one after another would make
    the second file's events late). Each file is named by the shortest tail of its path that tells
    it apart from the others, so default event ids stay unique. `items_by_file` puts the file's stem
    before its item ids, for logs whose item ids are only unique within a file (an Open Bandit
    campaign per file: `men.csv`, `women.csv`, `all.csv`).

    >>> sources([Path("random/all/all.csv"), Path("bts/all/all.csv"), Path("random/men/men.csv")])
    ['random/all/all.csv', 'bts/all/all.csv', 'men.csv']
    """
    events: list[Event] = []
    rejected: list[RejectedRow] = []
    n_rows = 0
    for path, source in zip(paths, sources(paths), strict=True):
        got, bad, n = read_log(path, mapping, source, f"{path.stem}:" if items_by_file else "")
        events += got
        rejected += bad
        n_rows += n
    events.sort(key=lambda e: e["event_time"])
    return events, rejected, n_rows


def sources(paths: Sequence[Path]) -> list[str]:
    labels = []
    for path in paths:
        parts = path.parts
        depth = 1
        while depth < len(parts) and sum(other.parts[-depth:] == parts[-depth:] for other in paths) > 1:
            depth += 1
        labels.append("/".join(parts[-depth:]))
    return labels
