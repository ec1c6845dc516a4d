"""SQL of the training samples: one per impression, labelled by an engagement on the same user-item
pair within the attribution window, carrying the features as of the impression time.

Point in time: an impression at t gets, per entity and horizon, the hopping window with
t - slide < window_end <= t. A window is [start, end), so nothing at or after t is in it: a click at t
cannot leak into the features of the impression at t. It is not computed as a hopping window, which
emits every key once per slide for as long as the key has events in it (most of those rows would join
no impression): the horizon's tiles (tumbling windows of its slide) are added up over the horizon
before the impression's own tile, once per tile (`horizon_before_tile_sql`).

The user's recent engagements are a list per user, a new version at each engagement; the impression
looks its user's list up as of t (an event-time temporal join, which holds nothing back beyond the
watermark) and keeps the entries strictly before t. Every joined row, the impression itself and its
label rows meet in a tumbling window on the impression time, which closes once the watermark has passed
the attribution window: that is when a sample is emitted.

>>> "e.event_time <= i.event_time + INTERVAL '30' SECOND(2)" in label_rows_sql(30)
True
"""

from __future__ import annotations

from feature_store.keys import RECENT_HORIZON_S
from flink_jobs.ddl import header_literal, quote
from flink_jobs.feature_sql import ENTITY_KEYS, NO_HASHES, NO_TILE_OF, interval, tumble_table
from schemas.feature_set import AGGREGATES, FEATURE_NAMES, FEATURE_SET

_AGG_COLUMNS = {"impressions": "CAST(impressions AS DOUBLE)", "clicks": "CAST(clicks AS DOUBLE)",
                "likes": "CAST(likes AS DOUBLE)", "ctr": "ctr", "dwell_mean_ms": "dwell_mean_ms"}
_NULL_FEATURES = ", ".join(f"CAST(NULL AS DOUBLE) AS f_{a}" for a in AGGREGATES)
_ROW_HEAD = "i.event_id, i.user_id, i.item_id, i.`position`, i.event_time_ms, i.event_time AS t"
_NO_HISTORY = ("CAST(NULL AS ARRAY<STRING>) AS h_items, CAST(NULL AS ARRAY<STRING>) AS h_types, "
               "CAST(NULL AS ARRAY<BIGINT>) AS h_times")


def impressions_sql(source: str) -> str:
    return (f"SELECT event_id, user_id, item_id, `position`, event_time_ms, event_time FROM {source} "
            "WHERE event_type = 'impression'")


def engagements_sql(source: str) -> str:
    return (f"SELECT user_id, item_id, event_type, event_time_ms, event_time FROM {source} "
            "WHERE event_type <> 'impression'")


def tiles_sql(entity_type: str, tile_s: int, source: str) -> str:
    """Per entity and tile (a tumbling window of `tile_s`, a horizon's slide): the counts and sums that
    the horizon adds up. A tile is emitted once, where a hopping window was emitted once per slide."""
    key = ENTITY_KEYS[entity_type]
    return f"""SELECT {key} AS entity_id, window_time,
  COUNT(*) FILTER (WHERE event_type = 'impression') AS impressions,
  COUNT(*) FILTER (WHERE event_type = 'click') AS clicks, COUNT(*) FILTER (WHERE event_type = 'like') AS likes,
  CAST(COALESCE(SUM(dwell_ms), 0) AS BIGINT) AS dwell_sum, COUNT(dwell_ms) AS dwell_n
FROM TABLE({tumble_table(tile_s, source)})
GROUP BY window_start, window_end, window_time, {key}"""


def horizon_before_tile_sql(tiles: str, horizon_s: int) -> str:
    """Per tile, the horizon's features over the tiles before it: the tiles ending in (end - horizon,
    start], which is the hopping window [start - horizon, start) that the tile's impressions join. The
    range takes the tile itself too (Flink's OVER ends at the current row), so its own counts are taken
    off again: nothing at or after an impression's tile start is in its features."""
    over = (f"OVER (PARTITION BY entity_id ORDER BY window_time "
            f"RANGE BETWEEN {interval(horizon_s)} PRECEDING AND CURRENT ROW)")
    sums = ", ".join(f"SUM({c}) {over} - {c} AS {c}"
                     for c in ("impressions", "clicks", "likes", "dwell_sum", "dwell_n"))
    return f"""SELECT entity_id, window_time, impressions, clicks, likes,
  CASE WHEN impressions > 0 THEN CAST(clicks AS DOUBLE) / impressions ELSE 0.0 END AS ctr,
  CASE WHEN dwell_n > 0 THEN CAST(dwell_sum AS DOUBLE) / dwell_n ELSE 0.0 END AS dwell_mean_ms
FROM (SELECT entity_id, window_time, {sums} FROM {tiles})"""


def engagement_lists_sql(history_length: int) -> str:
    """Per engagement, its user's newest engagements up to and including it. Twice the length the
    samples keep: entries at the impression's own millisecond are cut from the list it reads."""
    return f"""SELECT user_id, event_time,
  RTREC_RECENT_ENGAGEMENTS(item_id, event_type, event_time_ms, {2 * int(history_length)}) OVER (
    PARTITION BY user_id ORDER BY event_time ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS recent
FROM engagements"""


