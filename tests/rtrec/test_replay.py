from __future__ import annotations

from pathlib import Path

import pytest

from core.log_range import parse_time_ms
from core.settings import Settings
from rtrec.sources.produce import produce_replay
from rtrec.sources.replay import ColumnMapping, read_log
from schemas.kafka_io import read_topic

DATA = Path(__file__).parents[1] / "data"
OTTO = ColumnMapping(user="session", item="aid", time="ts", type="type")
OBD = Path(__file__).parents[3] / "shared" / "data" / "open-bandit-dataset" / "random" / "men" / "men.csv"


def test_otto_log_is_parsed_in_event_time_order() -> None:
    events, rejected, n_rows = read_log(DATA / "otto_sample.csv", OTTO)
    assert (n_rows, len(events), rejected) == (862, 862, [])
    assert [e["event_time"] for e in events] == sorted(e["event_time"] for e in events)
    types = {t: sum(e["event_type"] == t for e in events) for t in ("click", "cart", "order")}
    assert types == {"click": 800, "cart": 52, "order": 10}


def test_malformed_rows_are_reported_with_line_and_reason() -> None:
    events, rejected, n_rows = read_log(DATA / "malformed_events.csv", ColumnMapping(dwell="dwell_ms"))
    assert n_rows == 10
    assert [e["user_id"] for e in events] == ["u1", "u1", "u7", "u9"]  # u7 and u9 tie: stable
    assert {r.line: r.reason for r in rejected} == {
        4: "missing item_id",
        5: rejected[1].reason,
        6: "unknown event type 'teleport'",
        7: "expected 5 columns, found 3",
        8: "timestamp '99999999999999999999' is out of range",
        10: "timestamp '2023-11-14T22:13:26' has no time zone",
    }
    assert "not-a-time" in rejected[1].reason


def test_time_formats() -> None:
    assert parse_time_ms("1700000000") == parse_time_ms("1700000000000") == parse_time_ms("1700000000000000")
    assert parse_time_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    with pytest.raises(ValueError):
        parse_time_ms("nan")


@pytest.mark.skipif(not OBD.exists(), reason="shared Open Bandit Dataset sample not present")
def test_open_bandit_rows_become_impressions_and_clicks() -> None:
    mapping = ColumnMapping(user="user_feature_0+user_feature_1+user_feature_2+user_feature_3", item="item_id",
                            time="timestamp", type=None, click="click", position="position")
    events, rejected, n_rows = read_log(OBD, mapping)
    assert rejected == [] and n_rows == 10_000
    impressions = [e for e in events if e["event_type"] == "impression"]
    clicks = [e for e in events if e["event_type"] == "click"]
    assert len(impressions) == 10_000 and 0 < len(clicks) < 200
    assert {e["position"] for e in impressions} == {1, 2, 3}


@pytest.mark.integration
def test_replay_into_kafka_counts_and_dead_letters(settings: Settings) -> None:
    summary = produce_replay(settings, DATA / "otto_sample.csv", OTTO, progress=False)
    assert (summary.read, summary.produced, summary.rejected) == (862, 862, 0)
    got = read_topic(settings.kafka.bootstrap_servers, settings.kafka.topics.events, "InteractionEvent")
    assert len(got.records) == 862 and got.rejected == []
    assert {r["event_id"] for r in got.records} == {f"otto_sample.csv:{n}" for n in range(2, 864)}

    bad = produce_replay(settings, DATA / "malformed_events.csv", ColumnMapping(), progress=False)
    assert (bad.read, bad.produced, bad.rejected) == (10, 4, 6)
    dead = read_topic(settings.kafka.bootstrap_servers, settings.kafka.topics.dead_letter, "DeadLetter")
    assert len(dead.records) == 6
    assert all(d["stage"] == "replay" and d["reason"].startswith("malformed_events.csv:") for d in dead.records)
    assert any(d["value"] == b"u4,i4,1700000003000,teleport," for d in dead.records)
