"""The windowed feature job: interactions topic -> 3 s (and longer) windows per user, item and
user-item -> FeatureRecords on the features topic (exactly-once), training samples on the samples
topic, each user's recent engagements per window; malformed and late events -> the dead-letter topic
with their reason. Redis is fed from the features topic by feature_store.loader.

SQL reads the topic, decodes and checks each record once (a Java UDF) and routes what is bad or late
to the dead letters; the windows and samples are two keyed Java operators
(flink_jobs/java/.../features: one keyed by item, then one keyed by user); SQL writes their rows to
the topics. Sections in order: UDFs, the spec of the operators, source DDL with the watermark,
decoded view, operators, sinks, statement set.
"""

from __future__ import annotations

import json
from typing import Any

from pyflink.java_gateway import get_gateway
from pyflink.table import StatementSet, TableEnvironment
from pyflink.table.explain_detail import ExplainDetail

from core.log_range import LogRange
from core.settings import FlinkSettings, Settings
from feature_store.keys import RECENT_HORIZON_S
from flink_jobs.ddl import avro_sink_ddl, bytes_sink_ddl, events_source_ddl, quote, schema_json, writer_schemas
from flink_jobs.feature_sql import dead_letters_sql, decoded_view_sql, well_formed_sql
from flink_jobs.range_options import connector_options
from schemas.feature_set import AGGREGATES, ENTITY_TYPES, FEATURE_SET, HORIZONS_S
from schemas.registry import schema
from schemas.sample_blocks import BLOCK_SCHEMA


def decode_limits(f: FlinkSettings) -> list[int | None]:
    """The decode's limits, in its order: past (None: any age), future skew, earliest time, bytes, id length."""
    return [f.max_event_age_ms, f.max_future_skew_ms, f.min_event_time_ms, f.max_event_bytes, f.max_id_length]


def decode_args(settings: Settings) -> str:
    """The decode UDF's arguments after the value and headers, as SQL: the writer schemas, the reader
    schema and the limits."""
    limits = ", ".join("CAST(NULL AS BIGINT)" if n is None else f"CAST({n} AS BIGINT)"
                       for n in decode_limits(settings.flink))
    return f"{quote(writer_schemas('InteractionEvent'))}, {quote(schema_json('InteractionEvent'))}, {limits}"


def record_tiles(f: FlinkSettings) -> list[tuple[int, int, list[int], bool]]:
    """The features topic's tiles per user and item: (tile length s, horizon_s, tile_of_horizons_s,
    with sketch). The base window, and each longer horizon as tiles of its hop; horizons of one tile
    length share one record, whose horizon_s is the base window where that is one of them (else the
    first) and which lists the others, so a user's 3 s window is written once, not once more as the
    60 s horizon's tile. A record that is a tile of a longer horizon carries the sketch of its
    counterparts (the store merges a horizon's distinct count from them). User-item pairs get the
    base window only: their long horizons would multiply the output rows.

    >>> record_tiles(FlinkSettings())
    [(3, 3, [60], True), (30, 600, [], True)]
    >>> record_tiles(FlinkSettings(horizons_s=()))
    [(3, 3, [], False)]
    """
    tiles: dict[int, set[int]] = {f.window_s: {f.window_s}}  # tile length -> the horizons made of it
    for h in f.horizons_s if f.horizons_s is not None else HORIZONS_S:
        tiles.setdefault(f.hop_s(h), set()).add(h)
    out = []
    for tile, horizons in tiles.items():
        primary = tile if tile in horizons else min(horizons)
        out.append((tile, primary, sorted(h for h in horizons if h != primary), any(tile < h for h in horizons)))
    return out


def operator_spec(f: FlinkSettings, with_samples: bool) -> str:
    """The text the Java operators parse (FeatureSpec): what to count and write.

    >>> print(operator_spec(FlinkSettings(), True).replace(" ", chr(10)))
    window_ms=3000
    records=3000:3:60:1,30000:600::1
    sample_horizons=60000:3000,600000:30000
    sample_aggregates=impressions,clicks,likes,ctr,dwell_mean_ms
    attribution_ms=30000
    history_length=10
    lookback_ms=3600000
    state_ttl_ms=86400000
    sketch_size=64
    samples=1
    feature_set=v1
    """
    records = ",".join(f"{tile * 1000}:{horizon}:{'+'.join(map(str, tile_of))}:{int(sketch)}"
                       for tile, horizon, tile_of, sketch in record_tiles(f))
    pairs = {"window_ms": f.window_s * 1000, "records": records,
             "sample_horizons": ",".join(f"{h * 1000}:{f.hop_s(h) * 1000}" for h in HORIZONS_S),
             "sample_aggregates": ",".join(AGGREGATES), "attribution_ms": f.attribution_window_s * 1000,
             "history_length": f.history_length, "lookback_ms": f.history_lookback_s * 1000,
             "state_ttl_ms": f.state_ttl_s * 1000, "sketch_size": f.distinct_sketch_size,
             "samples": int(with_samples), "feature_set": FEATURE_SET}
    return " ".join(f"{k}={v}" for k, v in pairs.items())


