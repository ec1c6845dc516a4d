from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import redis

from core.settings import Settings
from feature_store.base import UNKNOWN_WINDOW_END
from feature_store.columns import SCHEMA_VALUE_FIELDS
from feature_store.keys import SLOT_BYTES, SLOT_VALUES, TILE_BYTES, TILE_VALUES, entity_key, progress_key, ring_parts
from feature_store.redis_store import RedisFeatureStore
from feature_store.validation import MAX_RING_TILES
from schemas.feature_set import names_for

pytestmark = pytest.mark.integration


def record(entity_id: str, window_end: int, clicks: int, horizon_s: int = 60, entity_type: str = "user") -> dict:
    return {"entity_type": entity_type, "entity_id": entity_id, "horizon_s": horizon_s,
            "window_start": window_end - horizon_s * 1000, "window_end": window_end, "impressions": 10,
            "clicks": clicks, "likes": 0, "carts": 0, "orders": 0, "ctr": clicks / 10, "dwell_sum_ms": 0,
            "dwell_mean_ms": 0.0, "distinct_counterparts": 3, "dwell_count": 0}


@pytest.fixture
def store(settings: Settings) -> RedisFeatureStore:
    return RedisFeatureStore(settings.redis.url, settings.redis.key_prefix, ttl_s=600)


def test_newest_window_wins_across_and_inside_batches(store: RedisFeatureStore) -> None:
    assert store.write_batch([record("u1", 6000, 1), record("u1", 9000, 2), record("u1", 3000, 9)]) == 1
    got = store.get_online_features("user", ["u1"], ["60s.clicks", "60s.ctr"])
    assert got.values.tolist() == [[2.0, 0.2]] and got.window_end_ms.tolist() == [[9000, 9000]]
    # A replay of older windows changes nothing; the same window again is an idempotent rewrite.
    assert store.write_batch([record("u1", 6000, 5)]) == 0
    assert store.write_batch([record("u1", 9000, 2)]) == 1
    assert store.get_online_features("user", ["u1"], ["60s.clicks"]).values.tolist() == [[2.0]]
    assert store.write_batch([record("u1", 12000, 7)]) == 1
    assert store.get_online_features("user", ["u1"], ["60s.clicks"]).values.tolist() == [[7.0]]


def test_horizons_are_independent_and_unknowns_are_marked(store: RedisFeatureStore) -> None:
    store.write_batch([record("u2", 9000, 1, horizon_s=60), record("u2", 6000, 4, horizon_s=600)])
    got = store.get_online_features("user", ["u2", "nobody"], ["60s.clicks", "600s.clicks"])
    assert got.values[0].tolist() == [1.0, 4.0] and np.isnan(got.values[1]).all()
    assert got.window_end_ms.tolist() == [[9000, 6000], [UNKNOWN_WINDOW_END, UNKNOWN_WINDOW_END]]
    assert got.entity(1) == ({"60s.clicks": None, "600s.clicks": None}, {"60s.clicks": None, "600s.clicks": None})
    assert len(names_for("user")) == 10


def test_bad_feature_name_is_a_clear_error(store: RedisFeatureStore) -> None:
    with pytest.raises(ValueError, match="is not '<horizon>s.<feature>'"):
        store.get_online_features("user", ["u1"], ["clicks"])