def recent_lists_sql(lists: str, window_s: int) -> str:
    """The online store's copy of the lists: per user and base window holding engagements, the newest
    version as of the window's end, as a FeatureRecord of horizon 0 (every count 0). The samples read
    the same versions, so a model is served the lists it was trained on."""
    zeros = ", ".join(f"CAST(0 AS BIGINT) AS {c}" for c in ("impressions", "clicks", "likes", "carts", "orders"))
    return f"""SELECT CAST(user_id AS BYTES) AS entity_id_key, 'user' AS entity_type, user_id AS entity_id,
  CAST({RECENT_HORIZON_S} AS INT) AS horizon_s, window_start, window_end, {zeros}, 0.0 AS ctr,
  CAST(0 AS BIGINT) AS dwell_sum_ms, 0.0 AS dwell_mean_ms, CAST(0 AS BIGINT) AS distinct_counterparts,
  w.newest.items AS recent_items, w.newest.types AS recent_types, w.newest.times_ms AS recent_times_ms,
  CAST(0 AS BIGINT) AS dwell_count, {NO_HASHES} AS counterpart_hashes, {NO_TILE_OF} AS tile_of_horizons_s,
  {header_literal('FeatureRecord')} AS headers
FROM (SELECT user_id, window_start, window_end,
    RTREC_NEWEST_LIST(recent.items, recent.types, recent.times_ms) AS newest
  FROM TABLE(TUMBLE(TABLE {lists}, DESCRIPTOR(event_time), {interval(window_s)}))
  GROUP BY window_start, window_end, user_id) w"""


def user_recent_sql(lists: str) -> str:
    """The lists as a versioned table keyed by user (the newest version per event time)."""
    return f"""SELECT user_id, event_time, recent FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY event_time DESC) AS rn FROM {lists})
WHERE rn = 1"""


def base_rows_sql(user_recent: str | None = None) -> str:
    """The impression's own row; with `user_recent`, carrying its user's list as of the impression."""
    if user_recent is None:
        return (f"SELECT {_ROW_HEAD}, 0 AS label, CAST(NULL AS STRING) AS kind, {_NULL_FEATURES}, {_NO_HISTORY} "
                "FROM impressions i")
    return f"""SELECT {_ROW_HEAD}, 0 AS label, CAST(NULL AS STRING) AS kind, {_NULL_FEATURES},
  r.recent.items AS h_items, r.recent.types AS h_types, r.recent.times_ms AS h_times
FROM impressions i LEFT JOIN {user_recent} FOR SYSTEM_TIME AS OF i.event_time AS r ON i.user_id = r.user_id"""


def label_rows_sql(attribution_s: int) -> str:
    return f"""SELECT {_ROW_HEAD}, 1 AS label, CAST(NULL AS STRING) AS kind, {_NULL_FEATURES}, {_NO_HISTORY}
FROM impressions i JOIN engagements e
  ON i.user_id = e.user_id AND i.item_id = e.item_id
  AND e.event_time > i.event_time AND e.event_time <= i.event_time + {interval(attribution_s)}"""


def feature_rows_sql(view: str, entity_type: str, horizon_s: int, slide_s: int) -> str:
    """The impression's features of one entity and horizon: the row of the tile it falls in
    (`horizon_before_tile_sql`), whose time (its end - 1 ms) is in [t, t + slide)."""
    key = {"user": "i.user_id", "item": "i.item_id"}[entity_type]
    cols = ", ".join(f"{_AGG_COLUMNS[a]} AS f_{a}" for a in AGGREGATES)
    return f"""SELECT {_ROW_HEAD}, 0 AS label, {quote(f'{entity_type}.{horizon_s}')} AS kind, {cols}, {_NO_HISTORY}
FROM impressions i JOIN {view} f
  ON {key} = f.entity_id
  AND f.window_time >= i.event_time AND f.window_time < i.event_time + {interval(slide_s)}"""


def samples_sql(rows_view: str, window_s: int, history_length: int, lookback_s: int) -> str:
    features = []
    for name in FEATURE_NAMES:
        entity, horizon, agg = name.split(".")
        kind = f"{entity}.{horizon[:-1]}"
        features.append(f"CAST(COALESCE(MAX(CASE WHEN kind = {quote(kind)} THEN f_{agg} END), 0.0) AS FLOAT)")
    return f"""SELECT user_id_key, sample_id, user_id, item_id, event_time, label, features, feature_set,
  `position`, s.recent.items AS recent_items, s.recent.types AS recent_types, s.recent.ages_ms AS recent_ages_ms,
  headers
FROM (SELECT
  CAST(user_id AS BYTES) AS user_id_key,
  event_id AS sample_id, user_id, item_id,
  CAST(TO_TIMESTAMP_LTZ(MAX(event_time_ms), 3) AS TIMESTAMP(3)) AS event_time,
  MAX(label) AS label,
  ARRAY[{", ".join(features)}] AS features,
  {quote(FEATURE_SET)} AS feature_set,
  MAX(`position`) AS `position`,
  RTREC_RECENT_BEFORE(h_items, h_types, h_times, event_time_ms, CAST({int(lookback_s) * 1000} AS BIGINT),
    {int(history_length)}) AS recent,
  {header_literal('TrainingSample')} AS headers
FROM TABLE(TUMBLE(TABLE {rows_view}, DESCRIPTOR(t), {interval(window_s)}))
GROUP BY window_start, window_end, event_id, user_id, item_id) s"""
