"""Which FeatureRecords the loader refuses, and that the rows it keeps keep their own lists."""

from __future__ import annotations

import numpy as np

from feature_store.columns import FeatureColumns
from feature_store.validation import MAX_RING_TILES, check_records


def window(entity_id: str, start: int, length_ms: int = 3000, horizon_s: int = 3, **more: object) -> dict:
    return {"entity_type": "item", "entity_id": entity_id, "horizon_s": horizon_s, "window_start": start,
            "window_end": start + length_ms, "impressions": 4, "clicks": 1, "likes": 0, "carts": 0, "orders": 0,
            "ctr": 0.25, "dwell_sum_ms": 0, "dwell_mean_ms": 0.0, "distinct_counterparts": 2, "dwell_count": 0,
            **more}


def test_each_unwritable_record_gets_its_reason_and_writable_ones_pass() -> None:
    rows = [
        window("ok-listing", 0, tile_of_horizons_s=[60, 600]),
        window("ok-whole", 0, length_ms=60_000, horizon_s=60),
        window("ok-tile", 3000, horizon_s=60),
        window("ok-recent", 0, length_ms=0, horizon_s=0, recent_items=["i1"], recent_types=["click"],
               recent_times_ms=[1]),
        window("uneven-listed", 0, tile_of_horizons_s=[60, 10]),
        window("uneven-own", 0, horizon_s=10),
        window("zero-listed", 0, tile_of_horizons_s=[0]),
        window("longer-than-listed", 0, length_ms=120_000, horizon_s=120, tile_of_horizons_s=[60]),
        window("backwards", 6000, length_ms=-3000),
        window("negative", 0, horizon_s=-3),
        window("future", 10_000_000),
        window("huge-ring", 0, length_ms=1000, horizon_s=MAX_RING_TILES + 1),
        window("huge-listed-ring", 0, length_ms=1000, tile_of_horizons_s=[MAX_RING_TILES + 1]),
    ]
    mask, rejects = check_records(FeatureColumns.of_records(rows), "features", latest_start_ms=1_000_000)
    ok = [r["entity_id"] for r in rows if r["entity_id"].startswith("ok-")]
    assert [r["entity_id"] for r, keep in zip(rows, mask.tolist(), strict=True) if keep] == ok
    reasons = {reject.key.split(b":")[2].decode(): reject.reason for reject in rejects}  # type: ignore[union-attr]
    assert set(reasons) == {r["entity_id"] for r in rows} - set(ok)
    assert "no tile of the listed horizon 10 s" in reasons["uneven-listed"]
    assert "no tile of its horizon 10 s" in reasons["uneven-own"]
    assert "lists 0 s" in reasons["zero-listed"]
    assert "120000 ms is no tile of the listed horizon 60 s" in reasons["longer-than-listed"]
    assert "ends before it starts" in reasons["backwards"]
    assert "horizon -3 s is negative" in reasons["negative"]
    assert "9000 s beyond the future" in reasons["future"]
    assert f"its horizon {MAX_RING_TILES + 1} s in tiles of 1000 ms" in reasons["huge-ring"]
    assert f"more than {MAX_RING_TILES} tiles" in reasons["huge-listed-ring"]
    assert all(r.topic == "features" and r.reason.startswith("feature record item ") for r in rejects)


def test_the_rows_kept_keep_their_listed_horizons_sketches_and_recent_lists() -> None:
    rng = np.random.default_rng(5)
    rows = []
    for k in range(300):
        more: dict = {"tile_of_horizons_s": [60] * int(rng.integers(0, 2)),
                      "counterpart_hashes": rng.integers(0, 1 << 40, int(rng.integers(0, 4))).tolist(),
                      "recent_items": [f"i{j}" for j in range(int(rng.integers(0, 3)))]}
        more["recent_types"] = ["click"] * len(more["recent_items"])
        more["recent_times_ms"] = list(range(len(more["recent_items"])))
        rows.append(window(f"e{k}", 3000 * k, horizon_s=(3, 7)[k % 5 == 0], **more))
    batch = FeatureColumns.of_records(rows)
    mask, rejects = check_records(batch, "features")
    assert len(rejects) == 60 and not mask[::5].any()
    kept = batch.where(mask)
    expected = FeatureColumns.of_records([r for r, keep in zip(rows, mask.tolist(), strict=True) if keep])
    for got, want in ((kept, expected), (kept.with_listed_tiles(), expected.with_listed_tiles())):
        assert got.entity_id.tolist() == want.entity_id.tolist()
        assert got.horizon_s.tolist() == want.horizon_s.tolist()
        assert [a.tolist() for a in got.hashes] == [a.tolist() for a in want.hashes]
        assert [a.tolist() for a in got.tile_of] == [a.tolist() for a in want.tile_of]
        assert all(got.recent(i) == want.recent(i) for i in range(len(got)))
        assert np.array_equal(got.values(np.arange(len(got))), want.values(np.arange(len(want))))
