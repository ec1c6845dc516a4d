from __future__ import annotations

import json

import pytest

from schemas.registry import current_schemas, history
from schemas.sample_blocks import pack
from schemas.serde import SerdeError, UnknownSchemaError, deserializer, serializer

EXAMPLES = {
    "InteractionEvent": {"event_id": "e1", "user_id": "u1", "item_id": "i1", "event_type": "impression",
                         "event_time": 1_700_000_000_123, "dwell_ms": None, "position": 3, "session_id": "s"},
    "FeatureRecord": {"entity_type": "user", "entity_id": "u1", "horizon_s": 3, "window_start": 1_700_000_000_000,
                      "window_end": 1_700_000_003_000, "impressions": 10, "clicks": 2, "likes": 1, "carts": 0,
                      "orders": 0, "ctr": 0.2, "dwell_sum_ms": 4000, "dwell_mean_ms": 2000.0,
                      "distinct_counterparts": 7, "dwell_count": 2, "recent_items": None, "recent_types": None,
                      "recent_times_ms": None, "counterpart_hashes": [3, 1 << 62],
                      "tile_of_horizons_s": [60]},
    "TrainingSample": {"sample_id": "e1", "user_id": "u1", "item_id": "i1", "event_time": 1_700_000_000_000,
                       "label": 1, "features": [0.5, 1.0], "feature_set": "v1", "position": None,
                       "recent_items": ["i7", "i2"], "recent_types": ["click", "cart"], "recent_ages_ms": [900, 4100]},
    "ModelSnapshot": {"version": 3, "parent": 2, "created_at": 1_700_000_000_000, "uri": "/s/3",
                      "manifest_sha256": "ab" * 32, "model_name": "mf", "samples_seen": 1000,
                      "offsets": [{"topic": "t", "partition": 0, "offset": 42}], "auc": 0.71, "logloss": None,
                      "promoted": True},
    "DeadLetter": {"stage": "replay", "reason": "bad", "source_topic": None, "source_partition": None,
                   "source_offset": None, "key": None, "value": b"\x00\x01", "detected_at": 1_700_000_000_000},
}
EXAMPLES["TrainingSampleBlock"] = pack([EXAMPLES["TrainingSample"]] * 2)


def test_every_schema_has_an_example() -> None:
    assert set(EXAMPLES) == set(current_schemas())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_round_trip(name: str) -> None:
    enc, dec = serializer(name), deserializer(name)
    assert dec(enc(EXAMPLES[name]), enc.header_value) == EXAMPLES[name]


def test_bulk_decode_separates_bad_values() -> None:
    enc, dec = serializer("InteractionEvent"), deserializer("InteractionEvent")
    good = enc(EXAMPLES["InteractionEvent"])
    values = [good, b"\xff\xff\xff", good, good[:-3], None]
    headers = [enc.header_value, enc.header_value, b"InteractionEvent:0000", enc.header_value, enc.header_value]
    oks, errs = dec.decode_many(values, headers)
    assert len(oks) == 1
    assert [i for i, _ in errs] == [1, 2, 3, 4]
    assert "unknown InteractionEvent schema fingerprint" in errs[1][1]
    assert "tombstone" in errs[3][1]


def test_unknown_or_missing_schema_is_a_clear_error() -> None:
    dec = deserializer("InteractionEvent")
    value = serializer("InteractionEvent")(EXAMPLES["InteractionEvent"])
    with pytest.raises(UnknownSchemaError, match="missing rtrec-schema header"):
        dec(value, None)
    with pytest.raises(UnknownSchemaError, match="expected schema InteractionEvent, record says FeatureRecord"):
        dec(value, serializer("FeatureRecord").header_value)


def test_missing_required_field_cannot_be_encoded() -> None:
    record = dict(EXAMPLES["InteractionEvent"])
    del record["user_id"]
    with pytest.raises(SerdeError, match="cannot encode InteractionEvent"):
        serializer("InteractionEvent")(record)


def test_older_writer_version_is_resolved_to_current(tmp_path, monkeypatch) -> None:
    """A record written with v1 of a schema that later gained a defaulted field still decodes."""
    import schemas.registry as registry

    old_raw = json.loads((registry.SCHEMA_DIR / "InteractionEvent.avsc").read_text())
    new_raw = dict(old_raw, fields=[*old_raw["fields"], {"name": "country", "type": "string", "default": "?"}])
    avro_dir, hist_dir = tmp_path / "avro", tmp_path / "history" / "InteractionEvent"
    avro_dir.mkdir()
    hist_dir.mkdir(parents=True)
    (avro_dir / "InteractionEvent.avsc").write_text(json.dumps(new_raw))
    (hist_dir / "v1.avsc").write_text(json.dumps(old_raw))
    monkeypatch.setattr(registry, "SCHEMA_DIR", avro_dir)
    monkeypatch.setattr(registry, "HISTORY_DIR", tmp_path / "history")
    for cached in (registry.current_schemas, registry.history, registry.by_fingerprint):
        cached.cache_clear()
    try:
        old = registry.history("InteractionEvent")[0]
        from schemas.serde import Serializer

        value = Serializer(old)(EXAMPLES["InteractionEvent"])
        decoded = deserializer("InteractionEvent")(value, old.header_value)
        assert decoded == {**EXAMPLES["InteractionEvent"], "country": "?"}
    finally:
        for cached in (registry.current_schemas, registry.history, registry.by_fingerprint):
            cached.cache_clear()


def test_fingerprints_are_stable_and_distinct() -> None:
    fps = [s.fingerprint for s in current_schemas().values()]
    assert len(set(fps)) == len(fps)
    assert all(len(fp) == 16 for fp in fps)
    assert history("InteractionEvent")[0].fingerprint == current_schemas()["InteractionEvent"].fingerprint
