"""The windowed feature job: interactions topic -> 3 s (and longer) windows per user, item and
user-item -> FeatureRecords on the features topic (exactly-once), with each user's recent engagements
per window when the job writes samples; malformed and late events -> the dead-letter topic with their
reason. Redis is fed from the features topic by feature_store.loader.

Sections in order: UDFs, source DDL with the watermark, decoded view, window SQL, sinks, statement set.
"""

from __future__ import annotations

from pyflink.table import StatementSet, TableEnvironment

from core.log_range import LogRange
from core.settings import FlinkSettings, Settings
from flink_jobs.ddl import avro_sink_ddl, events_source_ddl, quote, schema_json, writer_schemas
from flink_jobs.feature_sql import (
    SMALLEST_HASHES,
    dead_letters_sql,
    decoded_view_sql,
    good_events_sql,
    window_sql,
)
from flink_jobs.range_options import connector_options
from flink_jobs.sample_sql import (
    base_rows_sql,
    engagement_lists_sql,
    engagements_sql,
    feature_rows_sql,
    horizon_before_tile_sql,
    impressions_sql,
    label_rows_sql,
    recent_lists_sql,
    samples_sql,
    tiles_sql,
    user_recent_sql,
)
from schemas.feature_set import HORIZONS_S


def decode_args(settings: Settings) -> str:
    f = settings.flink
    past = "CAST(NULL AS BIGINT)" if f.max_event_age_ms is None else f"CAST({f.max_event_age_ms} AS BIGINT)"
    writers = quote(writer_schemas("InteractionEvent"))
    limits = (f.max_future_skew_ms, f.min_event_time_ms, f.max_event_bytes, f.max_id_length)
    return f"{writers}, {quote(schema_json('InteractionEvent'))}, {past}, " + ", ".join(
        f"CAST({n} AS BIGINT)" for n in limits)


def feature_queries(f: FlinkSettings) -> list[str]:
    """The features topic's window queries: the base window per user, item and pair, and each longer
    horizon's tiles per user and item. User-item pairs get the base window only: their long horizons
    would multiply the output rows."""
    tiles: dict[int, list[int]] = {f.window_s: [f.window_s]}  # tile length -> the horizons made of it
    for h in f.horizons_s or HORIZONS_S:
        tiles.setdefault(f.hop_s(h), []).append(h)
    queries = [window_sql(entity, horizons, tile, f.distinct_sketch_size)
               for entity in ("user", "item") for tile, horizons in tiles.items()]
    return [*queries, window_sql("user_item", f.window_s, f.window_s)]


def sink_client(settings: Settings) -> dict[str, str]:
    """The sinks' producer properties: `flink.sink_producer`, then authentication and TLS.

    >>> sink_client(Settings(flink={"sink_producer": {"linger.ms": "20"}}))
    {'linger.ms': '20'}
    """
    return {**settings.flink.sink_producer, **settings.kafka.security.flink_connector()}


def build_job(settings: Settings, t_env: TableEnvironment, log_range: LogRange | None = None,
              job_id: str = "features", with_samples: bool = True) -> StatementSet:
    k, f = settings.kafka, settings.flink
    t_env.create_java_temporary_system_function("RTREC_DECODE_EVENT", "dev.rtrec.flink.DecodeInteractionEvent")
    t_env.create_java_temporary_system_function("RTREC_EVENT_TIME", "dev.rtrec.flink.EventTimeOf")
    t_env.create_java_temporary_system_function(SMALLEST_HASHES, "dev.rtrec.flink.SmallestHashes")

    add_events_source(settings, t_env, "events", f.group_id, log_range)

    exactly_once = f.checkpoint_interval_ms > 0
    t_env.execute_sql(avro_sink_ddl("features_sink", "FeatureRecord", k.topics.features, k.bootstrap_servers,
                                    exactly_once, f"rtrec-{job_id}-features", key_field="entity_id",
                                    client=sink_client(settings)))
    t_env.execute_sql(avro_sink_ddl("dead_letter_sink", "DeadLetter", k.topics.dead_letter, k.bootstrap_servers,
                                    exactly_once, f"rtrec-{job_id}-dead", client=sink_client(settings)))

    statements = t_env.create_statement_set()
    lists = add_samples(settings, t_env, statements, exactly_once, job_id, log_range) if with_samples else None
    # One INSERT (a UNION ALL): a Kafka sink per INSERT would need its own transactional id prefix.
    queries = feature_queries(f)
    if lists is not None:
        queries.append(recent_lists_sql(lists, f.window_s))
    union = "\nUNION ALL\n".join(queries)
    statements.add_insert_sql(f"INSERT INTO features_sink {union}")
    dead = dead_letters_sql("events_decoded", k.topics.events, f.window_s)
    statements.add_insert_sql(f"INSERT INTO dead_letter_sink {dead}")
    return statements


