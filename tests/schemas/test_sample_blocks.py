"""TrainingSampleBlock: what goes in comes out, and a block whose parts do not fit is refused whole."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.sample_blocks import BLOCK_SCHEMA, block_columns, pack, samples_in, unpack
from schemas.serde import SerdeError, deserializer, serializer
from tests.gpu_trainer.samples import make_samples


def test_samples_come_back_as_they_went_in_through_avro() -> None:
    samples = make_samples(300, seed=3)
    samples[7] = dict(samples[7], user_id="ünïcode-üser", position=12, recent_items=["ï", ""],
                      recent_types=["order", "click"], recent_ages_ms=[1, 2**40])
    enc, dec = serializer(BLOCK_SCHEMA), deserializer(BLOCK_SCHEMA)
    value = enc(pack(samples))
    assert samples_in(value) == 300
    back = unpack(dec(value, enc.header_value))
    floats = [dict(s, features=np.float32(s["features"]).tolist()) for s in samples]  # float32 on the wire
    assert back == floats


def test_a_block_without_recent_items_or_with_a_single_sample() -> None:
    bare = [dict(r, recent_items=[], recent_types=[], recent_ages_ms=[]) for r in make_samples(3)]
    assert unpack(pack(bare)) == [dict(s, features=np.float32(s["features"]).tolist()) for s in bare]
    assert [r["sample_id"] for r in unpack(pack(bare[:1]))] == ["s0"]


def test_columns_cut_or_pad_the_features_to_the_width_asked_and_keep_each_own_count() -> None:
    block = pack(make_samples(4))
    assert block_columns(block)["features"].shape == (4, 20)
    cut, padded = block_columns(block, width=3), block_columns(block, width=22)
    assert cut["features"].shape == (4, 3) and padded["features"].shape == (4, 22)
    assert (padded["features"][:, 20:] == 0).all() and (cut["features"] == padded["features"][:, :3]).all()
    assert cut["feature_len"].tolist() == [20] * 4


@pytest.mark.parametrize(("change", "reason"), [
    (lambda b: b.update(count=5), "sample_id_ends holds 16 bytes, 5 items take 20"),
    (lambda b: b.update(user_ids=b["user_ids"] + b"x"), "user_id_ends does not cut user_ids"),
    (lambda b: b.update(item_ids=b"\xff" + b["item_ids"][1:]), "item_ids is not UTF-8"),
    (lambda b: b.update(features=b["features"][:-4]), "features holds"),
    (lambda b: b.update(recent_counts=np.array([1, 0, 0, -1], "<i4").tobytes()), "negative recent_counts"),
    (lambda b: b.update(width=-1), "must not be negative"),
])
def test_a_block_whose_parts_do_not_fit_is_refused_with_the_reason(change: object, reason: str) -> None:
    block = pack(make_samples(4))
    change(block)  # type: ignore[operator]
    with pytest.raises(SerdeError, match=reason):
        block_columns(block)


def test_packing_refuses_samples_it_cannot_hold_in_one_block() -> None:
    a, b = make_samples(2)
    with pytest.raises(ValueError, match="one feature set and width"):
        pack([a, dict(b, features=[1.0])])
    with pytest.raises(ValueError, match="one for one"):
        pack([dict(a, recent_items=["x"], recent_types=[], recent_ages_ms=[])])
    with pytest.raises(ValueError, match="at least one"):
        pack([])


def test_any_damage_to_a_block_is_refused_as_undecodable_never_raised_otherwise() -> None:
    """Random damage to the bytes of a block's Avro value and to its decoded fields: every result is
    samples or a SerdeError (what the readers turn into a dead letter), never another exception."""
    rng = np.random.default_rng(11)
    enc, dec = serializer(BLOCK_SCHEMA), deserializer(BLOCK_SCHEMA)
    samples = make_samples(6, seed=2)
    samples[1] = dict(samples[1], recent_items=[], recent_types=[], recent_ages_ms=[])
    good = pack(samples)
    value = bytearray(enc(good))
    outcomes = {"samples": 0, "refused": 0}
    for _ in range(400):
        damaged = bytearray(value)
        for at in rng.integers(0, len(damaged), rng.integers(1, 4)):
            damaged[at] = int(rng.integers(0, 256))
        try:
            unpack(dec(bytes(damaged), enc.header_value))
            outcomes["samples"] += 1
        except SerdeError:
            outcomes["refused"] += 1
    for field in good:
        for replacement in (0, -1, 2**31 - 1, b"", b"\xff" * 7, b"\x00" * 4096):
            if isinstance(good[field], int) != isinstance(replacement, int):
                continue
            try:
                unpack(dict(good, **{field: replacement}))
                outcomes["samples"] += 1
            except SerdeError:
                outcomes["refused"] += 1
    assert outcomes["refused"] > 100 and outcomes["samples"] > 10


def test_ids_as_bytes_are_the_strings_and_are_refused_where_the_strings_are() -> None:
    """The trainer takes a block's ids as their UTF-8 bytes (Utf8Column): the same strings, and a
    column that is not UTF-8 string by string (a cut inside a character, invalid bytes) is refused
    as it is when cut into strings."""
    samples = make_samples(50, seed=4)
    samples[3] = dict(samples[3], sample_id="ñ-3", user_id="üser", item_id="")
    block = pack(samples)
    ids = ("sample_id", "user_id", "item_id")
    as_bytes, as_strings = block_columns(block, as_bytes=ids), block_columns(block)
    for name in ids:
        assert as_bytes[name].tolist() == as_strings[name].tolist() == [s[name] for s in samples]
        assert as_bytes[name].char_lengths().tolist() == [len(s[name]) for s in samples]
    rng = np.random.default_rng(5)
    refused = 0
    for _ in range(300):
        field = str(rng.choice(["sample_ids", "user_ids", "item_ids", "sample_id_ends", "user_id_ends"]))
        damaged = bytearray(block[field])
        for at in rng.integers(0, len(damaged), rng.integers(1, 3)):
            damaged[at] = int(rng.choice([0x80, 0xA9, 0xC3, 0xFF, int(rng.integers(0, 256))]))
        changed = dict(block, **{field: bytes(damaged)})
        outcomes = []
        for kwargs in ({}, {"as_bytes": ids}):
            try:
                got = block_columns(changed, **kwargs)
                outcomes.append([got[name].tolist() for name in ids])
            except SerdeError as exc:
                outcomes.append(exc.reason.split(" (")[0])
        assert outcomes[0] == outcomes[1], (field, outcomes)
        refused += isinstance(outcomes[0], str)
    assert 50 < refused < 300
