"""DDL and SQL text for the feature job, from pure functions (testable without a JVM).

Column types come from the `.avsc` files, so the Flink `avro` format writes exactly the bytes the
Python serde reads (Avro binary carries no field names: order, types and nullability must match).
Every literal is quoted with `quote`.

>>> quote("it's")
"'it''s'"
>>> avro_to_flink({"type": "long", "logicalType": "timestamp-millis"})
'TIMESTAMP(3) NOT NULL'
>>> avro_to_flink(["null", "string"])
'STRING'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from schemas.registry import history, schema

_PRIMITIVES = {"string": "STRING", "long": "BIGINT", "int": "INT", "double": "DOUBLE", "float": "FLOAT",
               "boolean": "BOOLEAN", "bytes": "BYTES"}


def quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def avro_to_flink(avro_type: Any) -> str:
    nullable = isinstance(avro_type, list)
    if nullable:
        branches = [t for t in avro_type if t != "null"]
        if len(branches) != 1 or avro_type[0] != "null":
            raise ValueError(f"only ['null', T] unions map to Flink columns, not {avro_type}")
        avro_type = branches[0]
    if isinstance(avro_type, dict):
        if avro_type.get("logicalType") == "timestamp-millis":
            base = "TIMESTAMP(3)"
        elif avro_type.get("type") == "array":
            base = f"ARRAY<{avro_to_flink(avro_type['items'])}>"
        else:
            base = _PRIMITIVES[avro_type["type"]]
    else:
        base = _PRIMITIVES[avro_type]
    return base if nullable else f"{base} NOT NULL"


def columns(schema_name: str) -> list[tuple[str, str]]:
    return [(f["name"], avro_to_flink(f["type"])) for f in schema(schema_name).raw["fields"]]


def schema_json(schema_name: str) -> str:
    return json.dumps(schema(schema_name).raw, separators=(",", ":"))


def writer_schemas(schema_name: str) -> str:
    """Every version a record may be written with (frozen history, then current), one per line:
    header value, tab, schema JSON. JSON text never holds a raw newline or tab.

    >>> lines = writer_schemas("InteractionEvent").splitlines()
    >>> lines[-1].startswith("InteractionEvent:") and lines[-1].split(chr(9))[1] == schema_json("InteractionEvent")
    True
    """
    versions = {s.fingerprint: s for s in [*history(schema_name), schema(schema_name)]}
    return "\n".join(f"{s.header_value.decode()}\t{json.dumps(s.raw, separators=(',', ':'))}"
                     for s in versions.values())


def header_literal(schema_name: str) -> str:
    """A SQL expression for the headers map carrying the schema identity."""
    return f"MAP['rtrec-schema', CAST({quote(schema(schema_name).header_value.decode())} AS BYTES)]"


def with_options(options: Mapping[str, str]) -> str:
    return "WITH (\n  " + ",\n  ".join(f"{quote(k)} = {quote(v)}" for k, v in options.items()) + "\n)"


def kafka_options(topic: str, bootstrap: str, client: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The connector's options; `client`: Java client properties (authentication, TLS), each passed on
    as `properties.<name>`."""
    return {"connector": "kafka", "topic": topic, "properties.bootstrap.servers": bootstrap,
            **{f"properties.{k}": v for k, v in (client or {}).items()}, **extra}


def events_source_ddl(name: str, topic: str, bootstrap: str, group_id: str, watermark_delay_ms: int,
                      time_udf: str, decode_args: str, startup: Mapping[str, str],
                      client: Mapping[str, str] | None = None) -> str:
    """Raw bytes + headers + position; the rowtime is computed in the JVM from the Avro value."""
    digits = max(2, len(str(watermark_delay_ms // 1000)))  # Flink's default leading precision stops at 99 s
    options = kafka_options(topic, bootstrap, client, **{"format": "raw", "properties.group.id": group_id,
                                                 "properties.isolation.level": "read_committed", **startup})
    return f"""CREATE TEMPORARY TABLE {name} (
  `value` BYTES,
  `headers` MAP<STRING, BYTES> METADATA,
  `partition` INT METADATA VIRTUAL,
  `offset` BIGINT METADATA VIRTUAL,
  event_time AS TO_TIMESTAMP_LTZ({time_udf}(`value`, `headers`, {decode_args}), 3),
  WATERMARK FOR event_time AS event_time - INTERVAL '{watermark_delay_ms / 1000:.3f}' SECOND({digits})
) {with_options(options)}"""


def bytes_sink_ddl(name: str, topic: str, bootstrap: str, exactly_once: bool, transactional_prefix: str,
                   client: Mapping[str, str] | None = None) -> str:
    """A sink of records already encoded (the feature operators write Avro themselves): key, value
    and headers, written as they are."""
    options = kafka_options(topic, bootstrap, client, **{
        "key.format": "raw", "key.fields": "key", "value.format": "raw", "value.fields-include": "EXCEPT_KEY",
        **delivery(exactly_once, transactional_prefix)})
    return f"""CREATE TEMPORARY TABLE {name} (
  `key` BYTES,
  `value` BYTES,
  `headers` MAP<STRING, BYTES> METADATA
) {with_options(options)}"""


def delivery(exactly_once: bool, transactional_prefix: str) -> dict[str, str]:
    """Exactly-once (transactions committed on checkpoints, under `transactional_prefix`) or at-least-once."""
    if exactly_once:
        return {"sink.delivery-guarantee": "exactly-once", "sink.transactional-id-prefix": transactional_prefix}
    return {"sink.delivery-guarantee": "at-least-once"}


def avro_sink_ddl(name: str, schema_name: str, topic: str, bootstrap: str, exactly_once: bool,
                  transactional_prefix: str, key_field: str | None = None,
                  client: Mapping[str, str] | None = None) -> str:
    cols = ",\n  ".join(f"`{n}` {t}" for n, t in columns(schema_name))
    options = kafka_options(topic, bootstrap, client, **{"value.format": "avro"})
    if key_field:
        options.update({"key.format": "raw", "key.fields": key_field + "_key", "value.fields-include": "EXCEPT_KEY"})
        cols = f"`{key_field}_key` BYTES,\n  " + cols
    options.update(delivery(exactly_once, transactional_prefix))
    return f"""CREATE TEMPORARY TABLE {name} (
  {cols},
  `headers` MAP<STRING, BYTES> METADATA
) {with_options(options)}"""