def test_reads_in_many_sends_keep_order_and_survive_errors(store: RedisFeatureStore, settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("feature_store.redis_store.ENTITIES_PER_SEND", 7)
    store.write_batch([record(f"m{k}", 9000, k) for k in range(30)])
    got = store.get_online_features("user", [f"m{k}" for k in range(30)] + ["gone"], ["60s.clicks"])
    assert got.values[:30, 0].tolist() == [float(k) for k in range(30)] and np.isnan(got.values[30, 0])
    assert store.get_online_features("user", [], ["60s.clicks"]).values.shape == (0, 1)
    # a key of the wrong type fails the read clearly, and the next read on the pool is not confused
    store.client.set(entity_key(settings.redis.key_prefix, "user", "oops"), "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.get_online_features("user", ["m1", "oops", "m2"], ["60s.clicks"])
    assert store.get_online_features("user", ["m3"], ["60s.clicks"]).values.tolist() == [[3.0]]


def test_a_window_is_one_field_of_packed_float64s_and_other_layouts_are_refused(
        store: RedisFeatureStore, settings: Settings) -> None:
    store.write_batch([record("b1", 9000, 2)])
    raw = store.client.hgetall(entity_key(settings.redis.key_prefix, "user", "b1"))
    assert list(raw) == [b"60s.values"] and len(raw[b"60s.values"]) == SLOT_BYTES
    packed = dict(zip(("window_end", *SLOT_VALUES), struct.unpack(f"<{SLOT_BYTES // 8}d", raw[b"60s.values"]),
                      strict=True))
    assert packed == {k: float(v) for k, v in record("b1", 9000, 2).items() if k in packed}
    assert SLOT_VALUES == SCHEMA_VALUE_FIELDS  # the FeatureRecord's values, in the layout's order
    old_layout = {"60s.values": "9000"}  # decimal text
    store.client.hset(entity_key(settings.redis.key_prefix, "user", "old"), mapping=old_layout)
    with pytest.raises(ValueError, match="not what this store writes"):
        store.get_online_features("user", ["b1", "old"], ["60s.clicks"])
    # a write replaces an old-layout slot instead of comparing against it
    assert store.write_batch([record("old", 6000, 4)]) == 1
    assert store.get_online_features("user", ["old"], ["60s.clicks"]).values.tolist() == [[4.0]]
    # a name that no window keeps reads as unknown, with its horizon's window end
    got = store.get_online_features("user", ["b1"], ["60s.clicks", "60s.nothing"])
    assert got.values[0, 0] == 2.0 and np.isnan(got.values[0, 1]) and got.window_end_ms.tolist() == [[9000, 9000]]


def recent(user_id: str, window_end: int, items: list[str], times_ms: list[int]) -> dict:
    """A user's recent-engagements record, as the feature job writes it (horizon 0, counts 0)."""
    return {**record(user_id, window_end, 0, horizon_s=0), "impressions": 0, "ctr": 0.0, "distinct_counterparts": 0,
            "recent_items": items, "recent_types": ["click"] * len(items), "recent_times_ms": times_ms}


def test_recent_engagements_are_kept_per_user_newest_window_wins_beside_the_features(
        store: RedisFeatureStore, settings: Settings) -> None:
    store.write_batch([record("r1", 9000, 2), recent("r1", 6000, ["i2", "i1"], [5000, 1000]),
                       recent("r1", 3000, ["i1"], [1000])])
    (got, nobody) = store.get_recent_engagements(["r1", "nobody"])
    assert nobody is None and got is not None
    assert (got.items, got.types, got.times_ms, got.as_of_ms) == (["i2", "i1"], ["click", "click"], [5000, 1000], 6000)
    assert got.before(7000, length=1, lookback_ms=10_000) == (["i2"], ["click"], [2000])
    # an older window's list (a replay) changes nothing; a newer one replaces it
    assert store.write_batch([recent("r1", 3000, ["i1"], [1000])]) == 0
    assert store.get_recent_engagements(["r1"])[0] == got
    assert store.write_batch([recent("r1", 12_000, ["i3", "i2", "i1"], [11_000, 5000, 1000])]) == 1
    assert store.get_recent_engagements(["r1"])[0].items == ["i3", "i2", "i1"]  # type: ignore[union-attr]
    # the user's features are untouched and still read, the list shares their key and its TTL
    assert store.get_online_features("user", ["r1"], ["60s.clicks"]).values.tolist() == [[2.0]]
    assert 0 < store.client.ttl(entity_key(settings.redis.key_prefix, "user", "r1")) <= 600


def test_a_redis_that_lost_its_scripts_gets_the_script_again(store: RedisFeatureStore) -> None:
    assert store.write_batch([record("s1", 9000, 2)]) == 1
    store.client.script_flush()  # as after a restart without the script
    assert store.write_batch([record("s1", 12_000, 5), record("s2", 9000, 1)]) == 2
    assert store.get_online_features("user", ["s1", "s2"], ["60s.clicks"]).values.tolist() == [[5.0], [1.0]]


def test_an_error_reply_is_raised_and_the_connection_stays_usable(store: RedisFeatureStore,
                                                                   settings: Settings) -> None:
    store.client.set(entity_key(settings.redis.key_prefix, "user", "str"), "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store.write_batch([record("w1", 9000, 2), record("str", 9000, 2)])
    assert store.write_batch([record("w2", 9000, 7)]) == 1
    assert store.get_online_features("user", ["w2"], ["60s.clicks"]).values.tolist() == [[7.0]]


def test_a_batch_decoded_in_bulk_writes_what_its_records_write(settings: Settings) -> None:
    from feature_store.columns import FeatureColumns
    from schemas.bulk import BulkDecoder
    from schemas.serde import serializer

    rng = np.random.default_rng(3)
    records = []
    for k in range(3000):
        end = int(rng.integers(1, 40)) * 3000
        if k % 5 == 0:
            count = int(rng.integers(0, 4))
            records.append(recent(f"u{k % 97}", end, [f"i{k}-{j}" for j in range(count)], [end - 7] * count))
        else:
            records.append(record(f"e{k % 211}", end, int(rng.integers(0, 9)), horizon_s=int(rng.choice([3, 60, 600])),
                                  entity_type=("user", "item", "user_item")[k % 3]))
    enc = serializer("FeatureRecord")
    decoded = BulkDecoder("FeatureRecord").decode([enc(r) for r in records], [enc.header_value] * len(records))
    assert len(decoded) == len(records)
    by_records = RedisFeatureStore(settings.redis.url, settings.redis.key_prefix + "-records", ttl_s=600)
    by_columns = RedisFeatureStore(settings.redis.url, settings.redis.key_prefix + "-columns", ttl_s=600)
    written = by_records.write_batch(records)
    assert by_columns.write_columns(FeatureColumns.of_decoded(decoded)) == written > 0

    def state(prefix: str) -> dict:
        return {key[len(prefix):]: by_records.client.hgetall(key) for key in by_records.client.scan_iter(f"{prefix}:*")}

    records_state = state(settings.redis.key_prefix + "-records")
    assert records_state == state(settings.redis.key_prefix + "-columns")
    # and what the newest-wins rule keeps, worked out here record by record
    expected: dict[bytes, dict[bytes, bytes]] = {}
    newest: dict[tuple[str, int], int] = {}
    for r in records:
        key = f":f:{r['entity_type']}:{r['entity_id']}".encode()
        slot = (r["entity_type"] + r["entity_id"], r["horizon_s"])
        if r["window_end"] < newest.get(slot, -1):
            continue
        newest[slot] = r["window_end"]
        fields = expected.setdefault(key, {})
        if r["horizon_s"] == 0:
            fields[b"0s.__we"] = struct.pack("<d", r["window_end"])
            listed = {"items": r["recent_items"], "types": r["recent_types"], "times_ms": r["recent_times_ms"]}
            fields[b"recent"] = json.dumps(listed, separators=(",", ":")).encode()
        else:
            values = [r["window_end"], *(r[name] for name in SLOT_VALUES)]
            fields[f"{r['horizon_s']}s.values".encode()] = struct.pack(f"<{len(values)}d", *values)
    assert {k: {f: v for f, v in fields.items() if f in expected[k]} for k, fields in records_state.items()} == expected


TILES_S = {60: 3, 600: 30}


def tile(entity_id: str, horizon_s: int, start: int, impressions: int, clicks: int, dwell: tuple[int, int] = (0, 0),
         counterparts: int = 1, entity_type: str = "user") -> dict:
    """A tile as the feature job writes it: a tumbling window of the horizon's hop, labelled with the horizon."""
    length = TILES_S[horizon_s] * 1000
    return {**record(entity_id, start + length, clicks, horizon_s, entity_type), "window_start": start,
            "impressions": impressions, "ctr": clicks / impressions if impressions else 0.0,
            "dwell_sum_ms": dwell[0], "dwell_count": dwell[1], "distinct_counterparts": counterparts,
            "dwell_mean_ms": dwell[0] / dwell[1] if dwell[1] else 0.0}


@pytest.fixture
def tiled(settings: Settings) -> RedisFeatureStore:
    return RedisFeatureStore(settings.redis.url, settings.redis.key_prefix + "-tiles", ttl_s=600, tiles_s=TILES_S)


def test_tiles_add_up_to_the_window_ending_at_the_progress_over_a_random_stream(tiled: RedisFeatureStore) -> None:
    """Tiles written in random order, in several batches, some of them again (a replay): every read
    equals the horizon added up in Python from the newest version of each tile."""
    rng = np.random.default_rng(11)
    written: list[dict] = []
    for _ in range(6):
        batch = []
        for _ in range(400):
            horizon = int(rng.choice([60, 600]))
            start = int(rng.integers(0, 1500)) * TILES_S[horizon] * 1000
            impressions = int(rng.integers(0, 6))
            clicks = int(rng.integers(0, impressions + 1))
            batch.append(tile(f"u{rng.integers(0, 25)}", horizon, start, impressions, clicks,
                              (int(rng.integers(0, 3)) * 500, int(rng.integers(0, 3))), int(rng.integers(1, 5))))
        replay = [written[int(i)] for i in rng.integers(0, len(written), 50)] if written else []
        tiled.write_batch(batch + replay)
        written += batch + replay
    names = ["60s.impressions", "60s.clicks", "60s.ctr", "60s.dwell_mean_ms", "60s.distinct_counterparts",
             "600s.impressions", "600s.ctr", "600s.dwell_sum_ms"]
    users = [f"u{k}" for k in range(25)] + ["nobody"]
    got = tiled.get_online_features("user", users, names)
    for horizon in (60, 600):
        as_of = max(r["window_end"] for r in written if r["horizon_s"] == horizon)
        for k, user in enumerate(users):
            newest: dict[int, dict] = {}  # per tile: the last written (equal ends: the later one wins)
            for r in written:
                if r["entity_id"] == user and r["horizon_s"] == horizon:
                    newest[r["window_start"]] = r
            if not newest:
                assert np.isnan(got.values[k]).all() and (got.window_end_ms[k] == UNKNOWN_WINDOW_END).all()
                continue
            inside = [r for r in newest.values() if as_of - horizon * 1000 < r["window_end"] <= as_of]
            total = {f: sum(r[f] for r in inside) for f in ("impressions", "clicks", "dwell_sum_ms", "dwell_count")}
            expected = {"impressions": total["impressions"], "clicks": total["clicks"],
                        "ctr": total["clicks"] / total["impressions"] if total["impressions"] else 0.0,
                        "dwell_mean_ms": total["dwell_sum_ms"] / total["dwell_count"] if total["dwell_count"] else 0.0,
                        "dwell_sum_ms": total["dwell_sum_ms"],
                        "distinct_counterparts": max((r["distinct_counterparts"] for r in inside), default=0)}
            for j, name in enumerate(names):
                if name.startswith(f"{horizon}s."):
                    assert got.values[k, j] == pytest.approx(expected[name.split(".")[1]]), (user, name)
                    assert got.window_end_ms[k, j] == as_of


def test_a_quiet_entitys_horizon_empties_as_the_progress_moves_on(tiled: RedisFeatureStore) -> None:
    tiled.write_batch([tile("q1", 60, 0, 4, 1), tile("q1", 60, 3000, 2, 1), tile("busy", 60, 57_000, 1, 0)])
    got = tiled.get_online_features("user", ["q1"], ["60s.impressions", "60s.ctr"])
    assert got.values.tolist() == [[6.0, 2 / 6]] and got.window_end_ms.tolist() == [[60_000, 60_000]]
    tiled.write_batch([tile("busy", 60, 60_000, 1, 0)])  # q1's first tile is now out of the horizon
    assert tiled.get_online_features("user", ["q1"], ["60s.impressions"]).values.tolist() == [[2.0]]
    tiled.write_batch([tile("busy", 60, 120_000, 1, 0)])
    got = tiled.get_online_features("user", ["q1"], ["60s.impressions", "60s.ctr"])
    assert got.values.tolist() == [[0.0, 0.0]] and got.window_end_ms.tolist() == [[123_000, 123_000]]
    # an old tile replayed later does not move the progress back nor take a newer tile's place
    assert tiled.write_batch([tile("q1", 60, 63_000, 9, 9)]) == 1  # its position held q1's tile at 3000
    assert tiled.write_batch([tile("q1", 60, 3000, 2, 1)]) == 0
    assert tiled.get_online_features("user", ["q1"], ["60s.impressions"]).values.tolist() == [[9.0]]


def test_tiles_and_whole_windows_are_read_together_and_other_layouts_refused(tiled: RedisFeatureStore,
                                                                          settings: Settings) -> None:
    tiled.write_batch([record("m1", 9000, 2, horizon_s=3), tile("m1", 600, 0, 5, 1), tile("m1", 60, 3000, 3, 3)])
    got = tiled.get_online_features("user", ["m1", "m2"], ["600s.clicks", "3s.clicks", "60s.ctr", "3s.ctr"])
    assert got.values[0].tolist() == [1.0, 2.0, 1.0, 0.2] and np.isnan(got.values[1]).all()
    assert got.window_end_ms[0].tolist() == [30_000, 9000, 6000, 9000]
    assert tiled.get_online_features("user", [], ["60s.clicks", "3s.clicks"]).values.shape == (0, 2)
    # 600 s in tiles of 3 s is a ring of 200, not the 20 this reader expects
    tiled.write_batch([{**tile("m3", 600, 0, 1, 1), "window_end": 3000}])
    with pytest.raises(ValueError, match="horizon_slides_s"):
        tiled.get_online_features("user", ["m3"], ["600s.clicks"])
    with pytest.raises(ValueError, match="does not divide"):
        tiled.write_batch([{**tile("m4", 60, 0, 1, 1), "window_end": 7000}])


def test_a_ring_is_kept_in_parts_all_written_with_its_first_tile(tiled: RedisFeatureStore) -> None:
    """The first tile of an entity's ring writes all of its fields (TILES_PER_FIELD tiles each, zeros
    where no tile is), so that a read finds them all; a later tile is spliced into its part, with its
    sketch beside it. The progress holds the newest tile end and the ring's length."""
    key = entity_key(tiled.prefix, "user", "p1")
    first = {**tile("p1", 60, 6000, 4, 1, (900, 3), 2), "counterpart_hashes": [5, 7]}  # position 2
    tiled.write_batch([first])
    raw = tiled.client.hgetall(key)
    parts = [raw.pop(b"60s.t20.%d" % j) for j in range(len(ring_parts(20)))]
    assert raw == {b"60s.sketch.2": struct.pack("<d2q", 9000, 5, 7)}
    packed = struct.pack(f"<{TILE_BYTES // 8}d", 9000, *(float(first[v]) for v in TILE_VALUES))
    ring = b"".join(parts)
    assert len(ring) == 20 * TILE_BYTES and ring == bytes(2 * TILE_BYTES) + packed + bytes(17 * TILE_BYTES)
    assert tiled.client.hget(progress_key(tiled.prefix), "60s.tiles") == struct.pack("<dd", 9000, 20)
    later = tile("p1", 60, 18_000, 1, 1)  # position 6, in the second part
    assert tiled.write_batch([later, first]) == 2  # the first again: an equal end is written again, the same bytes
    before = {**raw, **{b"60s.t20.%d" % j: part for j, part in enumerate(parts)}}
    after = tiled.client.hgetall(key)
    assert {f for f in after if after[f] != before.get(f)} == {b"60s.t20.1"}
    assert after[b"60s.t20.1"][TILE_BYTES:2 * TILE_BYTES] == struct.pack(
        f"<{TILE_BYTES // 8}d", 21_000, *(float(later[v]) for v in TILE_VALUES))
    assert tiled.client.hget(progress_key(tiled.prefix), "60s.tiles") == struct.pack("<dd", 21_000, 20)
    got = tiled.get_online_features("user", ["p1"], ["60s.impressions", "60s.distinct_counterparts"])
    assert got.values.tolist() == [[5.0, 2.0]] and got.window_end_ms.tolist() == [[21_000, 21_000]]


def test_the_longest_ring_a_loader_keeps_is_written_and_read_whole(settings: Settings) -> None:
    """A ring of MAX_RING_TILES positions, more fields than one HSET of the script writes at once: every
    field is there after its first tile, and the read adds up the tiles it holds."""
    store = RedisFeatureStore(settings.redis.url, settings.redis.key_prefix + "-long", ttl_s=600,
                              tiles_s={MAX_RING_TILES: 1})
    starts = [0, 999_000, 1_000_000, MAX_RING_TILES * 1000 - 1000]
    store.write_batch([{**record("h1", start + 1000, 1, MAX_RING_TILES), "window_start": start, "impressions": 2}
                       for start in starts])
    assert store.client.hlen(entity_key(store.prefix, "user", "h1")) == len(ring_parts(MAX_RING_TILES)) > 8000
    got = store.get_online_features("user", ["h1"], [f"{MAX_RING_TILES}s.impressions", f"{MAX_RING_TILES}s.clicks"])
    assert got.values.tolist() == [[8.0, 4.0]] and got.window_end_ms.tolist() == [[MAX_RING_TILES * 1000] * 2]


def test_replies_read_as_rows_give_what_replies_parsed_one_by_one_give(tiled: RedisFeatureStore,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose every entity has every field is cut out of the bytes read; one with an entity
    missing, a redis-py without the socket, or a batch in several sends is parsed reply by reply: the
    same features either way."""
    from feature_store import resp

    rng = np.random.default_rng(5)
    users = [f"r{k}" for k in range(30)]
    batch = [record(u, 9000 + 3000 * k, k % 4, horizon_s=3) for k, u in enumerate(users)]
    for u in users:
        for horizon in (60, 600):
            for start in rng.choice(40, 6, replace=False).tolist():
                impressions = int(rng.integers(1, 9))
                batch.append(tile(u, horizon, start * TILES_S[horizon] * 1000, impressions,
                                  int(rng.integers(0, impressions + 1)), (int(rng.integers(0, 900)), 2),
                                  int(rng.integers(1, 6))))
    tiled.write_batch(batch)
    names = ["3s.clicks", "60s.impressions", "60s.ctr", "600s.dwell_mean_ms", "3s.ctr", "600s.distinct_counterparts"]
    cut: list[np.ndarray | None] = []
    fixed_rows = resp.fixed_rows
    monkeypatch.setattr(resp, "fixed_rows", lambda *args: cut.append(fixed_rows(*args)) or cut[-1])
    as_rows = tiled.get_online_features("user", users, names)
    assert cut[-1] is not None and cut[-1].shape[0] == len(users)
    assert not np.isnan(as_rows.values).any() and (as_rows.window_end_ms > 0).all()
    with_one_missing = tiled.get_online_features("user", [*users, "nobody"], names)
    assert cut[-1] is None
    assert np.isnan(with_one_missing.values[-1]).all()
    monkeypatch.setattr("feature_store.redis_store.ENTITIES_PER_SEND", 7)
    in_sends = tiled.get_online_features("user", users, names)
    monkeypatch.setattr(resp, "read_through", lambda *args: None)  # a redis-py without `_sock`
    parsed = tiled.get_online_features("user", users, names)
    for other in (with_one_missing, in_sends, parsed):
        assert other.values[:len(users)].tolist() == as_rows.values.tolist()
        assert other.window_end_ms[:len(users)].tolist() == as_rows.window_end_ms.tolist()


def test_threads_reading_at_once_each_get_their_own_entities(tiled: RedisFeatureStore,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread's reads reuse buffers of their own: four threads reading batches of other sizes at
    the same time get what one reader gets, and a larger batch after a smaller one grows them. Buffers
    above SCRATCH_KEPT_BYTES are not kept."""
    import threading

    rng = np.random.default_rng(8)
    users = [f"t{k}" for k in range(200)]
    tiled.write_batch([tile(u, horizon, start * TILES_S[horizon] * 1000, k % 7 + 1, k % 3)
                       for k, u in enumerate(users) for horizon in (60, 600)
                       for start in rng.choice(20, 3, replace=False).tolist()])
    names = ["60s.impressions", "600s.clicks", "60s.ctr"]
    monkeypatch.setattr("feature_store.redis_store.SCRATCH_KEPT_BYTES", 1000)
    alone = tiled.get_online_features("user", users, names).values
    assert not np.isnan(alone).any() and vars(tiled._scratch) == {}
    monkeypatch.undo()
    mismatches: list[int] = []

    def reader(k: int) -> None:
        order = np.random.default_rng(k).permutation(len(users))
        for size in (3 + k, 50 * (k + 1), 200):
            for start in range(0, len(users), size):
                rows = order[start:start + size]
                got = tiled.get_online_features("user", [users[i] for i in rows.tolist()], names).values
                mismatches.append(int((got != alone[rows]).sum()))

    threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)  # a reader whose replies another overwrote would wait for its end marker
    assert not any(thread.is_alive() for thread in threads)
    assert len(mismatches) > 100 and sum(mismatches) == 0


def test_rings_of_other_lengths_and_unknown_features_read_alongside(settings: Settings) -> None:
    """A read of rings of two lengths, with a feature no ring holds, gives what a read of each horizon
    alone gives."""
    store = RedisFeatureStore(settings.redis.url, settings.redis.key_prefix + "-lengths", ttl_s=600,
                              tiles_s={60: 3, 600: 60})
    batch = []
    for k in range(5):
        batch += [{**tile(f"l{k}", 60, 3000 * j, 2 + k, k % 2), "window_end": 3000 * (j + 1)} for j in range(k, 25)]
        batch += [{**tile(f"l{k}", 60, 60_000 * j, 4, 1 + k % 3), "horizon_s": 600, "window_start": 60_000 * j,
                   "window_end": 60_000 * (j + 1)} for j in range(k, 12)]
    store.write_batch(batch)
    users = [f"l{k}" for k in range(5)] + ["none"]
    both = store.get_online_features("user", users, ["600s.ctr", "60s.nonesuch", "60s.impressions", "600s.clicks"])
    short = store.get_online_features("user", users, ["60s.impressions"])
    long = store.get_online_features("user", users, ["600s.ctr", "600s.clicks"])
    assert np.isnan(both.values[:, 1]).all()
    np.testing.assert_array_equal(both.values[:, [2]], short.values)
    np.testing.assert_array_equal(both.values[:, [0, 3]], long.values)
    np.testing.assert_array_equal(both.window_end_ms[:, [2]], short.window_end_ms)
    np.testing.assert_array_equal(both.window_end_ms[:, [0, 3]], long.window_end_ms)
    assert not np.isnan(both.values[:5, [0, 2, 3]]).any() and np.isnan(both.values[5]).all()
    assert both.window_end_ms[0].tolist() == [720_000, 75_000, 75_000, 720_000]


def test_tiles_decoded_in_bulk_write_what_their_records_write(settings: Settings) -> None:
    from feature_store.columns import FeatureColumns
    from schemas.bulk import BulkDecoder
    from schemas.serde import serializer

    rng = np.random.default_rng(5)
    records = [tile(f"e{rng.integers(0, 30)}", int(h), int(rng.integers(0, 400)) * TILES_S[int(h)] * 1000,
                    int(rng.integers(0, 9)), 0, entity_type=("user", "item")[k % 2])
               for k, h in enumerate(rng.choice([60, 600], 2000))]
    for r in records[::3]:  # some tiles with their sketch, of every length up to the bulk decoder's
        r["counterpart_hashes"] = np.sort(rng.choice(1 << 62, int(rng.integers(1, 70)), replace=False)).tolist()
    enc = serializer("FeatureRecord")
    decoded = BulkDecoder("FeatureRecord").decode([enc(r) for r in records], [enc.header_value] * len(records))
    stores = [RedisFeatureStore(settings.redis.url, f"{settings.redis.key_prefix}-{name}", 600, tiles_s=TILES_S)
              for name in ("records", "columns")]
    assert stores[0].write_batch(records) == stores[1].write_columns(FeatureColumns.of_decoded(decoded)) > 0

    def state(prefix: str) -> dict:
        client = stores[0].client
        return {key[len(prefix):]: client.hgetall(key) for key in client.scan_iter(f"{prefix}:*")}

    assert state(stores[0].prefix) == state(stores[1].prefix)

    assert any(field.startswith(b"600s.sketch.") for fields in state(stores[1].prefix).values() for field in fields)


def id_hashes(ids: set[str]) -> list[int]:
    """63-bit hashes, ascending, as the feature job's sketches hold (any uniform hash will do here)."""
    import hashlib

    return sorted(int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") >> 1 for i in ids)


def test_distinct_counterparts_merge_exactly_from_whole_sketches_and_within_error_from_cut_ones(
        tiled: RedisFeatureStore) -> None:
    """Tiles with random counterpart sets, some written twice: a read counts the union of the sets of
    the tiles in the horizon, exactly while every tile kept its whole set, and within the sketch's error
    once the tiles kept only their smallest 32 hashes. A tile without its sketch adds its own count."""
    rng = np.random.default_rng(17)

    def tiles_of(user: str, pool: int, per_tile: int, keep: int) -> tuple[list[dict], list[set[str]]]:
        batch, sets = [], []
        for j in range(25):  # the horizon (60 s, progress at 75 s) holds the last 20
            ids = {f"i{v}" for v in rng.choice(pool, per_tile, replace=False).tolist()}
            sets.append(ids)
            batch.append({**tile(user, 60, 3000 * j, 1, 0, counterparts=len(ids)),
                          "counterpart_hashes": id_hashes(ids)[:keep]})
        return batch, sets

    whole, whole_sets, cut, cut_sets = [], [], [], []
    for k in range(10):
        batch, sets = tiles_of(f"w{k}", 300, int(rng.integers(1, 30)), 64)
        whole += batch
        whole_sets.append(sets)
        batch, sets = tiles_of(f"c{k}", 20_000, 400, 32)
        cut += batch
        cut_sets.append(sets)
    tiled.write_batch(whole[::2] + cut)
    tiled.write_batch(whole[1::2] + whole[::7])  # a replay changes nothing
    users = [f"w{k}" for k in range(10)] + [f"c{k}" for k in range(10)] + ["nobody"]
    got = tiled.get_online_features("user", users, ["60s.distinct_counterparts", "60s.impressions"])
    assert got.values[:10, 0].tolist() == [float(len(set().union(*sets[5:]))) for sets in whole_sets]
    assert got.values[:20, 1].tolist() == [20.0] * 20 and np.isnan(got.values[20]).all()
    errors = got.values[10:20, 0] / np.array([len(set().union(*sets[5:])) for sets in cut_sets]) - 1
    assert np.abs(errors).max() < 0.2 and abs(errors.mean()) < 0.06, errors

    def without_sketch(j: int, counterparts: int) -> float:
        late = {**tile("w9", 60, 3000 * j, 1, 0, counterparts=counterparts), "counterpart_hashes": None}
        tiled.write_batch([late])  # its ring position holds the sketch of the tile 60 s before, which no longer counts
        return float(tiled.get_online_features("user", ["w9"], ["60s.distinct_counterparts"]).values[0, 0])

    assert without_sketch(25, 1) == len(set().union(*whole_sets[9][6:]))
    assert without_sketch(26, 500) == 500.0


def test_a_window_listing_the_horizons_it_is_a_tile_of_writes_what_a_record_per_horizon_writes(
        settings: Settings) -> None:
    """The feature job writes a user's or item's 3 s window once, listing the 60 s horizon it is also
    a tile of (`tile_of_horizons_s`); Redis must end up as with one record for each, bulk-decoded or not."""
    from feature_store.columns import FeatureColumns
    from schemas.bulk import BulkDecoder
    from schemas.serde import serializer

    rng = np.random.default_rng(11)
    per_horizon, listing = [], []
    for k in range(1500):
        start = int(rng.integers(0, 60)) * 3000
        window = {**tile(f"e{k % 53}", 60, start, int(rng.integers(1, 9)), int(rng.integers(0, 3)),
                         counterparts=int(rng.integers(1, 5)), entity_type=("user", "item")[k % 2]), "horizon_s": 3}
        hashes = np.sort(rng.choice(1 << 62, int(rng.integers(1, 5)), replace=False)).tolist()
        per_horizon += [window, {**window, "horizon_s": 60, "counterpart_hashes": hashes}]
        listing.append({**window, "counterpart_hashes": hashes, "tile_of_horizons_s": [60]})
    listing.append({**record("p1", 9000, 1, 3, "user_item"), "tile_of_horizons_s": []})  # an empty list: itself only
    per_horizon.append(record("p1", 9000, 1, 3, "user_item"))
    enc = serializer("FeatureRecord")
    decoded = BulkDecoder("FeatureRecord").decode([enc(r) for r in listing], [enc.header_value] * len(listing))
    assert len(decoded) == len(listing) and not decoded.rejected
    stores = [RedisFeatureStore(settings.redis.url, f"{settings.redis.key_prefix}-{name}", 600, tiles_s=TILES_S)
              for name in ("per-horizon", "listing", "listing-columns")]
    written = stores[0].write_batch(per_horizon)
    assert written == stores[1].write_batch(listing) == stores[2].write_columns(FeatureColumns.of_decoded(decoded))

    def state(prefix: str) -> dict:
        client = stores[0].client
        return {key[len(prefix):]: client.hgetall(key) for key in client.scan_iter(f"{prefix}:*")}

    expected = state(stores[0].prefix)
    assert any(field.startswith(b"60s.sketch.") for fields in expected.values() for field in fields)
    assert any(b"3s.values" in fields for fields in expected.values())
    assert state(stores[1].prefix) == expected == state(stores[2].prefix)


@pytest.mark.parametrize("layout", ["windows", "tiles"])
def test_a_written_key_expires_a_ttl_after_its_last_write_less_at_most_a_tenth(settings: Settings,
                                                                               layout: str) -> None:
    """The TTL (600 s here) is set with a key's first write and pushed back by a later write once it
    has run down by more than a tenth (60 s), or when it is longer than the TTL (a TTL lowered since),
    or when the key has none; within the tenth a write leaves it as it is."""
    store = RedisFeatureStore(settings.redis.url, f"{settings.redis.key_prefix}-ttl-{layout}", ttl_s=600,
                              tiles_s=TILES_S if layout == "tiles" else None)
    key = entity_key(store.prefix, "user", "u3")
    end = iter(range(3000, 300_000, 3000))

    def write() -> int:
        """Writes a newer window or tile of u3 and returns the key's TTL in ms after it."""
        at = next(end)
        store.write_batch([tile("u3", 60, at - 3000, 4, 1) if layout == "tiles" else record("u3", at, 1)])
        return int(store.client.pttl(key))

    # 10 s for a write on a busy machine: a TTL pushed back is then above 590 s, one left alone at most 590 s
    assert 590_000 < write() <= 600_000
    for set_to, pushed_back in ((530_000, True), (545_000, False), (590_000, False), (5_000_000, True), (None, True)):
        if set_to is None:
            store.client.persist(key)
        else:
            store.client.pexpire(key, set_to)
        left = write()
        assert 590_000 < left <= 600_000 if pushed_back else set_to - 10_000 < left <= set_to, (set_to, left)