def add_events_source(settings: Settings, t_env: TableEnvironment, name: str, group_id: str,
                      log_range: LogRange | None, options: dict[str, str] | None = None,
                      held_back_ms: int = 0) -> None:
    """The events topic as `<name>_raw` (bytes), `<name>_decoded` and `<name>` (well-formed, not late),
    its watermark `held_back_ms` behind the features' (late is judged as by the features)."""
    k, f = settings.kafka, settings.flink
    args = decode_args(settings)
    t_env.execute_sql(events_source_ddl(f"{name}_raw", k.topics.events, k.bootstrap_servers, group_id,
                                        f.watermark_delay_ms + held_back_ms, "RTREC_EVENT_TIME", args,
                                        {"properties.max.partition.fetch.bytes": str(f.source_fetch_bytes),
                                         **(connector_options(log_range) if log_range is not None else
                                            {"scan.startup.mode": "group-offsets",
                                             "properties.auto.offset.reset": "earliest"}), **(options or {})},
                                        client=k.security.flink_connector()))
    t_env.create_temporary_view(f"{name}_decoded", t_env.sql_query(
        decoded_view_sql(f"{name}_raw", "RTREC_DECODE_EVENT", args)))
    t_env.create_temporary_view(name, t_env.sql_query(good_events_sql(f"{name}_decoded", f.window_s, held_back_ms)))


def add_samples(settings: Settings, t_env: TableEnvironment, statements: StatementSet, exactly_once: bool,
                job_id: str, log_range: LogRange | None) -> str | None:
    """Training samples (see sample_sql) into the samples topic, keyed by user. Returns the view of the
    users' recent-engagement lists (None when flink.history_length is 0), which the online store gets
    too: from the samples' own lists, so what a model is served is what it was trained on.

    They read the events topic through a source of their own that never turns idle. The samples meet
    rows of several joins, each holding the watermark back by its own bound; once every input had gone
    idle (a quiet spell longer than flink.idle_timeout_ms), the input without a hold-back ran ahead of the
    others for good and the window dropped their label and feature rows as late (measured:
    tests/flink_jobs/test_quiet_period.py). Without idleness a quiet partition delays the samples (never
    the features, whose source keeps its idle timeout) and loses nothing.

    Their watermark is held back one and a half base windows more than the features'
    (`flink.samples_hold_back_ms`). An event the features count (its window still open) can be up to a
    window behind their watermark, and the lists' OVER aggregate and the joins drop what is behind theirs
    (measured: tests/flink_jobs/test_samples.py, an engagement missing from the lists while its window
    counted it). Held back, everything the features count is ahead of the samples' watermark, and late is
    judged the same way in both. The half window puts the samples' window closes between the features'."""
    k, f = settings.kafka, settings.flink
    add_events_source(settings, t_env, "sample_events", f.samples_group_id, log_range,
                      {"scan.watermark.idle-timeout": "0 ms"}, held_back_ms=f.samples_hold_back_ms)
    t_env.create_temporary_view("impressions", t_env.sql_query(impressions_sql("sample_events")))
    t_env.create_temporary_view("engagements", t_env.sql_query(engagements_sql("sample_events")))
    t_env.create_java_temporary_system_function("RTREC_RECENT_ENGAGEMENTS", "dev.rtrec.flink.RecentEngagements")
    t_env.create_java_temporary_system_function("RTREC_RECENT_BEFORE", "dev.rtrec.flink.RecentBefore")
    t_env.create_java_temporary_system_function("RTREC_NEWEST_LIST", "dev.rtrec.flink.NewestList")
    user_recent = None
    if f.history_length > 0:
        t_env.create_temporary_view("engagement_lists", t_env.sql_query(engagement_lists_sql(f.history_length)))
        t_env.create_temporary_view("user_recent", t_env.sql_query(user_recent_sql("engagement_lists")))
        user_recent = "user_recent"
    parts = [base_rows_sql(user_recent), label_rows_sql(f.attribution_window_s)]
    for entity in ("user", "item"):
        for slide in sorted({f.hop_s(h) for h in HORIZONS_S}):  # horizons of one slide share their tiles
            t_env.create_temporary_view(f"tiles_{entity}_{slide}",
                                        t_env.sql_query(tiles_sql(entity, slide, "sample_events")))
        for h in HORIZONS_S:
            tiles, view = f"tiles_{entity}_{f.hop_s(h)}", f"f_{entity}_{h}"
            t_env.create_temporary_view(view, t_env.sql_query(horizon_before_tile_sql(tiles, h)))
            parts.append(feature_rows_sql(view, entity, h, f.hop_s(h)))
    t_env.create_temporary_view("sample_rows", t_env.sql_query("\nUNION ALL\n".join(parts)))
    t_env.execute_sql(avro_sink_ddl("samples_sink", "TrainingSample", k.topics.samples, k.bootstrap_servers,
                                    exactly_once, f"rtrec-{job_id}-samples", key_field="user_id",
                                    client=sink_client(settings)))
    samples = samples_sql("sample_rows", f.window_s, f.history_length, f.history_lookback_s)
    statements.add_insert_sql(f"INSERT INTO samples_sink {samples}")
    return "engagement_lists" if user_recent is not None else None