def sink_client(settings: Settings) -> dict[str, str]:
    """The sinks' producer properties: `flink.sink_producer`, then authentication and TLS.

    >>> sink_client(Settings(flink={"sink_producer": {"linger.ms": "5"}}))
    {'linger.ms': '5'}
    """
    return {**settings.flink.sink_producer, **settings.kafka.security.flink_connector()}


def add_operators(settings: Settings, t_env: TableEnvironment, source: str, with_samples: bool) -> None:
    """The views `feature_rows` (the users' and pairs' FeatureRecords), `item_feature_rows` (the items')
    and `sample_rows` (TrainingSamples, with samples), each a key, the Avro value and the schema header,
    and `dead_letter_rows` (what did not decode or came
    late), from the events topic's table `source`, which the operators read and decode once: a second
    reader would be a second source reading and decoding every record."""
    f = settings.flink
    operators = get_gateway().jvm.dev.rtrec.flink.features.FeatureOperators
    operators.register(t_env._j_tenv, source, settings.kafka.topics.events, writer_schemas("InteractionEvent"),
                       schema_json("InteractionEvent"), *decode_limits(f), operator_spec(f, with_samples),
                       schema_json("FeatureRecord"), schema("FeatureRecord").header_value.decode(),
                       schema_json("TrainingSample"), schema("TrainingSample").header_value.decode(),
                       schema_json(BLOCK_SCHEMA), schema(BLOCK_SCHEMA).header_value.decode(), f.samples_per_message,
                       # with checkpoints a block waits for the checkpoint's barrier, as the transaction does
                       0 if f.checkpoint_interval_ms > 0 else f.buffer_timeout_ms,
                       f.window_s, RECENT_HORIZON_S, ",".join(ENTITY_TYPES),
                       "feature_rows", "sample_rows", "dead_letter_rows")


def job_graph(statements: StatementSet) -> list[dict[str, Any]]:
    """The nodes of the job's stream graph (Flink's JSON execution plan): the SQL and the operators
    between it, which the SQL plan alone (`explain()`) does not show."""
    plan = statements.explain(ExplainDetail.JSON_EXECUTION_PLAN).split("== Physical Execution Plan ==")[-1]
    return json.loads(plan[plan.index("{"):])["nodes"]


def build_job(settings: Settings, t_env: TableEnvironment, log_range: LogRange | None = None,
              job_id: str = "features", with_samples: bool = True) -> StatementSet:
    k, f = settings.kafka, settings.flink
    add_events_source(settings, t_env, "events", f.group_id, log_range)
    add_operators(settings, t_env, "events_raw", with_samples)

    exactly_once = f.checkpoint_interval_ms > 0
    t_env.execute_sql(bytes_sink_ddl("features_sink", k.topics.features, k.bootstrap_servers, exactly_once,
                                     f"rtrec-{job_id}-features", client=sink_client(settings)))
    t_env.execute_sql(avro_sink_ddl("dead_letter_sink", "DeadLetter", k.topics.dead_letter, k.bootstrap_servers,
                                    exactly_once, f"rtrec-{job_id}-dead", client=sink_client(settings)))
    statements = t_env.create_statement_set()
    statements.add_insert_sql("INSERT INTO features_sink SELECT * FROM feature_rows")
    if with_samples:
        t_env.execute_sql(bytes_sink_ddl("samples_sink", k.topics.samples, k.bootstrap_servers, exactly_once,
                                         f"rtrec-{job_id}-samples", client=sink_client(settings)))
        statements.add_insert_sql("INSERT INTO samples_sink SELECT * FROM sample_rows")
    statements.add_insert_sql(f"INSERT INTO dead_letter_sink {dead_letters_sql('dead_letter_rows')}")
    return statements


def add_events_source(settings: Settings, t_env: TableEnvironment, name: str, group_id: str,
                      log_range: LogRange | None) -> None:
    """The events topic as the table `<name>_raw`: bytes, headers, partition and offset, its rowtime and
    watermark from each value's event time (decoded in the JVM)."""
    k, f = settings.kafka, settings.flink
    t_env.create_java_temporary_system_function("RTREC_EVENT_TIME", "dev.rtrec.flink.EventTimeOf")
    t_env.execute_sql(events_source_ddl(f"{name}_raw", k.topics.events, k.bootstrap_servers, group_id,
                                        f.watermark_delay_ms, "RTREC_EVENT_TIME", decode_args(settings),
                                        {"properties.max.partition.fetch.bytes": str(f.source_fetch_bytes),
                                         **(connector_options(log_range) if log_range is not None else
                                            {"scan.startup.mode": "group-offsets",
                                             "properties.auto.offset.reset": "earliest"})},
                                        client=k.security.flink_connector()))


def add_decoded_views(settings: Settings, t_env: TableEnvironment, name: str) -> None:
    """Over `<name>_raw`, the views `<name>_decoded` (each record decoded in SQL by the job's decode UDF,
    or why it could not be) and `<name>` (the well-formed ones): the benchmarks' reference queries."""
    t_env.create_java_temporary_system_function("RTREC_DECODE_EVENT", "dev.rtrec.flink.DecodeInteractionEvent")
    t_env.create_temporary_view(f"{name}_decoded", t_env.sql_query(
        decoded_view_sql(f"{name}_raw", "RTREC_DECODE_EVENT", decode_args(settings))))
    t_env.create_temporary_view(name, t_env.sql_query(well_formed_sql(f"{name}_decoded")))
