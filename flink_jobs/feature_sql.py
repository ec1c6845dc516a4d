"""The SQL around the feature job's operators (pure: text only): the decoded view, the well-formed
events (for the benchmarks' reference query) and the dead letters' rows.

>>> "WHERE ev.error IS NULL" in well_formed_sql("events_decoded")
True
>>> "'feature-job' AS stage" in dead_letters_sql("dead_letter_rows")
True
"""

from __future__ import annotations

from flink_jobs.ddl import header_literal


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


def decoded_view_sql(source: str, decode_udf: str, decode_args: str) -> str:
    return f"""SELECT
  {decode_udf}(`value`, `headers`, {decode_args}) AS ev,
  event_time, `value`, `partition`, `offset`
FROM {source}"""


def well_formed_sql(decoded: str) -> str:
    """The decoded events that are well-formed (late or not: the job's operators judge that)."""
    return f"""SELECT ev.event_id AS event_id, ev.user_id AS user_id, ev.item_id AS item_id,
  ev.event_type AS event_type, ev.dwell_ms AS dwell_ms, ev.`position` AS `position`,
  ev.event_time_ms AS event_time_ms, event_time
FROM {decoded} WHERE ev.error IS NULL"""


def dead_letters_sql(rows: str) -> str:
    """The dead letters the job's first operator split off (reason, source topic, partition, offset,
    value): what did not decode, and what came after its base window had closed."""
    return f"""SELECT
  'feature-job' AS stage,
  reason,
  source_topic,
  `partition` AS source_partition,
  `offset` AS source_offset,
  CAST(NULL AS BYTES) AS `key`,
  `value`,
  CAST(CURRENT_TIMESTAMP AS TIMESTAMP(3)) AS detected_at,
  {header_literal('DeadLetter')} AS headers
FROM {rows}"""
