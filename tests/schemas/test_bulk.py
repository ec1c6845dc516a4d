"""The bulk decoder gives what decoding each record alone gives: the same rows, values and reasons,
whatever damage the bytes carry."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.bulk import BulkDecoder
from schemas.registry import history
from schemas.serde import SerdeError, Serializer, deserializer, serializer
from tests.gpu_trainer.samples import make_samples


def one_by_one(values: list[bytes | None], headers: list[bytes | None],
               schema_name: str = "TrainingSample") -> tuple[list[int], list[dict], list[int]]:
    """Each value decoded alone: the input index of each good record, the records, the rejected indices."""
    decode = deserializer(schema_name)
    rows, records, rejected = [], [], []
    for i, (v, h) in enumerate(zip(values, headers, strict=True)):
        try:
            records.append(decode(v, h))
            rows.append(i)
        except SerdeError:
            rejected.append(i)
    return rows, records, rejected


def assert_same(values: list[bytes | None], headers: list[bytes | None], width: int) -> None:
    got = BulkDecoder("TrainingSample").decode(values, headers, widths={"features": width})
    rows, records, rejected = one_by_one(values, headers)
    assert got.rows.tolist() == rows
    assert [i for i, _ in got.rejected] == rejected
    assert all(reason for _, reason in got.rejected)
    for j, record in enumerate(records):
        for name in ("sample_id", "user_id", "item_id", "feature_set", "label", "event_time"):
            assert got.columns[name][j] == record[name], (name, j)
        position = got.columns["position"][j]
        assert (record["position"] is None and math.isnan(position)) or position == record["position"]
        kept = min(width, len(record["features"]))
        assert got.lengths["features"][j] == len(record["features"])
        np.testing.assert_array_equal(got.columns["features"][j, :kept], np.float32(record["features"][:kept]))
        assert not got.columns["features"][j, kept:].any()
    starts = np.cumsum(got.lengths["recent_items"]) - got.lengths["recent_items"]
    for j, record in enumerate(records):
        for name in ("recent_items", "recent_types", "recent_ages_ms"):
            count = int(got.lengths[name][j])
            assert count == len(record[name]), (name, j)
            assert got.columns[name][starts[j]:starts[j] + count].tolist() == record[name], (name, j)


def encoded(n: int, seed: int) -> tuple[list[bytes], bytes]:
    enc = serializer("TrainingSample")
    samples = make_samples(n, seed=seed)
    rng = np.random.default_rng(seed)
    for k, s in enumerate(samples):
        if k % 3 == 0:
            s["position"] = int(rng.integers(-5, 1_000_000))
        if k % 7 == 0:
            s["user_id"] = "ünïcødé-" + s["user_id"]
        recent = int(rng.integers(0, 6))
        s["recent_items"] = [f"i{rng.integers(0, 1000)}" + ("é" if k % 5 == 0 else "") for _ in range(recent)]
        s["recent_types"] = ["click"] * recent
        s["recent_ages_ms"] = sorted(int(a) for a in rng.integers(1, 10**12, recent))
    return [enc(s) for s in samples], enc.header_value


def test_clean_records_decode_as_one_by_one() -> None:
    values, header = encoded(500, seed=1)
    assert_same(values, [header] * len(values), width=len(make_samples(1)[0]["features"]))


@pytest.mark.parametrize("seed", range(6))
def test_damaged_records_are_rejected_or_decoded_exactly_as_one_by_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, header = encoded(400, seed=seed)
    width = len(make_samples(1)[0]["features"])
    headers: list[bytes | None] = [header] * len(values)
    damaged: list[bytes | None] = list(values)
    for i in rng.choice(len(values), 120, replace=False).tolist():
        value = bytearray(values[i])
        how = i % 6
        if how == 0:  # truncated
            damaged[i] = bytes(value[: rng.integers(0, len(value))])
        elif how == 1:  # bytes flipped
            for at in rng.integers(0, len(value), 3):
                value[at] = int(rng.integers(0, 256))
            damaged[i] = bytes(value)
        elif how == 2:  # trailing bytes
            damaged[i] = bytes(value) + b"\x00\x02"
        elif how == 3:  # another schema's header, or none
            headers[i] = None if i % 2 else b"TrainingSample:0000000000000000"
        elif how == 4:  # a tombstone
            damaged[i] = None
        else:  # random bytes
            damaged[i] = rng.bytes(int(rng.integers(1, 40)))
    assert_same(damaged, headers, width)


def test_ragged_feature_arrays_keep_their_own_length_and_the_asked_width() -> None:
    enc = serializer("TrainingSample")
    samples = make_samples(6, seed=2)
    samples[1]["features"] = samples[1]["features"][:3]
    samples[4]["features"] = samples[4]["features"] * 2
    samples[5]["features"] = []
    values = [enc(s) for s in samples]
    assert_same(values, [enc.header_value] * len(values), width=len(samples[0]["features"]))


def test_records_of_the_earlier_version_read_with_empty_histories() -> None:
    old = Serializer(history("TrainingSample")[0])
    values, header = encoded(50, seed=9)
    samples = make_samples(5, seed=3)
    mixed = [old(s) for s in samples] + values
    headers = [old.header_value] * 5 + [header] * len(values)
    got = BulkDecoder("TrainingSample").decode(mixed, headers, widths={"features": len(samples[0]["features"])})
    assert got.rows.tolist() == list(range(55)) and got.lengths["recent_items"][:5].tolist() == [0] * 5
    assert_same(mixed, headers, len(samples[0]["features"]))


def test_long_histories_are_read_one_by_one_with_the_same_result() -> None:
    values, header = encoded(20, seed=4)
    enc = serializer("TrainingSample")
    long = make_samples(1, seed=5)[0]
    long.update(recent_items=[f"i{k}" for k in range(300)], recent_types=["like"] * 300,
                recent_ages_ms=list(range(1, 301)))
    values.insert(7, enc(long))
    assert_same(values, [header] * len(values), len(long["features"]))


def test_an_empty_batch_and_a_batch_of_garbage() -> None:
    decoder = BulkDecoder("TrainingSample")
    header = decoder.header_value
    assert len(decoder.decode([], [], widths={"features": 4})) == 0
    got = decoder.decode([b"", b"\xff" * 30], [header, header], widths={"features": 4})
    assert len(got) == 0 and [i for i, _ in got.rejected] == [0, 1]


def test_a_schema_with_a_field_it_cannot_read_in_bulk_is_refused_up_front() -> None:
    with pytest.raises(TypeError, match="does not support"):
        BulkDecoder("ModelSnapshot")


@pytest.mark.parametrize("seed", range(3))
def test_fields_left_out_are_still_checked_so_the_same_records_are_rejected(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, header = encoded(300, seed=seed)
    damaged: list[bytes | None] = list(values)
    for i in rng.choice(len(values), 90, replace=False).tolist():
        value = bytearray(values[i])
        if i % 2:
            damaged[i] = bytes(value[: rng.integers(0, len(value))])
        else:
            for at in rng.integers(0, len(value), 3):
                value[at] = int(rng.integers(0, 256))
            damaged[i] = bytes(value)
    headers: list[bytes | None] = [header] * len(values)
    width = {"features": len(make_samples(1)[0]["features"])}
    full = BulkDecoder("TrainingSample").decode(damaged, headers, widths=width)
    kept = BulkDecoder("TrainingSample", keep=("sample_id", "features")).decode(damaged, headers, widths=width)
    assert kept.rows.tolist() == full.rows.tolist()
    assert [i for i, _ in kept.rejected] == [i for i, _ in full.rejected]
    assert set(kept.columns) == {"sample_id", "features"} and set(kept.lengths) == {"features"}
    assert kept.columns["sample_id"].tolist() == full.columns["sample_id"].tolist()
    np.testing.assert_array_equal(kept.columns["features"], full.columns["features"])
    with pytest.raises(ValueError, match="no field"):
        BulkDecoder("TrainingSample", keep=("nope",))


def test_left_out_lists_are_checked_over_their_own_bytes() -> None:
    """Recent items left out are still decoded enough to reject invalid UTF-8 and keep valid non-ASCII
    text, and an age whose varint runs on past its record rejects the record, as one by one."""
    enc = serializer("TrainingSample")
    samples = make_samples(8, seed=6)
    for s in samples:
        s.update(recent_items=["café", "i2"], recent_types=["click", "like"], recent_ages_ms=[5, 300])
    values = [enc(s) for s in samples]
    cafe = "café".encode()
    values[2] = values[2].replace(cafe, b"caf\xff\xfe")  # same length: only the text is invalid
    # the record ends with the ages' block: 300 (2 bytes), then the block's end (0); the last age's
    # varint now never ends within the record
    values[5] = values[5][:-3] + b"\xff\xff\x80"
    headers: list[bytes | None] = [enc.header_value] * len(values)
    width = {"features": len(samples[0]["features"])}
    rows, records, rejected = one_by_one(values, headers)
    assert rejected == [2, 5] and records[0]["recent_items"] == ["café", "i2"]
    kept = BulkDecoder("TrainingSample", keep=("sample_id",)).decode(values, headers, widths=width)
    assert kept.rows.tolist() == rows and [i for i, _ in kept.rejected] == rejected
    assert kept.columns["sample_id"].tolist() == [r["sample_id"] for r in records]
    assert_same(values, headers, width["features"])
