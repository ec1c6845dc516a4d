"""FeatureRecords decoded in bulk equal FeatureRecords decoded one by one, nullable lists included
(null, empty and full), whatever damage the bytes carry."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.bulk import BulkDecoder
from schemas.serde import serializer
from tests.schemas.test_bulk import one_by_one

LISTS = ("recent_items", "recent_types", "recent_times_ms", "counterpart_hashes", "tile_of_horizons_s")


def feature_records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for k in range(n):
        end = int(rng.integers(10**12, 2 * 10**12))
        record = {"entity_type": ("user", "item", "user_item")[k % 3], "entity_id": f"e{rng.integers(0, 10**6)}",
                  "horizon_s": int(rng.choice([0, 3, 60, 600])), "window_start": end - 3000, "window_end": end,
                  "impressions": int(rng.integers(0, 99)), "clicks": int(rng.integers(0, 9)), "likes": 0,
                  "carts": int(rng.integers(-3, 3)), "orders": 0, "ctr": float(rng.random()),
                  "dwell_sum_ms": int(rng.integers(0, 10**9)), "dwell_mean_ms": float(rng.random() * 1e4),
                  "distinct_counterparts": int(rng.integers(0, 50)), "dwell_count": int(rng.integers(0, 50)),
                  "recent_items": None, "recent_types": None, "recent_times_ms": None, "counterpart_hashes": None,
                  "tile_of_horizons_s": None}
        if k % 4 == 2:  # a tile with its sketch: hashes of every size, none to 64 of them
            record["counterpart_hashes"] = np.sort(rng.integers(0, 2**63, int(rng.integers(0, 65)))).tolist()
            # a window that is also a tile of longer horizons lists them: none, one or several
            record["tile_of_horizons_s"] = [int(h) for h in rng.choice([60, 90, 120], int(rng.integers(0, 3)))]
        if k % 4 == 1:  # a recent-engagements record: empty or full lists
            count = int(rng.integers(0, 12))
            record.update(recent_items=[f"i{rng.integers(0, 999)}" + ("é" if k % 5 == 0 else "") for _ in range(count)],
                          recent_types=["click"] * count,
                          recent_times_ms=[int(t) for t in rng.integers(0, 2**62, count)])
        records.append(record)
    return records


def assert_same(values: list[bytes | None], headers: list[bytes | None]) -> None:
    got = BulkDecoder("FeatureRecord").decode(values, headers)
    rows, records, rejected = one_by_one(values, headers, "FeatureRecord")
    assert got.rows.tolist() == rows
    assert [i for i, _ in got.rejected] == rejected
    starts = {name: np.cumsum(got.lengths[name]) - got.lengths[name] for name in LISTS}
    for j, record in enumerate(records):
        for name in ("entity_type", "entity_id", "horizon_s", "impressions", "carts", "ctr", "dwell_sum_ms",
                     "dwell_mean_ms", "distinct_counterparts", "dwell_count"):
            assert got.columns[name][j] == record[name], (name, j)
        end = record["window_end"]
        assert got.columns["window_end"][j] == (round(end.timestamp() * 1000) if hasattr(end, "timestamp") else end)
        for name in LISTS:
            assert bool(got.present[name][j]) == (record[name] is not None), (name, j)
            count = int(got.lengths[name][j])
            assert got.columns[name][starts[name][j]:starts[name][j] + count].tolist() == (record[name] or []), \
                (name, j)


def test_clean_feature_records_decode_as_one_by_one() -> None:
    enc = serializer("FeatureRecord")
    values = [enc(r) for r in feature_records(400, seed=1)]
    assert_same(values, [enc.header_value] * len(values))
    got = BulkDecoder("FeatureRecord").decode(values, [enc.header_value] * len(values))
    assert got.present["recent_items"].sum() == 100 and len(got.rejected) == 0


@pytest.mark.parametrize("seed", range(4))
def test_damaged_feature_records_are_rejected_or_decoded_exactly_as_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    enc = serializer("FeatureRecord")
    values: list[bytes | None] = [enc(r) for r in feature_records(300, seed=seed)]
    headers: list[bytes | None] = [enc.header_value] * len(values)
    for i in rng.choice(len(values), 100, replace=False).tolist():
        value = bytearray(values[i])  # type: ignore[arg-type]
        how = i % 5
        if how == 0:
            values[i] = bytes(value[: rng.integers(0, len(value))])
        elif how == 1:
            for at in rng.integers(0, len(value), 3):
                value[at] = int(rng.integers(0, 256))
            values[i] = bytes(value)
        elif how == 2:
            values[i] = bytes(value) + b"\x02"
        elif how == 3:
            headers[i] = None
        else:
            values[i] = rng.bytes(int(rng.integers(1, 60)))
    assert_same(values, headers)
