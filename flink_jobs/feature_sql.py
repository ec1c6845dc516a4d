"""The window SQL of the feature job (pure: text only).

>>> "TUMBLE(TABLE events, DESCRIPTOR(event_time), INTERVAL '3' SECOND(2))" in window_sql("user", 60, 3)
True
>>> "CAST(60 AS INT) AS horizon_s" in window_sql("user", 60, 3)
True
>>> "DISTINCT" in window_sql("user_item", 3, 3), "COUNT(DISTINCT item_id)" in window_sql("user", 3, 3)
(False, True)
>>> "RTREC_SMALLEST_HASHES(user_id, 64)" in window_sql("item", 600, 30, 64), NO_HASHES in window_sql("item", 3, 3, 64)
(True, True)
>>> shared = window_sql("user", (3, 60), 3, 64)  # the base window and the 60 s horizon's tiles: one record
>>> shared.count("GROUP BY"), "CAST(3 AS INT) AS horizon_s" in shared, "RTREC_SMALLEST_HASHES(item_id, 64)" in shared
(1, True, True)
>>> "ARRAY[CAST(60 AS INT)] AS tile_of_horizons_s" in shared
True
"""

from __future__ import annotations

from collections.abc import Sequence

from feature_store.keys import pair_id_sql
from flink_jobs.ddl import header_literal, quote

ENTITY_KEYS = {"user": "user_id", "item": "item_id", "user_item": pair_id_sql("user_id", "item_id")}
# a pair's only counterpart is its own item: 1, with no distinct state (a COUNT DISTINCT keeps a map
# per key and window, and pairs are most of the job's keys)
COUNTERPART = {"user": "item_id", "item": "user_id"}
# the job's name of flink_jobs/java's SmallestHashes, and a record without its sketch
SMALLEST_HASHES = "RTREC_SMALLEST_HASHES"
NO_HASHES = "CAST(NULL AS ARRAY<BIGINT NOT NULL>)"
# a record that is no other horizon's tile too
NO_TILE_OF = "CAST(NULL AS ARRAY<INT NOT NULL>)"
# a window's record carries no recent engagements (sample_sql.recent_lists_sql writes those)
NO_RECENT = ("CAST(NULL AS ARRAY<STRING>) AS recent_items, CAST(NULL AS ARRAY<STRING>) AS recent_types, "
             "CAST(NULL AS ARRAY<BIGINT>) AS recent_times_ms")


def _count(event_type: str) -> str:
    return f"CAST(COUNT(*) FILTER (WHERE event_type = {quote(event_type)}) AS BIGINT)"


def interval(seconds: int) -> str:
    """A seconds interval literal with enough leading precision (the default, 2 digits, stops at 99).
    Flink takes at most 3 digits of seconds, so from 1000 s on it is written in days to seconds.

    >>> interval(600), interval(3600), interval(100_000)
    ("INTERVAL '600' SECOND(3)", "INTERVAL '0 01:00:00' DAY TO SECOND", "INTERVAL '1 03:46:40' DAY TO SECOND")
    """
    if seconds < 1000:
        return f"INTERVAL '{seconds}' SECOND({max(2, len(str(seconds)))})"
    minutes, secs = divmod(seconds, 60)
    hours, mins = divmod(minutes, 60)
    days, hrs = divmod(hours, 24)
    if days > 99:
        raise ValueError(f"an interval of {seconds} s is over Flink's 99 days")
    return f"INTERVAL '{days} {hrs:02d}:{mins:02d}:{secs:02d}' DAY TO SECOND"


def tumble_table(size_s: int, source: str = "events") -> str:
    return f"TUMBLE(TABLE {source}, DESCRIPTOR(event_time), {interval(size_s)})"


def tile_aggregate_sql(entity_type: str, tile_s: int, sketch_size: int = 0) -> str:
    """Per entity and tumbling window of `tile_s`: the counts and sums of its events, with `sketch_size`
    the sketch of its counterparts."""
    key = ENTITY_KEYS[entity_type]
    counterparts = (f"COUNT(DISTINCT {COUNTERPART[entity_type]})" if entity_type in COUNTERPART else "1")
    hashes = (f"{SMALLEST_HASHES}({COUNTERPART[entity_type]}, {int(sketch_size)})"
              if entity_type in COUNTERPART and sketch_size > 0 else NO_HASHES)
    return f"""SELECT {key} AS entity_id, window_start, window_end,
  {_count('impression')} AS impressions, {_count('click')} AS clicks, {_count('like')} AS likes,
  {_count('cart')} AS carts, {_count('order')} AS orders,
  CAST(COALESCE(SUM(dwell_ms), 0) AS BIGINT) AS dwell_sum_ms, CAST(COUNT(dwell_ms) AS BIGINT) AS dwell_count,
  CAST({counterparts} AS BIGINT) AS distinct_counterparts, {hashes} AS counterpart_hashes
FROM TABLE({tumble_table(tile_s)})
GROUP BY window_start, window_end, {key}"""


