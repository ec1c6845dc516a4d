"""Loads the `.avsc` files once: current versions from `avro/`, frozen earlier ones from `history/`.

Logical types are stripped from the parsed schemas on purpose: timestamps travel as epoch
milliseconds (`int`) in Python, which keeps decoding free of per-record datetime objects. The
bytes on the wire are the same either way, so Flink's `avro` format still reads them as
TIMESTAMP(3).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

SCHEMA_DIR = Path(__file__).parent / "avro"
HISTORY_DIR = Path(__file__).parent / "history"


@dataclass(frozen=True)
class AvroSchema:
    """One version of one record schema."""

    name: str
    version: str  # "current" or "v1", "v2", ... for frozen history
    raw: dict[str, Any]  # as written in the .avsc
    parsed: dict[str, Any]  # fastavro-parsed, logical types stripped
    fingerprint: str  # CRC-64-AVRO of the Parsing Canonical Form, hex

    @property
    def header_value(self) -> bytes:
        """The value of the schema header carried by every Kafka record of this schema."""
        return f"{self.name}:{self.fingerprint}".encode()


def _strip_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical_types(v) for v in node]
    return node


def _load(path: Path, version: str) -> AvroSchema:
    raw = json.loads(path.read_text())
    canonical = to_parsing_canonical_form(parse_schema(copy.deepcopy(raw)))
    return AvroSchema(
        name=raw["name"],
        version=version,
        raw=raw,
        parsed=parse_schema(_strip_logical_types(copy.deepcopy(raw))),
        fingerprint=fingerprint(canonical, "CRC-64-AVRO"),
    )


@cache
def current_schemas() -> dict[str, AvroSchema]:
    """Every current schema by record name."""
    return {p.stem: _load(p, "current") for p in sorted(SCHEMA_DIR.glob("*.avsc"))}


@cache
def history(name: str) -> list[AvroSchema]:
    """Frozen earlier versions of one schema, oldest first."""
    paths = sorted((HISTORY_DIR / name).glob("v*.avsc"), key=lambda p: int(p.stem[1:]))
    return [_load(p, p.stem) for p in paths]


@cache
def by_fingerprint() -> dict[str, AvroSchema]:
    """Every known writer schema (current and historical) by fingerprint."""
    known: dict[str, AvroSchema] = {}
    for name, current in current_schemas().items():
        for old in history(name):
            known.setdefault(old.fingerprint, old)
        known[current.fingerprint] = current
    return known


def schema(name: str) -> AvroSchema:
    """The current schema called `name`; KeyError names the ones that exist."""
    try:
        return current_schemas()[name]
    except KeyError:
        raise KeyError(f"no schema {name!r}; known: {sorted(current_schemas())}") from None


def field_names(name: str) -> tuple[str, ...]:
    """The field names of the current schema `name`, in order (derive from the contract, never restate it).

    >>> field_names("DeadLetter")[:2]
    ('stage', 'reason')
    """
    return tuple(f["name"] for f in schema(name).raw["fields"])
