"""Avro encode/decode for Kafka values, with the schema identity in a record header.

Wire format: the plain Avro binary body (no magic byte), which Flink's SQL `avro` format reads,
plus a Kafka header `rtrec-schema: <Name>:<crc64 fingerprint hex>`. A reader that meets an
unknown fingerprint or a different record name gets `UnknownSchemaError`; one written with an
older known version of the same schema is resolved to the current one (Avro schema evolution).

>>> enc = serializer("InteractionEvent")
>>> raw = enc({"event_id": "e1", "user_id": "u1", "item_id": "i1", "event_type": "click",
...            "event_time": 1700000000000})
>>> dec = deserializer("InteractionEvent")
>>> dec(raw, enc.header_value)["event_time"]
1700000000000
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from schemas.registry import AvroSchema, by_fingerprint, schema

SCHEMA_HEADER = "rtrec-schema"

Record = dict[str, Any]
Headers = Sequence[tuple[str, bytes | None]] | None


class SerdeError(ValueError):
    """A value that cannot be encoded or decoded; `reason` is short and goes to dead letters."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownSchemaError(SerdeError):
    """The record's schema header names a schema this reader does not know."""


def header_of(headers: Headers) -> bytes | None:
    """The schema header's value among Kafka message headers, or None."""
    for key, value in headers or ():
        if key == SCHEMA_HEADER:
            return value
    return None


def header_values(headers: Sequence[Headers], expected: bytes) -> list[bytes | None]:
    """`header_of` of many messages' headers; those that are exactly the schema header with the
    `expected` value (what this project's producers write) are recognised by one comparison.

    >>> header_values([[(SCHEMA_HEADER, b"A")], [("other", b"x"), (SCHEMA_HEADER, b"B")], None], b"A")
    [b'A', b'B', None]
    """
    usual = [(SCHEMA_HEADER, expected)]
    return [expected if h == usual else header_of(h) for h in headers]


class Serializer:
    """Encodes records of one schema; `header_value` goes into the Kafka header."""

    def __init__(self, avro: AvroSchema) -> None:
        self.schema = avro
        self.header_value = avro.header_value
        self.headers = [(SCHEMA_HEADER, avro.header_value)]

    def __call__(self, record: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        try:
            schemaless_writer(buf, self.schema.parsed, record)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SerdeError(f"cannot encode {self.schema.name}: {exc}") from exc
        return buf.getvalue()

    def encode_many(self, records: Iterable[Mapping[str, Any]]) -> list[bytes]:
        return [self(r) for r in records]


class Deserializer:
    """Decodes values of one schema (current or any known older version of it)."""

    def __init__(self, avro: AvroSchema) -> None:
        self.schema = avro
        self._writers = {fp: s for fp, s in by_fingerprint().items() if s.name == avro.name}

    def writer_for(self, header: bytes | None) -> AvroSchema:
        if header is None:
            raise UnknownSchemaError(f"missing {SCHEMA_HEADER} header")
        name, _, fp = header.decode("utf-8", "replace").partition(":")
        if name != self.schema.name:
            raise UnknownSchemaError(f"expected schema {self.schema.name}, record says {name or '?'}")
        try:
            return self._writers[fp]
        except KeyError:
            raise UnknownSchemaError(f"unknown {name} schema fingerprint {fp}") from None

    def __call__(self, value: bytes | None, header: bytes | None) -> Record:
        writer = self.writer_for(header)
        if value is None:
            raise SerdeError("empty value (tombstone)")
        buf = io.BytesIO(value)
        try:
            if writer is self.schema:
                record = schemaless_reader(buf, writer.parsed, None)
            else:
                record = schemaless_reader(buf, writer.parsed, self.schema.parsed)
        except Exception as exc:  # fastavro raises many types on garbage bytes
            raise SerdeError(f"undecodable {self.schema.name}: {type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(value):
            raise SerdeError(f"undecodable {self.schema.name}: {len(value) - buf.tell()} trailing bytes")
        return record  # type: ignore[return-value]

    def decode_many(
        self, values: Sequence[bytes | None], headers: Sequence[bytes | None]
    ) -> tuple[list[Record], list[tuple[int, str]]]:
        """Decodes a batch; bad values come back as (index, reason) instead of raising."""
        oks: list[Record] = []
        errs: list[tuple[int, str]] = []
        for i, (value, header) in enumerate(zip(values, headers, strict=True)):
            try:
                oks.append(self(value, header))
            except SerdeError as exc:
                errs.append((i, exc.reason))
        return oks, errs


def serializer(name: str) -> Serializer:
    return Serializer(schema(name))


def deserializer(name: str) -> Deserializer:
    return Deserializer(schema(name))
