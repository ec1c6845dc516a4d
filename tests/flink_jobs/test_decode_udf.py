"""The JVM decoder on its own: records written with an older frozen schema version are resolved to
the current one (as the Python readers do); unknown versions are named in the error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer

import flink_jobs.ddl
from core.settings import Settings
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job, decode_args, job_graph
from schemas.registry import AvroSchema, history, schema

pytestmark = pytest.mark.integration

# What InteractionEvent would have been before dwell, position and session arrived (all with defaults).
OLDER = {"type": "record", "name": "InteractionEvent", "namespace": "rtrec", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "user_id", "type": "string"},
    {"name": "item_id", "type": "string"}, {"name": "event_type", "type": "string"},
    {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}


def sql_bytes(data: bytes) -> str:
    return f"CAST(X'{data.hex()}' AS BYTES)"


def test_older_writer_version_is_resolved_and_unknown_is_named(settings: Settings, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "v0.avsc"
    path.write_text(json.dumps(OLDER))
    from schemas.registry import _load

    older: AvroSchema = _load(path, "v0")
    assert older.fingerprint != schema("InteractionEvent").fingerprint
    monkeypatch.setattr(flink_jobs.ddl, "history", lambda name: [older, *history(name)])

    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(json.loads(json.dumps(OLDER))),
                      {"event_id": "e1", "user_id": "u1", "item_id": "i1", "event_type": "click",
                       "event_time": 1_700_000_000_000})
    t_env = table_environment(settings.model_copy(update={"flink": settings.flink.model_copy(
        update={"checkpoint_interval_ms": 0})}))
    t_env.create_java_temporary_system_function("DECODE", "dev.rtrec.flink.DecodeInteractionEvent")
    args = decode_args(settings)
    rows = []
    for header in (older.header_value, b"InteractionEvent:00000000deadbeef"):
        query = (f"SELECT ev.user_id, ev.event_time_ms, ev.dwell_ms, ev.session_id, ev.error FROM (SELECT "
                 f"DECODE({sql_bytes(buf.getvalue())}, MAP['rtrec-schema', {sql_bytes(header)}], {args}) AS ev)")
        with t_env.execute_sql(query).collect() as results:
            rows += [tuple(r) for r in results]
    assert rows[0] == ("u1", 1_700_000_000_000, None, None, None)
    assert rows[1][0] is None and rows[1][4].startswith("unknown schema InteractionEvent:00000000deadbeef (known: ")
    assert older.header_value.decode() in rows[1][4] and schema("InteractionEvent").header_value.decode() in rows[1][4]


def test_the_job_reads_and_decodes_each_record_once(settings: Settings) -> None:
    """One source: the samples are made from the same events as the windows. Its rowtime decodes each
    value for the watermark; the first operator, in the same thread, takes that decode again (the
    thread's last) instead of SQL decoding the record once more, and converting the row to and fro
    (the planner merged a SQL decode into every field it read: thirteen calls per record)."""
    nodes = job_graph(build_job(settings, table_environment(settings)))
    assert [n["pact"] for n in nodes].count("Data Source") == 1
    assert sum(n["contents"].count("RTREC_DECODE_EVENT(") for n in nodes) == 0
    assert sum(n["contents"].count("RTREC_EVENT_TIME(") for n in nodes) == 1
    assert "checked" in [n["contents"] for n in nodes]


def test_a_decode_is_reused_only_for_the_same_bytes_and_header(settings: Settings) -> None:
    """A thread keeps its last decode for the source's rowtime and the job's decode of the same record;
    it must never be handed out for other bytes or another header."""
    def value(user: str) -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, parse_schema(schema("InteractionEvent").raw),
                          {"event_id": f"e-{user}", "user_id": user, "item_id": "i1", "event_type": "click",
                           "event_time": 1_700_000_000_000, "dwell_ms": None, "position": None, "session_id": None})
        return buf.getvalue()

    known, unknown = schema("InteractionEvent").header_value, b"InteractionEvent:00000000deadbeef"
    inputs = [(value("u1"), known), (value("u1"), unknown), (value("u2"), known), (value("u1"), known),
              (value("u1"), known)]
    t_env = table_environment(settings.model_copy(update={"flink": settings.flink.model_copy(
        update={"checkpoint_interval_ms": 0})}))
    t_env.create_java_temporary_system_function("DECODE", "dev.rtrec.flink.DecodeInteractionEvent")
    rows = ", ".join(f"({n}, {sql_bytes(v)}, MAP['rtrec-schema', {sql_bytes(h)}])" for n, (v, h) in enumerate(inputs))
    query = (f"SELECT n, ev.user_id, ev.error FROM (SELECT n, DECODE(v, h, {decode_args(settings)}) AS ev "
             f"FROM (VALUES {rows}) AS t(n, v, h))")
    with t_env.execute_sql(query).collect() as results:
        got = sorted(tuple(r) for r in results)
    assert [(n, user) for n, user, _ in got] == [(0, "u1"), (1, None), (2, "u2"), (3, "u1"), (4, "u1")]
    assert got[1][2].startswith("unknown schema InteractionEvent:00000000deadbeef")
    assert all(error is None for n, _, error in got if n != 1)