def window_sql(entity_type: str, horizon_s: int | Sequence[int], tile_s: int, sketch_size: int = 0) -> str:
    """One FeatureRecord row per entity and tumbling window of `tile_s`; the `headers` column carries
    the schema id. With `tile_s` shorter than a horizon the row is a tile of that horizon: the online
    store adds a horizon's tiles up when it is read (a hopping window would emit every key once per
    slide), and a user's or item's tile carries the `sketch_size` smallest hashes of its
    counterparts, which merge into the horizon's distinct count. Several horizons of one tile length
    (the base window among them) share one aggregation and one record: its horizon_s is the base
    window where that is one of them (else the first), and `tile_of_horizons_s` lists the others, so a
    user's 3 s window is written once, not once more as the 60 s horizon's tile."""
    horizons = sorted({horizon_s} if isinstance(horizon_s, int) else set(horizon_s))
    tiled = any(tile_s < h for h in horizons)
    primary = tile_s if tile_s in horizons else horizons[0]
    others = [h for h in horizons if h != primary]
    tile_of = f"ARRAY[{', '.join(f'CAST({h} AS INT)' for h in others)}]" if others else NO_TILE_OF
    return f"""SELECT
  CAST(entity_id AS BYTES) AS entity_id_key,
  {quote(entity_type)} AS entity_type,
  entity_id,
  CAST({primary} AS INT) AS horizon_s,
  window_start,
  window_end,
  impressions,
  clicks,
  likes,
  carts,
  orders,
  CASE WHEN impressions > 0 THEN CAST(clicks AS DOUBLE) / impressions ELSE 0.0 END AS ctr,
  dwell_sum_ms,
  CASE WHEN dwell_count > 0 THEN CAST(dwell_sum_ms AS DOUBLE) / dwell_count ELSE 0.0 END AS dwell_mean_ms,
  distinct_counterparts,
  {NO_RECENT},
  dwell_count,
  {'counterpart_hashes' if tiled else NO_HASHES} AS counterpart_hashes,
  {tile_of} AS tile_of_horizons_s,
  {header_literal('FeatureRecord')} AS headers
FROM ({tile_aggregate_sql(entity_type, tile_s, sketch_size if tiled else 0)})"""


def decoded_view_sql(source: str, decode_udf: str, decode_args: str) -> str:
    return f"""SELECT
  {decode_udf}(`value`, `headers`, {decode_args}) AS ev,
  event_time, `value`, `partition`, `offset`
FROM {source}"""


def good_events_sql(decoded: str, window_s: int, held_back_ms: int = 0) -> str:
    """Well-formed events that are not late (their base window has not closed at the watermark). A
    source whose watermark is held back `held_back_ms` more than the features' sees the same events as
    late: the watermark plus that much."""
    return f"""SELECT ev.event_id AS event_id, ev.user_id AS user_id, ev.item_id AS item_id,
  ev.event_type AS event_type, ev.dwell_ms AS dwell_ms, ev.`position` AS `position`,
  ev.event_time_ms AS event_time_ms, event_time
FROM {decoded}
WHERE ev.error IS NULL AND NOT ({_is_late(window_s, held_back_ms)})"""


def _is_late(window_s: int, held_back_ms: int = 0) -> str:
    ms = window_s * 1000
    window_end = f"TO_TIMESTAMP_LTZ(ev.event_time_ms - MOD(ev.event_time_ms, {ms}) + {ms - held_back_ms}, 3)"
    watermark = "CURRENT_WATERMARK(event_time)"
    return f"{watermark} IS NOT NULL AND {window_end} <= {watermark}"


def dead_letters_sql(decoded: str, topic: str, window_s: int) -> str:
    reason = ("CASE WHEN ev.error IS NOT NULL THEN ev.error ELSE "
              "'late: event_time ' || CAST(ev.event_time_ms AS STRING) || ' is behind the watermark ' || "
              "CAST(CURRENT_WATERMARK(event_time) AS STRING) END")
    return f"""SELECT
  'feature-job' AS stage,
  {reason} AS reason,
  {quote(topic)} AS source_topic,
  `partition` AS source_partition,
  `offset` AS source_offset,
  CAST(NULL AS BYTES) AS `key`,
  `value`,
  CAST(CURRENT_TIMESTAMP AS TIMESTAMP(3)) AS detected_at,
  {header_literal('DeadLetter')} AS headers
FROM {decoded}
WHERE ev.error IS NOT NULL OR ({_is_late(window_s)})"""
