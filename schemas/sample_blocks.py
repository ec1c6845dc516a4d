"""TrainingSamples many to a Kafka message (TrainingSampleBlock), column by column.

One message per sample cost the trainer a Python object per message and a varint walk per field, more
than its training step. A block's columns are little-endian arrays and strings end to end, so a
reader takes each at once (`np.frombuffer`) and makes a Python object only for each id. The feature
job writes blocks when `flink.samples_per_message` > 1; readers of the samples topic take both
kinds (schemas.kafka_io), a block as the samples it holds, in order.

A block is checked whole: counts, lengths and ends that do not fit together, or invalid UTF-8, reject
it with the reason (one dead letter for the message: its samples cannot be told apart).

>>> rows = [{"sample_id": f"s{i}", "user_id": "u", "item_id": "é", "event_time": 5, "label": i % 2,
...          "features": [1.5, float(i)], "feature_set": "v1", "position": None if i else 3,
...          "recent_items": ["a", "b"][:i], "recent_types": ["click", "like"][:i], "recent_ages_ms": [7, 9][:i]}
...         for i in range(3)]
>>> unpack(pack(rows)) == rows
True
>>> got = block_columns(pack(rows), width=2)
>>> got["sample_id"].tolist(), got["features"][:, 1].tolist(), got["recent_items"].tolist()
(['s0', 's1', 's2'], [0.0, 1.0, 2.0], ['a', 'a', 'b'])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from schemas.serde import SerdeError
from schemas.utf8_column import Utf8Column

BLOCK_SCHEMA = "TrainingSampleBlock"
_STRING_COLUMNS = (("sample_id", "sample_ids", "sample_id_ends"), ("user_id", "user_ids", "user_id_ends"),
                   ("item_id", "item_ids", "item_id_ends"))
_RECENT_STRINGS = (("recent_items", "recent_items", "recent_item_ends"),
                   ("recent_types", "recent_types", "recent_type_ends"))


def _strings_bytes(values: Sequence[str]) -> tuple[bytes, bytes]:
    encoded = [v.encode("utf-8") for v in values]
    ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
    if len(ends) and ends[-1] >= 2**31:
        raise ValueError("a block's strings exceed 2 GiB: pack fewer samples per block")
    return b"".join(encoded), ends.astype("<i4").tobytes()


def pack(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The TrainingSampleBlock of `samples` (TrainingSample records of one feature set and width, each
    with as many recent types and ages as recent items), in their order."""
    if not samples:
        raise ValueError("a block holds at least one sample")
    feature_set, width = samples[0]["feature_set"], len(samples[0]["features"])
    for s in samples:
        if s["feature_set"] != feature_set or len(s["features"]) != width:
            raise ValueError(f"sample {s['sample_id']}: a block's samples share one feature set and width "
                             f"({feature_set!r}, {width})")
        items = s.get("recent_items") or []
        if len(s.get("recent_types") or []) != len(items) or len(s.get("recent_ages_ms") or []) != len(items):
            raise ValueError(f"sample {s['sample_id']}: recent types and ages must match its recent items one for one")
    block: dict[str, Any] = {"count": len(samples), "feature_set": feature_set, "width": width}
    for field, values, ends in _STRING_COLUMNS:
        block[values], block[ends] = _strings_bytes([s[field] for s in samples])
    block["event_times"] = np.array([s["event_time"] for s in samples], dtype="<i8").tobytes()
    block["labels"] = np.array([s["label"] for s in samples], dtype=np.int8).tobytes()
    block["features"] = np.array([s["features"] for s in samples], dtype="<f4").reshape(len(samples), width).tobytes()
    block["positions"] = np.array([-1 if s.get("position") is None else s["position"] for s in samples],
                                  dtype="<i4").tobytes()
    block["recent_counts"] = np.array([len(s.get("recent_items") or []) for s in samples], dtype="<i4").tobytes()
    for field, values, ends in _RECENT_STRINGS:
        block[values], block[ends] = _strings_bytes([v for s in samples for v in s.get(field) or []])
    block["recent_ages_ms"] = np.array([v for s in samples for v in s.get("recent_ages_ms") or []],
                                       dtype="<i8").tobytes()
    return block


