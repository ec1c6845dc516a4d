"""Avro decoding of many values at once, column by column in numpy, for flat record schemas.

Per-record decoding (fastavro, one Python call per record) caps a consumer at tens of thousands of
records per second. Here every record of a batch advances together, one field at a time: the
varints of a field are read for all records in one vectorised pass, and a float array field whose
records all hold `width` items is cut out of the buffer as one matrix. Only strings become Python
objects, one slice each.

Nothing is trusted: a record whose bytes do not parse exactly (a varint too long, a length past its
end, trailing bytes, invalid UTF-8, an array of another width or in several blocks), or whose header
names another schema or version, is decoded again by the per-record `Deserializer`, which either
returns it (an older version, a ragged array) or gives the reason it is rejected. So the result, good
rows and reasons, is the same as decoding each record alone.

>>> from schemas.serde import serializer
>>> enc = serializer("TrainingSample")
>>> rows = [{"sample_id": f"s{i}", "user_id": "u", "item_id": "i", "event_time": 5, "label": i % 2,
...          "features": [1.5, float(i)], "feature_set": "v1", "position": None} for i in range(3)]
>>> got = BulkDecoder("TrainingSample").decode([enc(r) for r in rows] + [b"\\xff"], [enc.header_value] * 4,
...                                            widths={"features": 2})
>>> got.columns["sample_id"].tolist(), got.columns["features"][:, 1].tolist(), got.rejected[0][0]
(['s0', 's1', 's2'], [0.0, 1.0, 2.0], 3)
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas.registry import schema
from schemas.serde import Deserializer, SerdeError

if TYPE_CHECKING:
    from schemas.utf8_column import Utf8Column  # a block's ids (schemas.sample_blocks); imports this module

_MAX_VARINT = 10  # bytes of a 64-bit varint
_STEPS = np.arange(_MAX_VARINT, dtype=np.int64)
_SHIFTS = (7 * _STEPS).astype(np.uint64)
_NUMERIC = {"int": np.int64, "long": np.int64, "boolean": np.bool_, "float": np.float32, "double": np.float64}
_FIXED_WIDTH = {"float": (4, "<f4"), "double": (8, "<f8")}
_MAX_BULK_ITEMS = 256  # a longer string or integer array is read one by one


@dataclass
class BulkDecoded:
    """The decoded rows as columns, in input order, rejected rows left out.

    `columns`: strings as object arrays; int and long as int64; a nullable field (`["null", T]`) as
    float64 with NaN for null when T is numeric, as objects with None when T is a string; an array
    field as a float matrix [rows, width] (cut or zero-padded to the width asked for) with each row's
    own item count in `lengths[name]`; an array of strings or integers (any count per row) as the flat
    items of all rows in order, each row's count in `lengths[name]`; a nullable one of those (`["null",
    array]`) likewise, a null counting 0 items, and `present[name]` False for it. `rows`: each column row's
    index in the input; `rejected`: (input index, reason) of the rows that could not be decoded. (Ids
    read from TrainingSampleBlocks may be a Utf8Column instead: `AvroConsumer.poll_columns`.)"""

    columns: dict[str, np.ndarray | Utf8Column]
    lengths: dict[str, np.ndarray]
    rows: np.ndarray
    rejected: list[tuple[int, str]]
    present: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)


def _field_kind(avro_type: Any) -> tuple[str, str]:
    """(kind, element type): kind is "string", "numeric", "array", "list", "nullable" or "nullable_list"."""
    if isinstance(avro_type, dict):
        items, base = avro_type.get("items"), avro_type.get("type")
        if base == "array" and isinstance(items, str) and items in _FIXED_WIDTH:
            return "array", items
        if base == "array" and items in ("string", "int", "long"):
            return "list", items
        if isinstance(base, str) and (base in _NUMERIC or base == "string"):  # logical types
            return _field_kind(avro_type["type"])
    elif isinstance(avro_type, list):
        if len(avro_type) == 2 and avro_type[0] == "null":
            inner, element = _field_kind(avro_type[1])
            if inner in ("string", "numeric"):
                return "nullable", element
            if inner == "list":
                return "nullable_list", element
    elif avro_type == "string":
        return "string", "string"
    elif avro_type in _NUMERIC:
        return "numeric", avro_type
    raise TypeError(f"bulk decoding does not support the field type {avro_type!r}")


class BulkDecoder:
    """Decodes batches of one schema's values; construction fails for a schema with a field type it
    cannot read in bulk (records, maps, enums, other unions), so callers know up front."""

    def __init__(self, schema_name: str, keep: Collection[str] | None = None) -> None:
        """`keep`: the fields to return (default: all); the others are still read and checked, so the
        same records are rejected, but cost no Python objects."""
        self.schema = schema(schema_name)
        self.header_value = self.schema.header_value
        self.fields = [(f["name"], *_field_kind(f["type"])) for f in self.schema.raw["fields"]]
        names = [name for name, _, _ in self.fields]
        unknown = set(keep or ()) - set(names)
        if unknown:
            raise ValueError(f"{schema_name} has no field {sorted(unknown)}")
        self.keep = frozenset(names if keep is None else keep)
        self._one_by_one = Deserializer(self.schema)

    def decode(self, values: Sequence[bytes | None], headers: Sequence[bytes | None],
               widths: Mapping[str, int] | None = None) -> BulkDecoded:
        """`headers`: each value's schema header value; `widths`: the matrix width of each array field
        (default: its first fast-decoded row's item count)."""
        n = len(values)
        widths = dict(widths or {})
        if len(headers) != n:
            raise ValueError(f"{n} values and {len(headers)} headers")
        fast = (np.fromiter(map(operator.eq, headers, repeat(self.header_value)), dtype=bool, count=n)
                & np.fromiter(map(operator.is_not, values, repeat(None)), dtype=bool, count=n))
        fast_rows = np.flatnonzero(fast)
        parsed = _parse(self.fields, [values[i] for i in fast_rows], widths, self.keep)  # type: ignore[misc]
        ok_rows = fast_rows[parsed.ok]
        slow_rows = np.setdiff1d(np.arange(n), ok_rows, assume_unique=True)
        records: list[dict[str, Any]] = []
        kept_slow: list[int] = []
        rejected: list[tuple[int, str]] = []
        for i in slow_rows.tolist():
            try:
                records.append(self._one_by_one(values[i], headers[i]))  # type: ignore[arg-type]
                kept_slow.append(i)
            except SerdeError as exc:
                rejected.append((i, exc.reason))
        columns, lengths, present = parsed.take(parsed.ok)
        if records:
            slow_columns, slow_lengths, slow_present = self._from_records(records, widths)
            order = np.argsort(np.concatenate([ok_rows, kept_slow]), kind="stable")
            for k in columns:
                both = np.concatenate([columns[k], slow_columns[k]])
                columns[k] = (take_ragged(both, np.concatenate([lengths[k], slow_lengths[k]]), order)
                              if k in parsed.ragged else both[order])
            lengths = {k: np.concatenate([lengths[k], slow_lengths[k]])[order] for k in lengths}
            present = {k: np.concatenate([present[k], slow_present[k]])[order] for k in present}
            rows = np.sort(np.concatenate([ok_rows, kept_slow]))
        else:
            rows = ok_rows
        return BulkDecoded(columns, lengths, rows.astype(np.int64), rejected, present)

    def _from_records(self, records: list[dict[str, Any]], widths: dict[str, int]
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        columns: dict[str, np.ndarray] = {}
        lengths: dict[str, np.ndarray] = {}
        present: dict[str, np.ndarray] = {}
        for name, kind, element in self.fields:
            if name not in self.keep:
                continue
            got = [r[name] for r in records]
            if kind == "nullable_list":
                present[name] = np.array([v is not None for v in got], dtype=bool)
                got = [v or [] for v in got]
            if kind == "string":
                columns[name] = np.array(got, dtype=object)
            elif kind == "numeric":
                columns[name] = np.array([_as_number(v) for v in got], dtype=_NUMERIC[element])
            elif kind == "nullable":
                columns[name] = (np.array(got, dtype=object) if element == "string" else
                                 np.array([np.nan if v is None else _as_number(v) for v in got], dtype=np.float64))
            elif kind in ("list", "nullable_list"):
                columns[name] = np.array([v for row in got for v in row],
                                         dtype=object if element == "string" else np.int64)
                lengths[name] = np.array([len(row) for row in got], dtype=np.int64)
            else:
                width = widths.setdefault(name, len(got[0]))
                matrix = np.zeros((len(got), width), dtype=_FIXED_WIDTH[element][1])
                for j, row in enumerate(got):
                    kept = min(len(row), width)
                    matrix[j, :kept] = row[:kept]
                columns[name] = matrix
                lengths[name] = np.array([len(row) for row in got], dtype=np.int64)
        return columns, lengths, present


def _as_number(value: Any) -> Any:
    """fastavro gives timestamp-millis as a datetime; the columns hold the millisecond count."""
    if hasattr(value, "timestamp"):
        return round(value.timestamp() * 1000)
    return value


def take_ragged(flat: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The flat items of `rows` (indices or a bool mask) of a ragged column, in that row order.

    >>> take_ragged(np.array([1, 2, 3, 4, 5, 6]), np.array([2, 0, 1, 3]), np.array([3, 0])).tolist()
    [4, 5, 6, 1, 2]
    """
    rows = np.flatnonzero(rows) if rows.dtype == bool else rows
    starts = np.cumsum(lengths) - lengths
    counts = lengths[rows]
    first = np.repeat(starts[rows] - (np.cumsum(counts) - counts), counts)
    return flat[first + np.arange(int(counts.sum()))]


@dataclass
class _Parsed:
    ok: np.ndarray  # bool per record
    columns: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    present: dict[str, np.ndarray]
    ragged: frozenset[str] = frozenset()

    def take(self, mask: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        columns = {k: take_ragged(v, self.lengths[k], mask) if k in self.ragged else v[mask]
                   for k, v in self.columns.items()}
        return columns, {k: v[mask] for k, v in self.lengths.items()}, {k: v[mask] for k, v in self.present.items()}


def _parse(fields: list[tuple[str, str, str]], values: list[bytes], widths: dict[str, int],
           keep: Collection[str]) -> _Parsed:
    """Every record of `values` field by field; `ok` is False for a record that does not parse exactly.
    Only the fields in `keep` get columns."""
    n = len(values)
    sizes = np.fromiter(map(len, values), dtype=np.int64, count=n)
    ends = np.cumsum(sizes)
    pos = ends - sizes
    raw = b"".join(values)
    last = len(raw)
    text = raw.decode("latin-1")
    buf = np.frombuffer(raw + bytes(_MAX_VARINT + 8), dtype=np.uint8)  # reads just past the end are safe
    def gathered(start: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The offsets of the bytes of the spans [start, start + size) (each size ≥ 0, within the
        buffer) end to end, and each span's end among them: a check then costs the spans' bytes, not
        the batch's."""
        span_ends = np.cumsum(size)
        total = int(span_ends[-1]) if len(size) else 0
        return np.repeat(start - (span_ends - size), size) + np.arange(total), span_ends

    def non_ascii(start: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Per span: whether it holds a byte above 0x7F."""
        offsets, span_ends = gathered(start, size)
        before = np.zeros(len(offsets) + 1, dtype=np.int64)
        np.cumsum(buf[offsets] > 0x7F, out=before[1:])
        return before[span_ends] > before[span_ends - size]

    ok = np.ones(n, dtype=bool)
    every = np.ones(n, dtype=bool)
    columns: dict[str, np.ndarray] = {}
    lengths: dict[str, np.ndarray] = {}
    presence: dict[str, np.ndarray] = {}

    def varint(active: np.ndarray = every) -> np.ndarray:
        """The zigzag varint at each active record's position (0 elsewhere), which then moves past it."""
        nonlocal pos
        first = buf[np.minimum(pos, last)]
        if not (first & 0x80).any():  # every one a single byte (lengths, counts, flags): the common case
            pos = pos + active
            unsigned = np.where(active, first, 0).astype(np.uint64)
            return ((unsigned >> np.uint64(1)) ^ (np.uint64(0) - (unsigned & np.uint64(1)))).view(np.int64)
        window = buf[np.minimum(pos, last)[:, None] + _STEPS]
        more = (window & 0x80) != 0
        size = np.where(active, np.argmin(more, axis=1) + 1, 0)
        ok[active & more.all(axis=1)] = False
        digits = (window & 0x7F).astype(np.uint64) << _SHIFTS
        digits[_STEPS[None, :] >= size[:, None]] = 0
        unsigned = np.bitwise_or.reduce(digits, axis=1)
        pos = pos + size
        return ((unsigned >> np.uint64(1)) ^ (np.uint64(0) - (unsigned & np.uint64(1)))).view(np.int64)

    def fixed(size: int, active: np.ndarray = every) -> np.ndarray:
        """`size` bytes at each active record's position, as a [n, size] array (zeros elsewhere)."""
        nonlocal pos
        ok[active & (pos + size > ends)] = False
        start = np.where(active & ok, pos, last)  # `last`: the zero padding
        pos = pos + np.where(active, size, 0)
        return np.take(buf, start[:, None] + np.arange(size), mode="clip")

    def string(active: np.ndarray = every, kept: bool = True) -> np.ndarray:
        """The strings (objects; an empty array when not `kept`: only checked)."""
        nonlocal pos
        size = varint(active)
        bad = active & ((size < 0) | (pos + size > ends))
        ok[bad] = False
        size = np.where(bad | ~active, 0, size)
        start, pos = pos, pos + size
        out = np.empty(n if kept else 0, dtype=object)
        # `text` has a character per byte, so it is cut at the bytes' offsets; that is the string itself
        # where every byte is ASCII, and the few others are decoded as UTF-8 one by one
        if kept:
            filled = np.flatnonzero(size)  # the others are empty (or not there: an array's missing items)
            strings = [text[a:b] for a, b in zip(start[filled].tolist(), pos[filled].tolist(), strict=True)]
            out[:] = ""
            out[filled] = strings
            others = [] if "".join(strings).isascii() else filled[[not v.isascii() for v in strings]].tolist()
        else:
            others = np.flatnonzero(non_ascii(start, size)).tolist()
        for j in others:
            try:
                decoded = raw[start[j]:pos[j]].decode("utf-8")
                if kept:
                    out[j] = decoded
            except UnicodeDecodeError:
                ok[j] = False
                if kept:
                    out[j] = ""
        return out

    def number(element: str, active: np.ndarray = every) -> np.ndarray:
        if element in _FIXED_WIDTH:
            size, dtype = _FIXED_WIDTH[element]
            return fixed(size, active).copy().view(dtype)[:, 0]
        if element == "boolean":
            byte = fixed(1, active)[:, 0]
            ok[active & (byte > 1)] = False
            return byte.astype(bool)
        value = varint(active)
        if element == "int":
            ok[active & ((value < -2**31) | (value >= 2**31))] = False
        return value

    def array(name: str, element: str) -> None:
        count = varint()
        width = widths.setdefault(name, int(count[ok][0]) if ok.any() else 0)
        ok[count != width] = False  # another width, or a block with its byte size: one by one
        size, dtype = _FIXED_WIDTH[element]
        columns[name] = fixed(width * size).copy().view(dtype).reshape(n, width)
        lengths[name] = np.full(n, width, dtype=np.int64)
        if width:
            ok[varint() != 0] = False  # not the end of the array: more blocks, one by one

    def items(name: str, element: str, active: np.ndarray = every) -> None:
        """An array of any count per (active) record, in one block (a negative count, a block with its
        byte size, or more blocks send the record one by one)."""
        count = varint(active)
        ok[count < 0] = False
        count = np.where(ok, count, 0)
        most = int(count.max()) if n else 0
        if most > _MAX_BULK_ITEMS:
            ok[count > _MAX_BULK_ITEMS] = False
            count = np.where(ok, count, 0)
            most = int(count.max())
        kept = name in keep
        if element in ("int", "long"):
            integers(name, element, count, kept)
            return
        got = np.empty((n, most if kept else 0), dtype=object)
        for j in range(most):
            value = string(count > j, kept)
            if kept:
                got[:, j] = value
        ok[varint(count > 0) != 0] = False
        count = np.where(ok, count, 0)
        if kept:
            columns[name] = got[np.arange(most)[None, :] < count[:, None]]
            lengths[name] = count

    def integers(name: str, element: str, count: np.ndarray, kept: bool) -> None:
        """The int or long items of every record's array block of `count` items, in one pass over all
        of them (a loop per item position cost one pass over every record per position): the k-th item
        of a record ends at the k-th byte below 0x80 from the block's start."""
        nonlocal pos
        rows = np.flatnonzero(count)
        per_row = count[rows]
        total = int(per_row.sum())
        within = np.arange(total) - np.repeat(np.cumsum(per_row) - per_row, per_row)  # item index in its record
        row_of = np.repeat(rows, per_row)
        # the bytes below 0x80 from each block's start, as far as its items could reach: the k-th one
        # past that reach would make an item longer than a varint, so the record is rejected either way
        # (`last`, the padding, ends the list: an item found there runs past its record)
        reach = np.minimum(per_row * _MAX_VARINT, ends[rows] - pos[rows]).clip(0)
        offsets, _ = gathered(pos[rows], reach)
        ends_of_varints = np.append(offsets[buf[offsets] < 0x80], last)
        at = np.repeat(np.searchsorted(ends_of_varints, pos[rows]), per_row) + within
        item_end = ends_of_varints[np.minimum(at, len(ends_of_varints) - 1)]  # its last byte
        item_start = np.empty(total, dtype=np.int64)
        item_start[1:] = item_end[:-1] + 1
        item_start[within == 0] = pos[rows]
        size = item_end - item_start + 1
        bad = (at >= len(ends_of_varints)) | (size > _MAX_VARINT) | (item_end >= ends[row_of])
        window = buf[np.minimum(item_start, last)[:, None] + _STEPS]
        digits = (window & 0x7F).astype(np.uint64) << _SHIFTS
        digits[_STEPS[None, :] >= size[:, None]] = 0
        unsigned = np.bitwise_or.reduce(digits, axis=1)
        values = ((unsigned >> np.uint64(1)) ^ (np.uint64(0) - (unsigned & np.uint64(1)))).view(np.int64)
        if element == "int":
            bad |= (values < -2**31) | (values >= 2**31)
        ok[row_of[bad]] = False
        last_item = np.cumsum(per_row) - 1
        pos = pos.copy()
        pos[rows] = np.where(ok[rows], item_end[last_item] + 1, ends[rows])
        ok[varint(count > 0) != 0] = False  # not the end of the array: more blocks, one by one
        count = np.where(ok, count, 0)
        if kept:
            columns[name] = values[ok[row_of]]
            lengths[name] = count

    def not_null() -> np.ndarray:
        """The branch of a `["null", T]` union: True where it holds a T (a branch other than 0 or 1: not ok)."""
        branch = varint()
        ok[(branch != 0) & (branch != 1)] = False
        return branch == 1

    for name, kind, element in fields:
        if kind == "list":
            items(name, element)
        elif kind == "nullable_list":
            presence[name] = not_null()
            items(name, element, presence[name])
        elif kind == "string":
            columns[name] = string(kept=name in keep)
        elif kind == "numeric":
            columns[name] = number(element)
        elif kind == "nullable":
            present = not_null()
            if element == "string":
                strings = string(present)
                strings[~present] = None
                columns[name] = strings
            else:
                columns[name] = np.where(present, number(element, present).astype(np.float64), np.nan)
        else:
            array(name, element)
    ok[pos != ends] = False
    columns = {k: v for k, v in columns.items() if k in keep}
    lengths = {k: v for k, v in lengths.items() if k in keep}
    presence = {k: v for k, v in presence.items() if k in keep}
    return _Parsed(ok, columns, lengths, presence,
                   frozenset(name for name, kind, _ in fields if kind in ("list", "nullable_list")))