def _numbers(block: Mapping[str, Any], field: str, dtype: str, count: int) -> np.ndarray:
    raw = block[field]
    size = np.dtype(dtype).itemsize
    if len(raw) != count * size:
        raise SerdeError(f"TrainingSampleBlock: {field} holds {len(raw)} bytes, {count} items take {count * size}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype[1:] if dtype[0] == "<" else dtype)


def _strings(block: Mapping[str, Any], values: str, ends_field: str, count: int, kept: bool = True,
             as_bytes: bool = False) -> np.ndarray | Utf8Column:
    """The strings of a column as an object array (empty when not `kept`: only checked), or `as_bytes`
    (a Utf8Column); a column that does not fit its ends, or is not UTF-8 string by string, is refused."""
    raw, ends = block[values], _numbers(block, ends_field, "<i4", count).astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]])[:count]
    if count and ((ends < starts).any() or starts[0] < 0 or ends[-1] != len(raw)):
        raise SerdeError(f"TrainingSampleBlock: {ends_field} does not cut {values} ({len(raw)} bytes) "
                         f"into {count} strings")
    if not count and raw:
        raise SerdeError(f"TrainingSampleBlock: {values} holds {len(raw)} bytes for no strings")
    if as_bytes:
        column = Utf8Column(np.frombuffer(raw, dtype=np.uint8), ends)
        if not raw.isascii() and (error := column.utf8_error()) is not None:
            raise SerdeError(f"TrainingSampleBlock: {values} is not UTF-8 ({error})")
        return column
    ascii_only = raw.isascii()
    if ascii_only and not kept:
        return np.empty(0, dtype=object)
    try:
        if ascii_only:  # a character per byte: cut at the bytes' offsets
            text = raw.decode("ascii")
            cut = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        else:
            cut = [raw[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    except UnicodeDecodeError as exc:
        raise SerdeError(f"TrainingSampleBlock: {values} is not UTF-8 ({exc.reason})") from None
    out = np.empty(count if kept else 0, dtype=object)
    if kept:
        out[:] = cut
    return out


def block_columns(block: Mapping[str, Any], width: int | None = None,
                  keep: Collection[str] | None = None, as_bytes: Collection[str] = ()) -> dict[str, Any]:
    """The block's samples as TrainingSample columns (schemas.bulk's layout): ids, feature_set and recent
    strings as object arrays, event_time and label as int64, position as float64 (NaN: none), features
    as float32 [count, `width`] (cut or zero-padded; its own width in `feature_len`), the recent lists
    flat with each sample's count in `recent_count`. SerdeError names what does not fit. `keep`: the
    string columns to return (default: all); the others are checked all the same, as schemas.bulk does.
    `as_bytes`: the kept ids (sample_id, user_id, item_id) to return as a Utf8Column each, not as strings."""
    count, own = block["count"], block["width"]
    if count < 0 or own < 0:
        raise SerdeError(f"TrainingSampleBlock: count {count} and width {own} must not be negative")
    out: dict[str, np.ndarray] = {}
    for field, values, ends in _STRING_COLUMNS:
        out[field] = _strings(block, values, ends, count, keep is None or field in keep, field in as_bytes)
    out["event_time"] = _numbers(block, "event_times", "<i8", count)
    out["label"] = _numbers(block, "labels", "i1", count).astype(np.int64)
    features = _numbers(block, "features", "<f4", count * own).reshape(count, own)
    width = own if width is None else width
    if width != own:
        fitted = np.zeros((count, width), dtype=np.float32)
        fitted[:, :min(width, own)] = features[:, :width]
        features = fitted
    out["features"] = features
    out["feature_len"] = np.full(count, own, dtype=np.int64)
    positions = _numbers(block, "positions", "<i4", count)
    out["position"] = np.where(positions < 0, np.nan, positions.astype(np.float64))
    out["feature_set"] = np.full(count, block["feature_set"], dtype=object)
    recent = _numbers(block, "recent_counts", "<i4", count).astype(np.int64)
    if (recent < 0).any():
        raise SerdeError("TrainingSampleBlock: a negative recent_counts")
    total = int(recent.sum())
    out["recent_count"] = recent
    for field, values, ends in _RECENT_STRINGS:
        out[field] = _strings(block, values, ends, total, keep is None or field in keep)
    out["recent_ages_ms"] = _numbers(block, "recent_ages_ms", "<i8", total)
    return out


def unpack(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The block's samples as TrainingSample records, in order."""
    c = block_columns(block)
    bounds = np.concatenate([[0], np.cumsum(c["recent_count"])]).tolist()
    features = c["features"].tolist()
    return [{"sample_id": c["sample_id"][k], "user_id": c["user_id"][k], "item_id": c["item_id"][k],
             "event_time": int(c["event_time"][k]), "label": int(c["label"][k]), "features": features[k],
             "feature_set": block["feature_set"],
             "position": None if np.isnan(c["position"][k]) else int(c["position"][k]),
             "recent_items": c["recent_items"][bounds[k]:bounds[k + 1]].tolist(),
             "recent_types": c["recent_types"][bounds[k]:bounds[k + 1]].tolist(),
             "recent_ages_ms": c["recent_ages_ms"][bounds[k]:bounds[k + 1]].tolist()}
            for k in range(block["count"])]


def samples_in(value: bytes | None) -> int:
    """The sample count a block's value starts with (its first field, a zig-zag varint), read without
    decoding the block; 1 for what does not start with one (it is rejected when decoded).

    >>> from schemas.serde import serializer
    >>> samples_in(serializer(BLOCK_SCHEMA)(pack([{"sample_id": "s", "user_id": "u", "item_id": "i",
    ...     "event_time": 1, "label": 0, "features": [0.5], "feature_set": "v1"}] * 300)))
    300
    """
    n = shift = 0
    for byte in (value or b"")[:5]:
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return max((n >> 1) ^ -(n & 1), 1)
        shift += 7
    return 1
